"""The engine setting: which ranking path runs (``use_engine`` in code, ``TORCH_LWLRAP_ENGINE`` in the environment)
and the chunk size tests and benchmarks force. Pure Python: every layer reads it, and the command line checks the
variable before it imports torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator, Optional, Tuple

from torch_lwlrap._options import ENGINES

__all__ = ["ENGINES", "ENGINE_VARIABLE", "compiled_cpu_allowed", "forced_chunk_elements", "get_engine", "use_engine"]

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

    ``chunk_elements`` is about the number of scores per chunk, both in the chunks of samples a batch is formatted
    and ranked in (:func:`torch_lwlrap._checks.formatted_chunks`) and in the torch paths' workspace.

    Every path gives the same result up to float64 rounding; only the speed differs.

    The override holds in the calling thread (or ``contextvars`` context) only: other threads keep their own.
    """
    if engine not in ENGINES:
        raise ValueError(f"Argument `engine` must be one of {ENGINES}, but got {engine!r}.")
    if chunk_elements is not None and chunk_elements < 1:
        raise ValueError(f"Argument `chunk_elements` must be positive, but got {chunk_elements!r}.")
    token = _forced.set((engine, chunk_elements))
    try:
        yield
    finally:
        _forced.reset(token)


def forced_chunk_elements() -> Optional[int]:
    """The chunk size forced by :func:`use_engine`, or None for the defaults."""
    forced = _forced.get()
    return None if forced is None else forced[1]


def compiled_cpu_allowed() -> bool:
    """Whether the setting lets CPU work take the compiled numba kernels (``"auto"`` or ``"numba"``); the torch
    engines (``"sort"``, ``"count"``) keep every step in torch, and ``"triton"`` serves CUDA tensors only.

    Example:
        >>> with use_engine("sort"):
        ...     compiled_cpu_allowed()
        False
    """
    return get_engine() in ("auto", "numba")
