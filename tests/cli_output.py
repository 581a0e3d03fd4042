"""What the command line prints on stderr beside a run's own messages, for the tests that run it as a subprocess."""

from __future__ import annotations

from torch_lwlrap.cli._environment import COMPILE_NOTICE


def without_compile_notice(stderr: str) -> str:
    """``stderr`` less the compile notice: a subprocess prints it when it compiles a kernel, with an empty numba
    cache or when the kernel it needs is not there yet (a test process of the same run may still be compiling it,
    on a busy machine). ``tests/test_cli_errors.py`` checks the notice itself."""
    return "".join(line for line in stderr.splitlines(keepends=True) if line.rstrip("\n") != COMPILE_NOTICE)
