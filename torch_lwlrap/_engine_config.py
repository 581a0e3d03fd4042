"""The engine setting: which ranking path runs (``use_engine`` in code, ``TORCH_LWLRAP_ENGINE`` in the environment)
and the chunk size tests and benchmarks force; and how every public entry meets the engines from outside: run
eagerly inside ``torch.compile`` (:func:`eager_only`). Warnings at the user's line live in
:mod:`torch_lwlrap._user_frames`. Pure Python: every layer reads it, and the command line checks the variable before
it imports torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import types
from typing import Callable, Iterator, Optional, Tuple, TypeVar

from torch_lwlrap._options import ENGINES, whole_number

__all__ = [
    "BUDGETS", "ENGINES", "ENGINE_VARIABLE", "chunk_elements", "compiled_cpu_allowed", "eager_only",
    "forced_chunk_elements", "get_engine", "is_eager_wrapper", "use_engine",
]

#: Environment variable that selects the engine path without code changes (read when ranking).
ENGINE_VARIABLE = "TORCH_LWLRAP_ENGINE"

#: ``(engine, chunk_elements)`` forced by :func:`use_engine` in this thread or context; None: not forced.
_forced: contextvars.ContextVar[Optional[Tuple[str, Optional[int]]]] = contextvars.ContextVar(
    "torch_lwlrap_engine", default=None
)


def get_engine() -> str:
    """The engine in use: the path forced by :func:`use_engine` in this thread or context, else the value of the
    environment variable ``TORCH_LWLRAP_ENGINE``, else ``"auto"`` (see :data:`ENGINES`).

    Example:
        >>> with use_engine("sort"):
        ...     get_engine()
        'sort'
    """
    forced = _forced.get()
    if forced is not None:
        return forced[0]
    value = os.environ.get(ENGINE_VARIABLE)
    if value is None:
        return "auto"
    engine = value.strip().lower() or "auto"
    if engine not in ENGINES:
        raise ValueError(
            f"Environment variable {ENGINE_VARIABLE} must be one of {', '.join(ENGINES)}, but got {value!r}. "
            f"Set it to one of these (or unset it for auto)."
        )
    return engine


@contextlib.contextmanager
def use_engine(engine: str, chunk_elements: Optional[int] = None) -> Iterator[None]:
    """Force an engine path (and optionally a chunk size) inside a ``with`` block, for tests and benchmarks.

    ``chunk_elements`` is about the number of elements (scores, counts or weights) per chunk: it replaces every
    chunk budget of the package (:data:`BUDGETS`), from the chunks of samples a batch is formatted and ranked in to
    the torch paths' workspace and the bootstrap's blocks.

    Every path gives the same result up to float64 rounding; only the speed differs. A forced ``"count"`` keeps
    counting where ``"auto"`` would sort: ``O(K C)`` for a row of ``K`` positives and ``C`` labels, far slower than
    the sort on rows with thousands of positives (most of all under ``ties="index"`` on tied scores).

    The override holds in the calling thread (or ``contextvars`` context) only: other threads keep their own.
    """
    given = engine
    engine = engine.strip().lower() if isinstance(engine, str) else engine  # as TORCH_LWLRAP_ENGINE is read
    if engine not in ENGINES:
        raise ValueError(f"Argument `engine` must be one of {ENGINES}, but got {given!r}.")
    if chunk_elements is not None and (whole_number(chunk_elements) is None or chunk_elements < 1):
        raise ValueError(f"Argument `chunk_elements` must be a positive integer or None, but got {chunk_elements!r}.")
    token = _forced.set((engine, chunk_elements))
    try:
        yield
    finally:
        _forced.reset(token)


_Func = TypeVar("_Func", bound=Callable)


def eager_only(func: _Func) -> _Func:
    """``func`` run eagerly inside ``torch.compile``: a public function or metric method of the package, which
    dynamo must not trace into (numba's dispatchers and the host reads of the engines break its tracing). Under
    ``torch.compile`` the call is a graph break and runs as it would outside; the rest of the compiled function is
    compiled as usual. Outside, it costs one dictionary lookup: ``torch._dynamo`` is not even imported until a
    compile has loaded it (``torch.compiler.disable`` would import it, 0.9 s)."""
    disabled = []

    def call(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:  # nothing has compiled in this process
            return func(*args, **kwargs)
        if not disabled:
            disabled.append(sys.modules["torch"].compiler.disable(func, recursive=True))
        return disabled[0](*args, **kwargs)

    # A code object of its own for each wrapped function: dynamo keeps its compiled frames per code object, and the
    # wrappers of a shared one (told apart by their closures only) each took one of its recompiles, up to dynamo's
    # limit (8) in a step that calls more of the package's functions and methods.
    code = call.__code__.replace(co_name=func.__name__, co_qualname=f"eager_only.<{func.__qualname__}>")
    call = types.FunctionType(code, call.__globals__, func.__name__, call.__defaults__, call.__closure__)
    return functools.wraps(func)(call)  # type: ignore[return-value]


def is_eager_wrapper(frame) -> bool:
    """Whether ``frame`` runs :func:`eager_only`'s wrapper, which a message naming the user's call looks past: any
    frame of this module (under ``torch.compile`` dynamo runs the wrapper as other code, named after it)."""
    return frame.f_globals.get("__name__") == __name__


def engine_forced_by_block() -> bool:
    """Whether the engine in use comes from a :func:`use_engine` block (else from ``TORCH_LWLRAP_ENGINE``, or auto)."""
    return _forced.get() is not None


def forced_chunk_elements() -> Optional[int]:
    """The chunk size forced by :func:`use_engine`, or None for the defaults."""
    forced = _forced.get()
    return None if forced is None else forced[1]


# The chunk budgets, each under its own name: about how many elements one chunk of work holds, so that every
# workspace stays bounded whatever the batch size. A chunk size forced by use_engine replaces each of them
# (chunk_elements); INPUT_CHUNK_BYTES is the one budget in bytes, and a forced size bounds the scores per chunk there.

#: Input formatting (torch_lwlrap._checks.formatted_chunks): bytes of flattened copies and masks per chunk of samples.
INPUT_CHUNK_BYTES = 64 << 20

#: Torch sort and count paths: scores per block of rows off the CPU (the workspace takes a few dozen bytes a score).
TORCH_PATH_CHUNK_ELEMENTS = 1 << 21

#: Torch sort and count paths: scores per block of rows on the CPU.
TORCH_PATH_CPU_CHUNK_ELEMENTS = 1 << 22

#: Torch count path on the CPU: scores compared per pass, sized for the block and its 0/1 buffer to stay in the
#: core's cache (measured with ``benchmarks/``).
TORCH_PATH_CPU_PASS_ELEMENTS = 1 << 17

#: Numba passes: scores converted per chunk when the input must be widened or made contiguous first.
NUMBA_CONVERSION_CHUNK_ELEMENTS = 1 << 22

#: Dense label counts (torch_lwlrap._ranking.label_counts_chunks): seven (n, C) outputs take 25 bytes a score, the
#: sort's workspace a few dozen more.
LABEL_COUNTS_CHUNK_ELEMENTS = 1 << 20

#: Bootstrap weights drawn per block by torch (torch_lwlrap.stats._bootstrap): int64 temporaries of 8 MiB each.
BOOTSTRAP_BLOCK_ELEMENTS = 1 << 20

#: Compact label counts of the numba pass (torch_lwlrap._numba_counts): positives per block of rows, 40 bytes each,
#: and as much again for the reductions over a block (the ranking metrics, the tie rules).
COMPACT_COUNTS_BLOCK_POSITIVES = 1 << 19

BUDGETS = (
    "INPUT_CHUNK_BYTES", "TORCH_PATH_CHUNK_ELEMENTS", "TORCH_PATH_CPU_CHUNK_ELEMENTS", "TORCH_PATH_CPU_PASS_ELEMENTS",
    "NUMBA_CONVERSION_CHUNK_ELEMENTS", "LABEL_COUNTS_CHUNK_ELEMENTS", "BOOTSTRAP_BLOCK_ELEMENTS",
    "COMPACT_COUNTS_BLOCK_POSITIVES",
)


def chunk_elements(budget: str) -> int:
    """The elements per chunk of the budget named ``budget`` (one of :data:`BUDGETS` but the byte budget): the chunk
    size forced by :func:`use_engine` where one is, else the budget's value (read when called: tests may set it).

    Example:
        >>> with use_engine("sort", chunk_elements=1000):
        ...     chunk_elements("BOOTSTRAP_BLOCK_ELEMENTS")
        1000
    """
    if budget not in BUDGETS or budget == "INPUT_CHUNK_BYTES":
        raise ValueError(f"Argument `budget` must name one of the element budgets {BUDGETS[1:]}, but got {budget!r}.")
    return forced_chunk_elements() or globals()[budget]


def compiled_cpu_allowed() -> bool:
    """Whether the setting lets CPU work take the compiled numba kernels (``"auto"`` or ``"numba"``); the torch
    engines (``"sort"``, ``"count"``) keep every step in torch, and ``"triton"`` serves CUDA tensors only.

    Example:
        >>> with use_engine("sort"):
        ...     compiled_cpu_allowed()
        False
    """
    return get_engine() in ("auto", "numba")
