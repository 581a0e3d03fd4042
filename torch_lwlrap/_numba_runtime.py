"""The one runner of every compiled CPU kernel: numba's import, the parallel and serial copies of each parallel
kernel, and the decision of which copy a call runs.

Threads, processes and forks. Every parallel kernel is compiled twice (:func:`parallel_and_serial`): a parallel
variant (``prange`` spread over numba's threads) and a serial one (``prange`` runs as ``range``; numba's threading
layer is not touched). :func:`run` takes the serial variant, and enters no parallel region, when

* the pass is small: fewer than :data:`PARALLEL_MIN_SCORES_PER_THREAD` scores (or items) per thread (waking threads
  costs more than it saves on small batches, and far more when other processes keep the cores busy); the threads
  used are never more than ``torch.get_num_threads()`` (:func:`threads_for`);
* the serial variant has been the faster of the two on this kernel and size in this process (:class:`SpeedChoice`:
  each call is timed, and the variant not in use is tried again now and then). Threads on busy cores make a
  parallel region wait for its slowest thread (GNU OpenMP's threads spin while they wait: 2048 x 527 took 68 to 87 ms
  per ``update`` on 2 busy cores with 2 threads, 12 ms with one), and host-wide counters cannot tell a busy core
  from one that torch's own threads spin on for a moment after an operation: only the library's own calls can;
* another Python thread is inside a parallel region of any kernel (a lock taken without waiting): numba's
  ``workqueue`` layer aborts the process on concurrent use, and the other layers gain nothing from sharing the
  cores;
* the process is a forked child (detected with ``os.register_at_fork``): GNU OpenMP kills or hangs a child that
  enters a parallel region after its parent's OpenMP threads started, numba's or torch's.

Both variants compute the same sums in the same order, so the results do not depend on the variant. Kernels
without ``prange`` are compiled with :func:`serial_kernel`: they never start a thread. No other module compiles a
parallel kernel or calls one except through :func:`run` (``tests/test_concurrency.py`` checks both).

numba's disk cache. Every kernel is cached (``cache=True``), and numba checks only the source file of the function
it compiled: a kernel whose own module is unchanged would load code built from an older version of a function or a
constant it takes from another module (numba's issue 6845). On import, :func:`clear_stale_cache` removes the
package's cached kernels whenever any of their sources (:func:`kernel_sources`) changed since they were cached.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import re
import threading
import time
import types
from pathlib import Path
from typing import Callable, List, NamedTuple, Optional

import torch

from torch_lwlrap._user_frames import warn

#: Why an installed numba failed to import (``NUMBA_NUM_THREADS=0``, a numba too new for this numpy), or None.
IMPORT_ERROR: Optional[Exception] = None

try:  # numba is an optional dependency (the "cpu" extra)
    import numba
    from numba import njit, prange
except Exception as _err:  # pragma: no cover - depends on the installation
    numba = None
    njit = None
    prange = range
    if not (isinstance(_err, ModuleNotFoundError) and _err.name == "numba"):
        IMPORT_ERROR = _err

__all__ = [
    "SpeedChoice", "clear_stale_cache", "kernel_sources", "numba", "prange", "parallel_and_serial", "run",
    "serial_kernel", "threads_for", "unavailable_reason",
]


def unavailable_reason(device) -> Optional[str]:
    """Why no compiled CPU kernel can take tensors on ``device`` (None: they can), in words for a warning: what every
    numba backend declares, before its own conditions.

    Example:
        >>> unavailable_reason("cuda")
        'the numba kernels take CPU tensors, not cuda ones'
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    if device.type != "cpu":
        return f"the numba kernels take CPU tensors, not {device.type} ones"
    if numba is None and IMPORT_ERROR is not None:
        return f"numba fails to import ({type(IMPORT_ERROR).__name__}: {' '.join(str(IMPORT_ERROR).split())})"
    if numba is None:
        return "numba is not installed"
    if numba.config.DISABLE_JIT:
        return "numba's compiler is switched off (NUMBA_DISABLE_JIT=1)"
    return None

