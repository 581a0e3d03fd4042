"""The CPU engine among other processes and threads: forked children, concurrent calls, per-thread overrides, the
serial and parallel variants of the ranking passes and of the rank-agreement kernels.

Forks and concurrent calls run in child interpreters (``tests/concurrency_child.py``): a child killed by GNU OpenMP
after a fork, or aborted by numba's workqueue layer on concurrent use, fails its test instead of taking pytest down.
Every child compares its values with the naive formulas (``tests/reference.py``), scipy and the brute-force distance
at k (``tests/reference_ranking.py``), and with the serial results.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.reference import make_case, naive_lwlrap
from torch_lwlrap import multilabel_lwlrap
from torch_lwlrap._ranking import ranking_sums, use_engine

numba = pytest.importorskip("numba")
from tests.concurrency_child import AlwaysParallel  # noqa: E402
from torch_lwlrap import _numba_runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOL = dict(rel=1e-12, abs=1e-12)


def _layers():
    """numba threading layers whose library is present here."""
    names = {"omp": "numba.np.ufunc.omppool", "tbb": "numba.np.ufunc.tbbpool", "workqueue": "numba.np.ufunc.workqueue"}
    present = []
    for layer, module in names.items():
        try:
            spec = importlib.util.find_spec(module)
        except Exception:  # noqa: BLE001
            spec = None
        if spec is not None:
            if layer == "tbb" and importlib.util.find_spec("tbb") is None:
                continue  # the layer's extension is there, the TBB library is not
            present.append(layer)
    return present


def _run_child(mode, **env):
    environment = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2", **env)
    done = subprocess.run(
        [sys.executable, "-m", "tests.concurrency_child", mode],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0 and done.stdout.rstrip().endswith("OK"), (
        f"child exited with {done.returncode}\nstdout:\n{done.stdout}\nstderr:\n{done.stderr[-4000:]}"
    )
    return done.stdout


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_pool_and_dataloader_workers_score_after_a_parent_call():
    # The parent enters numba's parallel regions first; then a fork pool and forked DataLoader workers score.
    _run_child("fork")


_FORK_AFTER_TORCH_THREADS = """
import faulthandler, os, torch, torch_lwlrap as T
g = torch.Generator().manual_seed(0)
mid, mid_y = torch.rand(400, 527, generator=g), torch.rand(400, 527, generator=g) < 0.01
T.multilabel_coverage_error(mid, mid_y)  # torch's own threads run here; numba's stay off (a mid-size batch)
from torch_lwlrap import _numba_runtime
assert not _numba_runtime._threads_started()
p, y = torch.rand(4000, 527, generator=g), torch.rand(4000, 527, generator=g) < 0.01
y[:, 0] = True
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(120, exit=True)  # a hang ends the child with status 1 and its stack
    print(T.multilabel_lwlrap(p, y).item(), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), T.multilabel_lwlrap(p, y).item())
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_torch_used_its_threads_scores_a_large_batch():
    # The child had hung in numba's parallel region (GNU OpenMP, shared with torch): the parent's torch had started
    # OpenMP's threads, and only numba's own were looked at. Every forked child now runs the serial kernels.
    environment = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="2", OMP_NUM_THREADS="2")
    environment.pop("TORCH_LWLRAP_ENGINE", None)
    done = subprocess.run([sys.executable, "-c", _FORK_AFTER_TORCH_THREADS], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    child, parent = done.stdout.split("\n")[:2]
    status, value = parent.split()
    assert status == "0", done.stderr[-4000:]
    assert float(child) == float(value)


def test_starting_numba_s_threads_leaves_torch_s_thread_count_alone():
    # numba's launch set the OpenMP thread count it shares with torch to NUMBA_NUM_THREADS: a user's
    # torch.set_num_threads(3) became 4 for the rest of the process (training included).
    code = (
        "import torch, torch_lwlrap as T\n"
        "torch.set_num_threads(3)\n"
        "g = torch.Generator().manual_seed(0)\n"
        "p, y = torch.rand(4000, 527, generator=g), torch.rand(4000, 527, generator=g) < 0.01\n"
        "for _ in range(3): T.multilabel_lwlrap(p, y)\n"
        "from torch_lwlrap import _numba_runtime\n"
        "print(_numba_runtime._threads_started(), torch.get_num_threads())\n"
    )
    environment = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="4")
    environment.pop("TORCH_LWLRAP_ENGINE", None)
    environment.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=environment, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.split() == ["True", "3"], done.stdout


