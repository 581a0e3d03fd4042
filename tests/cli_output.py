"""What the command line prints on stderr beside a run's own messages, for the tests that run it as a subprocess."""

from __future__ import annotations

import re

from torch_lwlrap.cli._environment import COMPILE_NOTICE


def without_compile_notice(stderr: str) -> str:
    """``stderr`` less the compile notice: a subprocess prints it when it compiles a kernel, with an empty numba
    cache or when the kernel it needs is not there yet (a test process of the same run may still be compiling it,
    on a busy machine). ``tests/test_cli_errors.py`` checks the notice itself."""
    return "".join(line for line in stderr.splitlines(keepends=True) if line.rstrip("\n") != COMPILE_NOTICE)


def is_error_line(err: str) -> bool:
    """Whether ``err`` is the command line's one error line: ``torch-lwlrap: error: ...`` for a file, or, for an
    option's value (the message starts with the option), ``torch-lwlrap SUBCOMMAND: error: --option ... (see
    torch-lwlrap SUBCOMMAND --help)``, as argparse's usage errors are."""
    line = err.rstrip("\n")
    if "\n" in line or "Traceback" in line:
        return False
    if line.startswith("torch-lwlrap: error: "):
        return not line[len("torch-lwlrap: error: "):].startswith("--")
    match = re.match(r"(torch-lwlrap [a-z]+): error: --", line)
    return match is not None and line.endswith(f" (see {match.group(1)} --help)")
