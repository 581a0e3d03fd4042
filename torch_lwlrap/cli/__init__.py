"""Command line: score a Kaggle-format submission CSV against a ground-truth CSV.

Usage::

    torch-lwlrap score TRUTH.csv PRED.csv [--per-class] [--json] [--plot OUT.png] [--ties max|index|expected]
                       [--where COLUMN=VALUE] [--classes FILE] [--unknown VALUE] [--top K]
                       [--ci [B]] [--level LEVEL] [--seed SEED]
    torch-lwlrap compare TRUTH.csv A.csv B.csv [--bootstrap N | --ci [N]] [--level LEVEL] [--seed SEED]
                         [--agreement K] [--per-class] [--json] [--plot OUT.png] [--ties max|index|expected]
                         [--where COLUMN=VALUE] [--classes FILE] [--unknown VALUE]
    torch-lwlrap doctor [--json] [--no-timing]
    python -m torch_lwlrap score TRUTH.csv PRED.csv

``TRUTH.csv`` is either the challenge layout, header ``fname,labels`` with the positive class names of a row
comma-joined in one quoted field (``a.wav,"Bark,Dog"``) and any metadata columns (``usage``, ``license``, ...),
or a wide 0/1 table with header ``fname,<class>,...`` (``--unknown VALUE``: VALUE marks an unknown label).
Any file may be gzip-compressed (``.csv.gz``), and one of them may be ``-``, standard input.
``PRED.csv`` is the submission layout, header ``fname,<class>,...`` with one score per class. Rows are matched by
``fname`` and classes by column name, both in any order. All scoring goes through
:func:`torch_lwlrap.multilabel_lwlrap_per_class`, :func:`torch_lwlrap.multilabel_lwlrap` and
:func:`torch_lwlrap.multilabel_lrap`.

A bad file ends the program with exit status 2 and one line on stderr naming the file, the line, the ``fname``
and/or the column at fault; so do bad arguments (one line naming the subcommand's ``--help``: an unknown option, a
seed outside ``[0, 2**63)``, more bootstrap replicates than the memory holds), a ``TORCH_LWLRAP_ENGINE`` that
names no engine and an allocation that fails. The first run in an environment says on stderr that it compiles the
CPU kernels (:mod:`torch_lwlrap.cli._environment`).

The package, by audience: ``_files`` reads and checks the CSV files (``_pandas_index`` tells pandas' index
written as a column from data), ``_match`` matches them to each other (rows
selected, submissions aligned, the vocabulary checked), ``_inputs`` holds the options that choose what
is scored (shared by ``score`` and ``compare``) and reads the files under them, ``_report`` formats the report, the
JSON and the plot, ``_environment`` checks and reports on the machine around a run, and each subcommand is a module
(``score``) registered in :data:`SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import warnings
from typing import Iterator, NoReturn, Optional, Sequence

from torch_lwlrap.cli import compare as _compare
from torch_lwlrap.cli import doctor as _doctor
from torch_lwlrap.cli import score as _score
from torch_lwlrap.cli._environment import (
    check_engine_variable,
    compile_notice,
    is_out_of_memory,
    out_of_memory_message,
)
from torch_lwlrap.cli._files import CommandError, CsvFormatError, Predictions, Truth, read_predictions, read_truth
from torch_lwlrap.cli._report import Score, format_report
from torch_lwlrap.cli.score import score_files

__all__ = [
    "CommandError",
    "CsvFormatError",
    "Predictions",
    "Score",
    "Truth",
    "build_parser",
    "format_report",
    "main",
    "read_predictions",
    "read_truth",
    "score_files",
]

PROG = "torch-lwlrap"

# The subcommands, in the order `--help` lists them. A subcommand is a module of this package with
# `add_parser(commands)`, which adds its parser and sets `run=` on it, and `run(args) -> int`; adding one is adding
# its module and a line here.
SUBCOMMANDS = (_score, _compare, _doctor)


class _Parser(argparse.ArgumentParser):
    """A parser whose usage errors are one line, as the file errors are: the command, what was wrong and where to
    read more (``--help``), not argparse's usage block. Subcommands' parsers are of this class too (argparse builds
    them with their parent's class)."""

    def error(self, message: str) -> "NoReturn":
        value = message.rpartition("invalid int value: ")[2].strip("'")
        if message.startswith("argument --ci:") and value.lower().endswith((".csv", ".gz", ".tsv", ".txt")):
            message += " (--ci takes an optional count: write it after the files, or give the count, --ci 1000)"
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``torch-lwlrap``.

    Example:
        >>> args = build_parser().parse_args(["score", "truth.csv", "pred.csv", "--per-class"])
        >>> args.command, args.truth, args.pred, args.per_class, args.ties
        ('score', 'truth.csv', 'pred.csv', True, 'max')
    """
    from torch_lwlrap import __version__

    parser = _Parser(
        prog=PROG,
        description="Exact lwlrap (DCASE 2019 task 2 / Freesound Audio Tagging 2019) and LRAP of multi-label "
        "predictions.",
        epilog="example: torch-lwlrap score truth.csv submission.csv --per-class",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    for subcommand in SUBCOMMANDS:
        subcommand.add_parser(commands)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]) -> argparse.Namespace:
    """``argv`` parsed; arguments left over after the subcommand's name are refused by the subcommand's parser, so
    that the error names the subcommand they were given to (``torch-lwlrap compare: error: unrecognized arguments:
    --top 3``); those before it, by the program's."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extras = parser.parse_known_args(argv)
    if extras:
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
        where = argv.index(args.command) if args.command in argv else len(argv)
        before = [extra for extra in extras if extra in argv[:where]]
        owner = parser if before else commands[args.command]
        owner.error(f"unrecognized arguments: {' '.join(before or extras)}")
    return args


def _error(message: str, command: Optional[str] = None) -> int:
    """One line on stderr, exit status 2. An error about an option (its message starts with the option, ``--seed
    takes ...``) of the subcommand ``command`` is written as argparse's usage errors are (:class:`_Parser`): named
    by the subcommand, with its ``--help`` to read."""
    text = " ".join(message.split())
    if command is not None and text.startswith("--"):
        prog = f"{PROG} {command}"
        print(f"{prog}: error: {text} (see {prog} --help)", file=sys.stderr)
    else:
        print(f"{PROG}: error: {text}", file=sys.stderr)
    return 2


@contextlib.contextmanager
def _one_line_warnings() -> Iterator[None]:
    """The library's warnings (too few replicates, an engine that falls back) as one line each on stderr, in the
    form of the errors, each message once; filters set by the caller (``-W error``, pytest's) still apply."""
    shown = set()

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        text = " ".join(str(message).split())
        if text not in shown:
            shown.add(text)
            print(f"{PROG}: warning: {text}", file=sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def _escape_what_the_terminal_cannot_show() -> None:
    """Characters the output's encoding cannot hold (a class name in Japanese on a Windows code page, or output
    redirected there to a file) are written as backslash escapes instead of ending the run in a traceback."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            with contextlib.suppress(ValueError, OSError):
                reconfigure(errors="backslashreplace")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 bad file or arguments).

    Args:
        argv: the arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with open(os.path.join(folder, "truth.csv"), "w") as f:
        ...     _ = f.write('fname,labels\\nx.wav,"a,c"\\ny.wav,"b,c"\\n')
        >>> with open(os.path.join(folder, "pred.csv"), "w") as f:
        ...     _ = f.write("fname,a,b,c\\nx.wav,0.1,0.7,0.2\\ny.wav,0.1,0.7,0.2\\n")
        >>> code = main(["score", os.path.join(folder, "truth.csv"), os.path.join(folder, "pred.csv"), "--json"])
        ... # doctest: +ELLIPSIS
        {"lwlrap": 0.79166..., "lrap": 0.79166..., "num_samples": 2, "num_labels": 4, "num_classes": 3, ...}
        >>> code
        0
    """
    if argv is None:  # run as a command: its output streams are the program's own
        _escape_what_the_terminal_cannot_show()
    parser = build_parser()
    try:
        args = _parse(parser, argv)
    except SystemExit as exit_:  # --help, --version and usage errors
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    try:
        check_engine_variable()
        with compile_notice(), _one_line_warnings():
            return args.run(args)
    except CommandError as err:
        return _error(str(err), args.command)
    except (MemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        return _error(out_of_memory_message(err, args))
