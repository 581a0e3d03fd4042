"""``torch-lwlrap doctor``: the self-check of :mod:`torch_lwlrap.doctor` on the command line."""

from __future__ import annotations

import argparse


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    """Add the ``doctor`` subcommand to the command line's subparsers; :func:`run` runs it."""
    parser = commands.add_parser(
        "doctor",
        help="check this installation: versions, values against a reference on every device, speed",
        description="Check this installation; paste its output into an issue if something looks wrong.",
        epilog="Exit status: 0 when every value agrees with the reference, 1 otherwise, 2 for a "
        "TORCH_LWLRAP_ENGINE that names no engine.",
    )
    # The options of `python -m torch_lwlrap.doctor` (torch_lwlrap.doctor.build_parser, which imports torch: the
    # command line reads its files before it imports torch); tests/test_doctor.py holds the two the same.
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--no-timing", action="store_true", help="check the values only, without timings")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``torch-lwlrap doctor`` with the parsed arguments; returns the exit status."""
    from torch_lwlrap.doctor import run as run_doctor

    return run_doctor(json_output=args.json, timing=not args.no_timing)