def test_one_torch_thread_keeps_every_compiled_kernel_serial():
    # A kernel that skipped the runner (the bootstrap's once did) would start numba's threads here.
    _run_child("one-thread")


def test_no_module_compiles_a_parallel_kernel_outside_the_runner():
    for path in sorted((ROOT / "torch_lwlrap").rglob("*.py")):
        if path.name == "_numba_runtime.py":
            continue
        source = path.read_text()
        assert "njit" not in source and "parallel=True" not in source, (
            f"{path.relative_to(ROOT)} compiles numba kernels itself: use _numba_runtime's parallel_and_serial "
            f"(called through run) or serial_kernel"
        )


@pytest.mark.parametrize("layer", _layers())
def test_four_threads_at_once_give_the_serial_results(layer):
    out = _run_child("threads", NUMBA_THREADING_LAYER=layer)
    assert "OK" in out


def test_the_callers_numba_thread_count_caps_the_kernels_and_is_left_as_it_was(monkeypatch):
    """A user's own numba.set_num_threads(1) keeps the kernels serial, and a setting the library changes for a call
    is put back after it: the caller's numba code runs on the threads it asked for."""
    if numba.config.NUMBA_NUM_THREADS < 2 or torch.get_num_threads() < 2:
        pytest.skip("needs two threads for numba and torch")
    monkeypatch.setattr(_numba_runtime, "_choice", AlwaysParallel())
    monkeypatch.setattr(_numba_runtime, "PARALLEL_MIN_SCORES_PER_THREAD", 1)
    preds, target = make_case(9, 400, 30)
    want = naive_lwlrap(preds, target)
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        assert _numba_runtime.threads_for(10**9) == 1
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, **TOL)
        assert numba.get_num_threads() == 1
        numba.set_num_threads(2)
        with monkeypatch.context() as patched:  # the library asks for one thread less than the caller's setting
            patched.setattr(torch, "get_num_threads", lambda: 1)
            assert _numba_runtime.threads_for(10**9) == 1
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, **TOL)
        assert numba.get_num_threads() == 2
    finally:
        numba.set_num_threads(before)


def test_numba_with_its_compiler_switched_off_leaves_the_work_to_torch(tmp_path):
    """NUMBA_DISABLE_JIT=1 (numba's debugging switch): every function takes the torch paths, silently under auto."""
    code = (
        "import warnings, torch, torch_lwlrap as T\n"
        "warnings.simplefilter('error')\n"
        "g = torch.Generator().manual_seed(0)\n"
        "p, y = torch.rand(300, 40, generator=g), torch.rand(300, 40, generator=g) < 0.3\n"
        "print(T.multilabel_lwlrap(p, y).item(), T.multilabel_rank_correlation(p, p.flip(1), method='kendall').item(),"
        " T.multilabel_lwlrap_ci(p, y, seed=0).low.item())\n"
        "from torch_lwlrap import _dispatch\n"
        "print(_dispatch.ranking_backend(torch.device('cpu'), torch.float32))\n"
    )
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    env.pop("TORCH_LWLRAP_ENGINE", None)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    values, backend = done.stdout.splitlines()
    assert backend == "None"
    env.pop("NUMBA_DISABLE_JIT")
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                           cwd=Path(__file__).resolve().parents[1])
    assert again.returncode == 0, again.stderr
    assert [float(v) for v in values.split()] == pytest.approx([float(v) for v in again.stdout.split()[:3]], abs=1e-12)
    # forced, the warning names the switch to unset (not an install)
    forced = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import torch, torch_lwlrap as T; "
         "T.multilabel_lwlrap(torch.rand(5, 4), torch.rand(5, 4) < 0.5)"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[1],
        env=dict(env, NUMBA_DISABLE_JIT="1", TORCH_LWLRAP_ENGINE="numba"),
    )
    assert forced.returncode == 0, forced.stderr
    assert "NUMBA_DISABLE_JIT=1" in forced.stderr and "unset NUMBA_DISABLE_JIT" in forced.stderr