def kernel_sources(directory: Path, package: str) -> List[Path]:
    """The modules of ``package`` (its ``.py`` files in ``directory``; subpackages hold no kernels) that compiled code
    is built from: those that import this module, and every module of the package they import from, directly or
    not. A kernel's machine code holds the functions it calls and the module-level values it reads, wherever they
    are defined.

    Example:
        >>> names = [path.name for path in kernel_sources(Path(__file__).parent, "torch_lwlrap")]
        >>> {"_ltr_numba.py", "_ltr_sort.py", "_numba_vector.py", "_engine_config.py"} <= set(names)
        True
        >>> "_dispatch.py" in names  # above the kernels: it calls them, none calls it
        False
    """
    texts = {path.stem: path.read_text(encoding="utf-8") for path in sorted(directory.glob("*.py"))}

    def imports(text: str, source_package: str) -> set:
        """The modules of ``source_package`` that ``text`` imports from (``from p.m import x``, ``from p import m``)."""
        statement = rf"^\s*from\s+{re.escape(source_package)}(?:\.(\w+))?\s+import\s+(\([^)]*\)|[^\n]*)"
        found = set()
        for module, names in re.findall(statement, text, re.M):
            found.update([module] if module else re.findall(r"\w+", names))  # "from package import a, b as c"
        return found

    runtime_package, _, runtime = __name__.rpartition(".")
    pending = [name for name, text in texts.items()
               if (package, name) == (runtime_package, runtime) or runtime in imports(text, runtime_package)]
    sources = set()
    while pending:
        name = pending.pop()
        if name not in sources:
            sources.add(name)
            pending.extend(imports(texts[name], package) & set(texts))
    return [directory / f"{name}.py" for name in sorted(sources)]


def _llvmlite_version() -> str:
    try:
        import llvmlite  # installed with numba

        return llvmlite.__version__
    except ImportError:  # pragma: no cover
        return "none"


def clear_stale_cache(anchor: Callable, package: str) -> bool:
    """Remove numba's cached kernels of ``package`` when any of their sources (:func:`kernel_sources`, in the folder
    of ``anchor``'s file) changed since they were cached; returns whether it removed any.

    The fingerprint of the sources (SHA-256 of their names and contents, and of the numba and llvmlite versions) is
    kept beside the cache files, in the
    folder numba caches ``anchor``'s module in (``__pycache__``, ``NUMBA_CACHE_DIR`` or the user's cache folder:
    the same for every module of the folder). Processes that start at once may both remove the cache; each then
    compiles what it needs. A folder that cannot be read or written leaves the cache as it is.
    """
    if numba is None:
        return False
    try:
        from numba.core.caching import FunctionCache

        cache_dir = Path(FunctionCache(anchor)._cache_path)
        digest = hashlib.sha256()
        # The compilers too: a checkout shared by environments of two numba (or llvmlite) versions must not load the
        # other's files, whose bitcode an older LLVM cannot parse (seen with numba 0.59.1 after 0.68.1).
        digest.update(f"numba {numba.__version__} llvmlite {_llvmlite_version()}\0".encode())
        for path in kernel_sources(Path(inspect.getfile(anchor)).resolve().parent, package):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        fingerprint = digest.hexdigest()
        stamp = cache_dir / f"{package}.kernel-sources.sha256"
        with contextlib.suppress(OSError):
            if stamp.read_text(encoding="ascii") == fingerprint:
                return False
        removed = False
        for path in sorted(cache_dir.glob("*.nbi")) + sorted(cache_dir.glob("*.nbc")):
            with contextlib.suppress(OSError):
                path.unlink()
                removed = True
        partial = stamp.with_name(f"{stamp.name}.{os.getpid()}.tmp")
        partial.write_text(fingerprint, encoding="ascii")
        os.replace(partial, stamp)
        return removed
    except Exception:  # pragma: no cover - an unwritable folder, numba's internals moved: numba's own checks remain
        return False


#: Scores (or items) per thread below which a pass uses fewer threads, down to the serial variant: at twice this, no
#: parallel region is entered (``benchmarks/latency.py``).
PARALLEL_MIN_SCORES_PER_THREAD = 1 << 18

#: Held by the thread inside a parallel region; others run the serial variants meanwhile.
_parallel_lock = threading.Lock()

