"""What the command line checks and says about the machine it runs on, around a subcommand's run: the engine
variable, the first-call compile of the CPU kernels, the memory a bootstrap needs and an allocation that fails.

Nothing here imports torch before a subcommand needs it: ``--help`` and a bad file stay quick. The compile notice
imports numba's event module (numba, not torch) when a subcommand starts, as the library would when it scores.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Iterator, Optional, TextIO

from torch_lwlrap.cli._files import CommandError

__all__ = [
    "COMPILE_NOTICE",
    "available_memory",
    "bootstrap_bytes",
    "check_engine_variable",
    "compile_notice",
    "format_bytes",
    "is_out_of_memory",
    "out_of_memory_message",
]

#: Printed on stderr, once, when numba starts compiling a kernel (an empty or stale cache); never on a warm cache.
COMPILE_NOTICE = (
    "torch-lwlrap: compiling the CPU kernels for this environment (half a minute to a minute on 2 cores, once: numba "
    "caches them on disk for later runs)..."
)

#: Bytes per bootstrap replicate and class: the ``(B, C)`` float64 sums and int64 counts of each system scored,
#: and the ``(B, C)`` float64 temporaries of the intervals (the replicate scores, quantile's sorted copy and its
#: indices). The peaks measured by ``ru_maxrss`` were 44 (one system) and 58 (two systems).
_STATE_BYTES_PER_SYSTEM = 16
_INTERVAL_BYTES = 32


def check_engine_variable() -> None:
    """CommandError when ``TORCH_LWLRAP_ENGINE`` is set to a value that is not an engine (its message names the
    variable, the value and the engines). Pure Python: no torch is imported."""
    from torch_lwlrap._engine_config import ENGINE_VARIABLE, get_engine

    if os.environ.get(ENGINE_VARIABLE) is None:
        return

    try:
        get_engine()
    except ValueError as err:
        raise CommandError(str(err)) from None


@contextlib.contextmanager
def compile_notice(stream: Optional[TextIO] = None) -> Iterator[None]:
    """Say once on ``stream`` (stderr) that the CPU kernels are being compiled, while inside the block.

    numba broadcasts a ``"numba:compile"`` event only when it compiles (not when it loads a kernel from its disk
    cache), so a warm cache prints nothing. Without numba this does nothing.
    """
    try:
        from numba.core import event
    except Exception:  # numba missing, or failing at import (NUMBA_NUM_THREADS=0): the library falls back too
        yield
        return

    class Notice(event.Listener):
        said = False

        def on_start(self, event_: object) -> None:
            if not self.said:
                self.said = True
                print(COMPILE_NOTICE, file=sys.stderr if stream is None else stream, flush=True)

        def on_end(self, event_: object) -> None:
            pass

    with event.install_listener("numba:compile", Notice()):
        yield


def bootstrap_bytes(num_bootstrap: int, num_classes: int, systems: int = 1) -> int:
    """The memory, in bytes, that ``B`` replicates of ``C`` classes take at their peak for ``systems`` submissions
    scored together (``score --ci``: 1, ``compare``: 2).

    Example:
        >>> format_bytes(bootstrap_bytes(1000, 80)), format_bytes(bootstrap_bytes(10**8, 80, systems=2))
        ('3.66 MiB', '477 GiB')
    """
    return num_bootstrap * num_classes * (_STATE_BYTES_PER_SYSTEM * systems + _INTERVAL_BYTES)


def format_bytes(size: float) -> str:
    """``size`` bytes in binary units, three significant digits.

    Example:
        >>> format_bytes(512), format_bytes(3 * 2**30 / 7), format_bytes(2**70)
        ('512 B', '439 MiB', '1024 EiB')
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if size < 1000:
            return f"{size:.3g} {unit}"
        size /= 1024
    return f"{size:.0f} EiB"


def _read_number(path: str, key: Optional[str] = None) -> Optional[int]:
    try:
        with open(path) as handle:
            for line in handle:
                name, _, value = line.partition(":") if key else ("", "", line)
                if key is None or name == key:
                    words = value.split()
                    if not words or not words[0].isdigit():
                        return None
                    return int(words[0]) * (1024 if words[1:] == ["kB"] else 1)
    except (OSError, ValueError):
        return None
    return None


def available_memory() -> Optional[int]:
    """Bytes this process can still allocate without swapping, as far as the system says: Linux's
    ``MemAvailable``, within a cgroup v2 memory limit; elsewhere the physical memory; None when unknown."""
    found = _read_number("/proc/meminfo", "MemAvailable")
    limit = _read_number("/sys/fs/cgroup/memory.max")  # "max" (no limit) reads as None
    if limit is not None:
        used = _read_number("/sys/fs/cgroup/memory.current") or 0
        found = max(0, limit - used) if found is None else min(found, max(0, limit - used))
    if found is None:
        try:
            found = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, OSError, ValueError):
            return None
    return found


def is_out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is an allocation that failed (MemoryError, or torch's RuntimeError of its allocators)."""
    if isinstance(err, MemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("can't allocate memory" in text or "not enough memory" in text
                                              or "out of memory" in text)


def out_of_memory_message(err: BaseException, args: argparse.Namespace) -> str:
    """The one-line error of an allocation that failed while running the subcommand of ``args``.

    Example:
        >>> err = RuntimeError("[enforce fail at alloc_cpu.cpp:121] err == 0. DefaultCPUAllocator: can't allocate "
        ...                    "memory: you tried to allocate 320000000 bytes. Error code 12 (Cannot allocate memory)")
        >>> out_of_memory_message(err, argparse.Namespace(ci=2000000))
        'out of memory: could not allocate 305 MiB more; fewer replicates than --ci 2000000 need less.'
    """
    text = str(err)
    in_bytes = re.search(r"allocate (\d+) bytes", text)
    in_units = re.search(r"[Tt]ried to allocate ([\d.]+ ?[KMGTP]i?B)", text)
    if in_bytes:
        detail = f"could not allocate {format_bytes(int(in_bytes.group(1)))} more"
    elif in_units:
        detail = f"could not allocate {in_units.group(1)} more"
    else:
        detail = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    for option in ("ci", "bootstrap"):
        if getattr(args, option, None):
            return f"out of memory: {detail}; fewer replicates than --{option} {getattr(args, option)} need less."
    return f"out of memory: {detail}."