def test_serial_and_parallel_variants_give_identical_sums(monkeypatch):
    preds, target = make_case(7, 3000, 61, ignore_index=-1)
    positive, known = target == 1, target != -1
    results = []
    monkeypatch.setattr(_numba_runtime, "_choice", AlwaysParallel())
    for min_scores in (10**12, 1):  # serial variant; parallel with every thread torch allows
        monkeypatch.setattr(_numba_runtime, "PARALLEL_MIN_SCORES_PER_THREAD", min_scores)
        with use_engine("numba"):
            for ties in ("max", "index", "expected"):  # the ranking pass; the counts pass and the compiled rule
                results.append(ranking_sums(preds, positive & known, known, ties=ties))
    serial, parallel = results[:3], results[3:]
    for one, other in zip(serial, parallel):
        for a, b in zip(one, other):
            assert torch.equal(a, b)
    rows = slice(0, 40)
    want = naive_lwlrap(preds[rows], target[rows], ignore_index=-1)
    assert multilabel_lwlrap(preds[rows], target[rows], ignore_index=-1).item() == pytest.approx(want, **TOL)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rank_agreement_kernels_give_the_same_rows_serial_and_parallel(monkeypatch, dtype):
    # Rows in many blocks, each block with its own workspace (sorts, tries, the scan's buffers) on its thread: every
    # row's value must not depend on the variant, and both must equal the references (the suite's other calls are
    # too small to leave the serial variant). Tied rows with +-inf, rows without ties, a row with NaN; the distance
    # at k through the scan (k = 1, 5, 20), its sorted buffer and the sorted rows (k = 40 on 130 labels).
    from tests.reference_ranking import naive_distance, scipy_mean
    from torch_lwlrap import _ltr_numba

    tied = [make_case(seed, 700, 130, dtype=dtype)[0] for seed in (1, 2)]
    distinct = [make_case(seed, 700, 130, dtype=dtype, levels=10**6, infinite=False)[0] for seed in (3, 4)]
    with_nan = [tied[0].clone(), tied[1]]
    with_nan[0][333, 7] = math.nan
    calls = [(_ltr_numba.correlation_rows, method) for method in ("spearman", "kendall")]
    calls += [(_ltr_numba.distance_rows, k) for k in (1, 5, 20, 40)]
    results = []
    monkeypatch.setattr(_numba_runtime, "_choice", AlwaysParallel())
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has one thread here: no parallel variant to compare")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)  # two threads whatever torch was set to
    for min_scores in (10**12, 1):  # the serial variant, then the parallel one on two threads
        monkeypatch.setattr(_numba_runtime, "PARALLEL_MIN_SCORES_PER_THREAD", min_scores)
        results.append([call(*pair, option, check_nan=True) for call, option in calls for pair in (tied, distinct, with_nan)])
    for kernel in (_ltr_numba._correlation_kernel, _ltr_numba._distance_kernel):
        assert kernel.parallel.signatures, "the parallel variant never ran"
    for serial, parallel in zip(*results):
        for one, other in zip(serial, parallel):
            if isinstance(one, torch.Tensor):
                torch.testing.assert_close(one, other, rtol=0, atol=0, equal_nan=True)
            else:
                assert one == other
    rows = slice(0, 60)  # the references loop in Python
    serial = iter(results[0])
    for call, option in calls:
        for pair in (tied, distinct, with_nan):
            got = next(serial)
            assert got[-1] == (pair is with_nan), "NaN found where there is none, or missed"
            a, b = pair[0][rows], pair[1][rows]
            if call is _ltr_numba.distance_rows:
                assert got[0][rows].mean().item() == pytest.approx(naive_distance(a, b, option), **TOL)
            else:
                value, defined = got[0][rows], got[1][rows]
                assert value[defined].mean().item() == pytest.approx(scipy_mean(a, b, option)[0], **TOL)