#: True in a child forked after numba's threads started in its parent, or where they cannot start: only serial
#: variants run there.
_serial_only = False

#: Why numba's threads could not start in this process (then only serial variants run), or None.
threads_failure: Optional[str] = None


def _threads_started() -> bool:
    """Whether numba's threading layer has been launched in this process (True when it cannot be told)."""
    try:
        from numba.np.ufunc import parallel

        return bool(parallel._is_initialized)
    except Exception:  # pragma: no cover - numba internals moved
        return True


def _start_threads() -> bool:
    """Start numba's threads for a first parallel region. Where they cannot start (``NUMBA_THREADING_LAYER`` names a
    layer that is not installed, say), warn once and run only the serial variants from then on: the same values, on
    one thread, instead of numba's error from inside every call."""
    global _serial_only, threads_failure
    torch_threads = torch.get_num_threads()
    try:
        from numba.np.ufunc import parallel

        parallel._launch_threads()
        return True
    except Exception as err:
        _serial_only = True
        threads_failure = f"{type(err).__name__}: {' '.join(str(err).split())}"
        warn(
            f"torch_lwlrap: numba's threads could not start ({threads_failure}). The CPU kernels run on one thread in "
            f"this process: the values are the same, but large batches are slower. To fix it, install the threading "
            f"layer that NUMBA_THREADING_LAYER names, or unset that variable.",
            RuntimeWarning,
        )
        return False
    finally:
        # numba's launch sets the OpenMP thread count it shares with torch (its omp layer) to NUMBA_NUM_THREADS: the
        # user's torch.set_num_threads had been overridden for the rest of the process.
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)


def _after_fork_in_child() -> None:
    global _serial_only, _parallel_lock
    _parallel_lock = threading.Lock()  # a lock held by another thread at the fork would stay held in the child
    # Serial in every forked child: GNU OpenMP (numba's omp layer, torch's threads) hangs or kills a child that
    # enters a parallel region after the parent's OpenMP threads started, numba's or torch's own, and torch's cannot
    # be told from here.
    _serial_only = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

clear_stale_cache(unavailable_reason, "torch_lwlrap")


