"""The one runner of every compiled CPU kernel: numba's import, the parallel and serial copies of each parallel
kernel, and the decision of which copy a call runs.

Threads, processes and forks. Every parallel kernel is compiled twice (:func:`parallel_and_serial`): a parallel
variant (``prange`` spread over numba's threads) and a serial one (``prange`` runs as ``range``; numba's threading
layer is not touched). :func:`run` takes the serial variant, and enters no parallel region, when

* the pass is small: fewer than :data:`PARALLEL_MIN_SCORES_PER_THREAD` scores (or items) per thread (waking threads
  costs more than it saves on small batches, and far more when other processes keep the cores busy); the threads
  used are never more than ``torch.get_num_threads()``, nor than the cores no other task is running on at the time
  of the call (:func:`_idle_cores`: with data-loader workers keeping every core busy, a batch of any size runs
  serial);
* another Python thread is inside a parallel region of any kernel (a lock taken without waiting): numba's
  ``workqueue`` layer aborts the process on concurrent use, and the other layers gain nothing from sharing the
  cores;
* the process is a child forked after numba's threads started in its parent (detected with
  ``os.register_at_fork``): GNU OpenMP kills such a child when it enters a parallel region.

Both variants compute the same sums in the same order, so the results do not depend on the variant. Kernels
without ``prange`` are compiled with :func:`serial_kernel`: they never start a thread. No other module compiles a
parallel kernel or calls one except through :func:`run` (``tests/test_concurrency.py`` checks both).
"""

from __future__ import annotations

import os
import threading
import types
from typing import Callable, NamedTuple, Optional

import torch

try:  # numba is an optional dependency (the "cpu" extra)
    import numba
    from numba import njit, prange
except Exception:  # pragma: no cover - depends on the installation
    numba = None
    njit = None
    prange = range

__all__ = ["numba", "prange", "parallel_and_serial", "run", "serial_kernel", "threads_for", "unavailable_reason"]


def unavailable_reason(device) -> Optional[str]:
    """Why no compiled CPU kernel can take tensors on ``device`` (None: they can), in words for a warning: what every
    numba backend declares, before its own conditions.

    Example:
        >>> unavailable_reason("cuda")
        'the numba kernels take CPU tensors, not cuda ones'
    """
    device = torch.device(device)
    if device.type != "cpu":
        return f"the numba kernels take CPU tensors, not {device.type} ones"
    if numba is None:
        return "numba is not installed"
    return None

#: Scores (or items) per thread below which a pass uses fewer threads, down to the serial variant: at twice this, no
#: parallel region is entered (``benchmarks/latency.py``).
PARALLEL_MIN_SCORES_PER_THREAD = 1 << 18

#: Held by the thread inside a parallel region; others run the serial variants meanwhile.
_parallel_lock = threading.Lock()

#: True in a child forked after numba's threads started in its parent: only serial variants run there.
_serial_only = False


def _threads_started() -> bool:
    """Whether numba's threading layer has been launched in this process (True when it cannot be told)."""
    try:
        from numba.np.ufunc import parallel

        return bool(parallel._is_initialized)
    except Exception:  # pragma: no cover - numba internals moved
        return True


def _after_fork_in_child() -> None:
    global _serial_only, _parallel_lock
    _parallel_lock = threading.Lock()  # a lock held by another thread at the fork would stay held in the child
    if numba is not None and _threads_started():
        _serial_only = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def threads_for(scores: int) -> int:
    """The threads a pass over ``scores`` scores uses: 1 (the serial variant) in a forked child or for small batches,
    else up to ``torch.get_num_threads()``, one per :data:`PARALLEL_MIN_SCORES_PER_THREAD` scores.

    Example:
        >>> threads_for(32 * 527)
        1
    """
    if _serial_only or numba is None:
        return 1
    limit = min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS, scores // PARALLEL_MIN_SCORES_PER_THREAD)
    if limit < 2:
        return 1
    return max(1, min(limit, _idle_cores()))


#: Linux's load file: its fourth field is ``running/total`` tasks.
_LOADAVG = "/proc/loadavg"


def _idle_cores() -> int:
    """Cores this process may use that no other task is running on right now: the running count of
    ``/proc/loadavg`` (which includes the calling thread) taken from the cores of ``os.sched_getaffinity``.

    A parallel region on cores other processes keep busy waits for its slowest thread, and GNU OpenMP's threads spin
    while they wait: 2048 x 527 took 68 to 87 ms per ``update`` on 2 busy cores with 2 threads, 12 ms with one.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    try:
        with open(_LOADAVG, "rb") as loadavg:
            running = int(loadavg.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):  # not Linux: assume the cores are free
        return cores
    return cores - running + 1


class ParallelAndSerial(NamedTuple):
    """A kernel compiled twice; call it through :func:`run` only."""

    parallel: object  #: ``prange`` spread over numba's threads
    serial: object  #: ``prange`` as ``range``: numba's threading layer is not touched


def parallel_and_serial(func: Callable) -> ParallelAndSerial:
    """Compile ``func`` twice (see the module's docstring); the serial copy is renamed so that numba's on-disk
    cache keeps the two apart."""
    serial = types.FunctionType(func.__code__, func.__globals__, func.__name__ + "_serial", func.__defaults__)
    serial.__qualname__ = func.__qualname__ + "_serial"
    serial.__doc__ = func.__doc__
    # Both copies divide as numpy does (a parallel kernel always does): a NaN row's zero rank then gives a NaN that
    # the caller's NaN check reports, instead of a ZeroDivisionError from the serial copy only.
    return ParallelAndSerial(
        njit(parallel=True, cache=True, nogil=True, error_model="numpy")(func),
        njit(cache=True, nogil=True, error_model="numpy")(serial),
    )


def serial_kernel(func: Callable = None, **options):
    """``numba.njit(cache=True, nogil=True, **options)``: a kernel without ``prange``, which never starts a thread
    and may be called directly. Usable as ``@serial_kernel`` or ``@serial_kernel(inline="always")``."""
    if func is None:
        return lambda f: njit(cache=True, nogil=True, **options)(f)
    return njit(cache=True, nogil=True, **options)(func)


def run(kernel: ParallelAndSerial, scores: int, *args):
    """Run a kernel compiled with :func:`parallel_and_serial` on a pass over ``scores`` scores (or items): the
    parallel variant on :func:`threads_for` threads where that is more than one and no other thread is in a
    parallel region, else the serial variant."""
    threads = threads_for(scores)
    if threads > 1 and _parallel_lock.acquire(blocking=False):
        try:
            if numba.get_num_threads() != threads:  # per Python thread in numba
                numba.set_num_threads(threads)
            return kernel.parallel(*args)
        finally:
            _parallel_lock.release()
    return kernel.serial(*args)