def test_threads_for_never_exceeds_torch_threads(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert _numba_runtime.threads_for(1 << 40) == 1
        torch.set_num_threads(threads)
        limit = min(threads, numba.config.NUMBA_NUM_THREADS)
        assert _numba_runtime.threads_for(1 << 40) == limit
        small = _numba_runtime.PARALLEL_MIN_SCORES_PER_THREAD * 2 - 1
        assert _numba_runtime.threads_for(small) == 1  # one thread's work: no parallel region
        assert _numba_runtime.threads_for(32 * 527) == 1
    finally:
        torch.set_num_threads(threads)


def test_run_sets_numba_threads_within_torch_threads(monkeypatch):
    # Even when the choice asks for the parallel variant every time, numba runs on at most torch's threads.
    monkeypatch.setattr(_numba_runtime, "_choice", AlwaysParallel())
    monkeypatch.setattr(_numba_runtime, "PARALLEL_MIN_SCORES_PER_THREAD", 1)
    preds, target = make_case(2, 300, 23)
    threads = torch.get_num_threads()
    try:
        for allowed in (1, 2):
            torch.set_num_threads(allowed)
            want = naive_lwlrap(preds, target)
            with use_engine("numba"):
                assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, **TOL)
            # (the threads inside the run: test_the_parallel_variant_runs_on_no_more_threads_than_torch_allows)
    finally:
        torch.set_num_threads(threads)


class _Clock:
    """A stand-in for the ``time`` module whose clock moves only when a fake kernel runs."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


class _FakeVariant:
    """A compiled variant as :func:`_numba_runtime.run` sees it: callable, with numba's ``overloads``. ``seconds``:
    ``[seconds a call]``, or a function of the call's arguments; raises ``error`` where one is set."""

    def __init__(self, clock, name, seconds, calls):
        self.clock, self.name, self.seconds, self.calls, self.overloads = clock, name, seconds, calls, {"sig": 1}
        self.error = None

    def __call__(self, *args):
        if self.error is not None:
            raise self.error
        self.clock.now += self.seconds(*args) if callable(self.seconds) else self.seconds[0]
        self.calls.append((self.name, *args) if args else self.name)
        return self.name


def _fake_runner(monkeypatch, clock, choice):
    """The runner with a fake clock and ``choice``, numba's threads taken as started, its thread count left alone
    (the fake variants use no threads), and a lock of its own."""
    if _numba_runtime.threads_for(1 << 40) < 2:
        pytest.skip("one thread for torch or numba here: the runner takes the serial variant without a choice")
    monkeypatch.setattr(_numba_runtime, "time", clock)
    monkeypatch.setattr(_numba_runtime, "_choice", choice)
    monkeypatch.setattr(_numba_runtime, "_threads_started", lambda: True)
    monkeypatch.setattr(numba, "set_num_threads", lambda n: None)
    monkeypatch.setattr(_numba_runtime, "_parallel_lock", threading.Lock())