def threads_for(scores: int) -> int:
    """The most threads a pass over ``scores`` scores may use: 1 (the serial variant only) in a forked child or for
    small batches, else up to ``torch.get_num_threads()`` and ``numba.get_num_threads()``, one per
    :data:`PARALLEL_MIN_SCORES_PER_THREAD` scores.
    :func:`run` then takes that many threads or the serial variant, whichever has been faster.

    Example:
        >>> threads_for(32 * 527)
        1
    """
    if _serial_only or numba is None:
        return 1
    limit = min(torch.get_num_threads(), _numba_threads(), scores // PARALLEL_MIN_SCORES_PER_THREAD)
    if limit > 1 and not _threads_started() and not _start_threads():
        return 1
    return max(1, limit)


def _numba_threads() -> int:
    """numba's thread count in this thread: the caller's own ``numba.set_num_threads`` (never raised by :func:`run`,
    which puts it back after each call), else ``NUMBA_NUM_THREADS``. Read from numba only once its threads are
    running (a call to ``set_num_threads`` starts them): before that, asking would start them."""
    if not _threads_started():
        return numba.config.NUMBA_NUM_THREADS
    return numba.get_num_threads()


class SpeedChoice:
    """Which variant of a kernel runs next, from the timings of this process's own calls.

    Calls are told apart by a key (the kernel, the kind of work that :func:`run` is told, the thread count and the
    size class: the bit length of the number of scores). For each key it keeps the last ``kept`` timings of each
    variant, in seconds per score, and takes the variant whose median recent timing is lower (a median, not the
    best: on cores that other threads keep busy a parallel region is now and then as fast as on idle ones, and
    mostly far slower). The first ``warmup`` timings of each variant and key are not kept: a variant's first calls
    at a size pay for what later calls find ready (fresh workspaces' pages, the threads' first wake; a parallel
    region's first timed call took up to 3 times as long as the next ones), and one such timing against the other
    variant's first could keep the slower variant for a dozen calls. The other variant is tried once after
    ``reprobe_min`` calls, then
    after twice as many each time it loses again (up to ``reprobe_max``), and again after ``reprobe_min`` once it
    wins. A machine that gets busy (or idle) is followed within a few calls of the variant in use, or at the next try
    of the other one.

    Example:
        >>> choice = SpeedChoice(reprobe_min=2)
        >>> choice.parallel_next("k"), choice.record("k", True, 9.0)  # parallel first: a warm-up, not kept
        (True, None)
        >>> choice.parallel_next("k"), choice.record("k", True, 1.0)  # parallel again
        (True, None)
        >>> [(choice.parallel_next("k"), choice.record("k", False, 3.0)) for _ in range(2)]  # then serial, twice
        [(False, None), (False, None)]
        >>> [choice.parallel_next("k") for _ in range(3)]  # parallel was faster; serial is tried again every 2 calls
        [True, False, True]
    """

    def __init__(self, reprobe_min: int = 8, reprobe_max: int = 256, kept: int = 3, warmup: int = 1):
        self.reprobe_min, self.reprobe_max, self.kept, self.warmup = reprobe_min, reprobe_max, kept, warmup
        self._lock = threading.Lock()
        self._keys: dict = {}

    def parallel_next(self, key) -> bool:
        """Whether the next call of ``key`` should run the parallel variant."""
        with self._lock:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = _KeyTimings(self.reprobe_min)
            if not state.parallel or not state.serial:
                return not state.parallel  # each variant is timed once first, parallel first
            faster = _median(state.parallel) <= _median(state.serial)
            state.countdown -= 1
            if state.countdown > 0:
                return faster
            state.countdown, state.trying = state.interval, not faster
            return not faster

    def record(self, key, parallel: bool, seconds: float) -> None:
        """Keep the timing of a call of ``key`` (seconds per score) that ran the ``parallel`` or serial variant."""
        with self._lock:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = _KeyTimings(self.reprobe_min)
            if state.warmed[parallel] < self.warmup:  # a warm-up call of this variant: not kept
                state.warmed[parallel] += 1
                return
            mine, other = (state.parallel, state.serial) if parallel else (state.serial, state.parallel)
            mine.append(seconds)
            del mine[: -self.kept]
            if state.trying is parallel:  # the result of a try of the variant not in use
                won = _median(mine) <= _median(other)
                state.interval = self.reprobe_min if won else min(2 * state.interval, self.reprobe_max)
                state.countdown, state.trying = state.interval, None


def _median(timings: list) -> float:
    ordered = sorted(timings)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class _KeyTimings:
    """What :class:`SpeedChoice` keeps per key."""

    __slots__ = ("parallel", "serial", "countdown", "interval", "trying", "warmed")

    def __init__(self, interval: int):
        self.parallel: list = []  # the last timings of each variant, seconds per score
        self.serial: list = []
        self.warmed = {True: 0, False: 0}  # warm-up timings passed over, per variant (True: parallel)
        self.countdown = self.interval = interval  # calls until the next try of the other variant; between tries
        self.trying = None  # the variant being tried (True: parallel), until its timing comes back


#: The choice every :func:`run` call consults (tests replace it to force a variant).
_choice = SpeedChoice()


class ParallelAndSerial(NamedTuple):
    """A kernel compiled twice; call it through :func:`run` only."""

    parallel: object  #: ``prange`` spread over numba's threads
    serial: object  #: ``prange`` as ``range``: numba's threading layer is not touched


#: Why numba cannot cache the kernels on disk in this process (then they compile in each process), or None.
cache_failure: Optional[str] = None


def _jit(func: Callable, **options) -> Callable:
    """``numba.njit(cache=True, **options)(func)``; where numba finds no folder to cache in (the package's folder,
    ``NUMBA_CACHE_DIR`` and the user's cache folder all read-only, as in a hardened container), the kernel without
    the disk cache, with one warning: numba's error had made the package fail at import, the torch paths with it."""
    global cache_failure
    if cache_failure is None:
        try:
            return njit(cache=True, **options)(func)
        except RuntimeError as err:
            if "no locator available" not in str(err):
                raise
            cache_failure = " ".join(str(err).split())
            warn(
                f"torch_lwlrap: numba finds no writable folder to cache the compiled CPU kernels in ({cache_failure}). "
                f"They compile in each process instead (about 10 s per score dtype on 2 cores); the values are the "
                f"same. To keep them, set NUMBA_CACHE_DIR to a writable folder.",
                RuntimeWarning,
            )
    return njit(cache=False, **options)(func)


def parallel_and_serial(func: Callable) -> ParallelAndSerial:
    """Compile ``func`` twice (see the module's docstring); the serial copy is renamed so that numba's on-disk
    cache keeps the two apart."""
    serial = types.FunctionType(func.__code__, func.__globals__, func.__name__ + "_serial", func.__defaults__)
    serial.__qualname__ = func.__qualname__ + "_serial"
    serial.__doc__ = func.__doc__
    # Both copies divide as numpy does (a parallel kernel always does): a NaN row's zero rank then gives a NaN that
    # the caller's NaN check reports, instead of a ZeroDivisionError from the serial copy only.
    return ParallelAndSerial(
        _jit(func, parallel=True, nogil=True, error_model="numpy"), _jit(serial, nogil=True, error_model="numpy")
    )


def serial_kernel(func: Callable = None, **options):
    """``numba.njit(cache=True, nogil=True, **options)``: a kernel without ``prange``, which never starts a thread
    and may be called directly. Usable as ``@serial_kernel`` or ``@serial_kernel(inline="always")``."""
    if func is None:
        return lambda f: _jit(f, nogil=True, **options)
    return _jit(func, nogil=True, **options)


def borrowing_kernel(func: Callable) -> Callable:
    """:func:`serial_kernel` compiled without numba's reference counts (``_nrt=False``): for the functions a row's
    work calls, which only read and write arrays they are given. numba otherwise takes and drops a reference to an
    array argument in each call, and to each view it makes and each array it returns, an atomic instruction each
    (a few dozen a row in the rank-agreement kernels, an eighth of their time).

    Such a function must not allocate, return an array, or keep one (an array it is given, a view of one, or one
    another borrowing function swaps it with is fine); it may call other borrowing functions and take tuples of
    arrays. numba refuses to compile one that allocates ("NRT required but not enabled", or a typing error for
    ``np.empty``), and compiles the functions it calls without reference counts too; it does not refuse one that
    returns an array it was given (its caller would then drop a reference it never took): the functions return
    flags, counts and tuples of scalars only. ``tests/test_ltr_sort.py`` checks that a rank-agreement row's
    work takes no reference outside the kernel itself."""
    return _jit(func, nogil=True, _nrt=False)


def run(kernel: ParallelAndSerial, scores: int, *args, workload=None):
    """Run a kernel compiled with :func:`parallel_and_serial` on a pass over ``scores`` scores (or items): the
    parallel variant on :func:`threads_for` threads where that is more than one, it has been the faster variant
    here (:class:`SpeedChoice`) and no other thread is in a parallel region, else the serial variant.

    ``workload``: a hashable label of the work per score where one kernel does different work by its arguments
    (Spearman or Kendall; the size class of the k of a top k): each has its own timings. Mixed, the faster work's
    timings of one variant would be weighed against the slower work's of the other."""
    threads = threads_for(scores)
    if threads < 2:
        return kernel.serial(*args)
    key = (id(kernel), workload, threads, scores.bit_length())
    parallel = _choice.parallel_next(key) and _parallel_lock.acquire(blocking=False)
    variant = kernel.parallel if parallel else kernel.serial
    # A call that compiles (or loads from numba's cache) or starts numba's threads is not timed.
    untimed = len(variant.overloads), parallel and not _threads_started()
    start = time.perf_counter()
    callers = _numba_threads() if parallel else threads  # per Python thread in numba
    try:
        if callers != threads:
            numba.set_num_threads(threads)
        return variant(*args)
    finally:
        seconds = time.perf_counter() - start
        if callers != threads:  # the caller's setting back, for its own numba code
            numba.set_num_threads(callers)
        if parallel:
            _parallel_lock.release()
        if (len(variant.overloads), False) == untimed:
            _choice.record(key, parallel, seconds / scores)