def test_run_takes_the_variant_that_was_faster_and_follows_a_change(monkeypatch):
    clock, calls = _Clock(), []
    parallel = _FakeVariant(clock, "parallel", [1.0], calls)
    serial = _FakeVariant(clock, "serial", [3.0], calls)
    kernel = _numba_runtime.ParallelAndSerial(parallel, serial)
    monkeypatch.setattr(_numba_runtime, "time", clock)
    monkeypatch.setattr(_numba_runtime, "_choice", _numba_runtime.SpeedChoice(reprobe_min=4, reprobe_max=16))
    monkeypatch.setattr(_numba_runtime, "_threads_started", lambda: True)
    monkeypatch.setattr(numba, "set_num_threads", lambda n: None)  # the fake variants use no threads
    scores = 1 << 40
    for _ in range(12):
        _numba_runtime.run(kernel, scores)
    # Parallel first, then serial, each twice (the first call of each: a warm-up, not kept); parallel wins, serial is
    # tried again after 4 calls, then after 8.
    assert calls == ["parallel"] * 2 + ["serial"] * 2 + ["parallel"] * 3 + ["serial"] + ["parallel"] * 4
    # The machine gets busy: parallel slows down. Once most of its timings kept (3) are slow, serial takes over.
    parallel.seconds[0] = 10.0
    del calls[:]
    for _ in range(8):
        _numba_runtime.run(kernel, scores)
    assert calls == ["parallel"] * 2 + ["serial", "parallel"] + ["serial"] * 4  # the 4th: a try of parallel
    # Once most timings kept of the variant in use are worse than the other's, it switches without waiting for a try.
    serial.seconds[0] = 20.0
    del calls[:]
    for _ in range(4):
        _numba_runtime.run(kernel, scores)
    assert calls == ["serial"] * 2 + ["parallel"] * 2
    assert not _numba_runtime._parallel_lock.locked()


def test_a_variant_s_cold_first_call_does_not_decide_and_each_workload_is_timed_apart(monkeypatch):
    # A parallel region's first timed call can take 3 times as long as the next ones: kept, against serial's first
    # timing, it handed the choice to the slower serial variant.
    for warmup, expected in ((1, [True] * 6), (0, [False] * 6)):
        choice = _numba_runtime.SpeedChoice(reprobe_min=8, warmup=warmup)
        for parallel, seconds in ((True, 9.0), (True, 1.0), (False, 3.0), (False, 3.0)):
            choice.record("k", parallel, seconds)
        assert [choice.parallel_next("k") for _ in range(6)] == expected, warmup
    # One kernel, two kinds of work (Spearman, Kendall): their timings are kept apart.
    clock, calls = _Clock(), []
    kernel = _numba_runtime.ParallelAndSerial(_FakeVariant(clock, "parallel", [1.0], calls),
                                              _FakeVariant(clock, "serial", [3.0], calls))
    choice = _numba_runtime.SpeedChoice()
    monkeypatch.setattr(_numba_runtime, "time", clock)
    monkeypatch.setattr(_numba_runtime, "_choice", choice)
    monkeypatch.setattr(_numba_runtime, "_threads_started", lambda: True)
    monkeypatch.setattr(numba, "set_num_threads", lambda n: None)
    for workload in ("spearman", "kendall", "spearman"):
        _numba_runtime.run(kernel, 1 << 40, workload=workload)
    assert calls == ["parallel"] * 3  # each workload starts with its own warm-up
    assert len({key[1] for key in choice._keys}) == 2


def test_speed_choice_tries_the_slower_variant_less_and_less_often():
    choice = _numba_runtime.SpeedChoice(reprobe_min=2, reprobe_max=8, kept=3, warmup=0)
    picks = []
    for _ in range(40):
        parallel = choice.parallel_next("key")
        picks.append(parallel)
        choice.record("key", parallel, 5.0 if parallel else 1.0)  # serial is always faster (a busy machine)
    tries = [at for at, parallel in enumerate(picks) if parallel]
    # Parallel, serial, then serial wins: parallel is tried after 2 calls, then after 4, then every 8 (the most).
    assert tries == [0, 3, 7, 15, 23, 31, 39]
    # A try that wins is taken from then on (the machine got quiet: parallel is faster again).
    choice = _numba_runtime.SpeedChoice(reprobe_min=4, warmup=0)
    choice.record("k", True, 1.5)
    choice.record("k", False, 2.0)
    assert [choice.parallel_next("k") for _ in range(4)] == [True, True, True, False]  # the 4th: a try of serial
    choice.record("k", False, 0.5)  # the median of serial's timings, 1.25, is now the lower
    assert [choice.parallel_next("k") for _ in range(4)] == [False, False, False, True]


_THREAD_CAP_CHILD = r"""
import numba, torch
from tests.concurrency_child import AlwaysParallel
from tests.reference import make_case, naive_lwlrap
import torch_lwlrap as T
from torch_lwlrap import _numba_runtime as R
R.PARALLEL_MIN_SCORES_PER_THREAD = 1
R._choice = AlwaysParallel()
torch.set_num_threads(2)
seen = []
class Variant:
    overloads = {}
    def __init__(self, name):
        self.name = name
    def __call__(self):
        seen.append((self.name, numba.get_num_threads()))
        return self.name
kernel = R.ParallelAndSerial(Variant("parallel"), Variant("serial"))
assert R.run(kernel, 1 << 20) == "parallel"
after = numba.get_num_threads()
preds, target = make_case(5, 400, 30)
with T.use_engine("numba"):
    value = T.multilabel_lwlrap(preds, target).item()
assert abs(value - naive_lwlrap(preds, target)) <= 1e-12, value
print(seen, after, numba.get_num_threads(), torch.get_num_threads())
"""


def test_the_parallel_variant_runs_on_no_more_threads_than_torch_allows():
    """NUMBA_NUM_THREADS=4 and ``torch.set_num_threads(2)``, as on a larger machine where a user limits torch: the
    parallel variant runs on 2 of numba's threads, and numba's own count is put back after it. On a machine with as
    many numba threads as torch's (2 cores) nothing in this process could tell: hence the child."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_NUM_THREADS="4", OMP_NUM_THREADS="2")
    env.pop("TORCH_LWLRAP_ENGINE", None)
    done = subprocess.run([sys.executable, "-c", _THREAD_CAP_CHILD], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert done.stdout.splitlines()[0] == "[('parallel', 2)] 4 4 2", done.stdout


def test_a_parallel_variant_that_raises_releases_the_parallel_region_lock(monkeypatch):
    """A kernel call that raises (a MemoryError from a workspace, a KeyboardInterrupt) must not keep the lock: every
    later call of every kernel in the process would run serial, silently."""
    clock, calls = _Clock(), []
    parallel = _FakeVariant(clock, "parallel", [1.0], calls)
    kernel = _numba_runtime.ParallelAndSerial(parallel, _FakeVariant(clock, "serial", [1.0], calls))
    _fake_runner(monkeypatch, clock, AlwaysParallel())
    parallel.error = MemoryError("workspace")
    with pytest.raises(MemoryError):
        _numba_runtime.run(kernel, 1 << 40, 1 << 40)
    assert not _numba_runtime._parallel_lock.locked()
    parallel.error = None
    assert _numba_runtime.run(kernel, 1 << 40, 1 << 40) == "parallel"


def test_each_size_class_keeps_its_own_timings(monkeypatch):
    """Where the parallel variant wins on large passes and loses on small ones (waking threads costs more than a
    small pass), calls of both sizes interleaved each settle on their own faster variant."""
    clock, calls = _Clock(), []
    small, large = 1 << 20, 1 << 34
    parallel = _FakeVariant(clock, "parallel", lambda s: 4e-6 * s if s == small else 1e-9 * s, calls)
    serial = _FakeVariant(clock, "serial", lambda s: 1e-6 * s if s == small else 4e-9 * s, calls)
    kernel = _numba_runtime.ParallelAndSerial(parallel, serial)
    _fake_runner(monkeypatch, clock, _numba_runtime.SpeedChoice(reprobe_min=64, reprobe_max=64))
    for _ in range(30):
        for scores in (small, large):
            _numba_runtime.run(kernel, scores, scores)
    late = calls[-20:]
    assert [name for name, scores in late if scores == small] == ["serial"] * 10, late
    assert [name for name, scores in late if scores == large] == ["parallel"] * 10, late
