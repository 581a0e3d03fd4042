"""The CPU engine among other processes and threads: forked children, concurrent calls, per-thread overrides.

Forks and concurrent calls run in child interpreters (``tests/concurrency_child.py``): a child killed by GNU OpenMP
after a fork, or aborted by numba's workqueue layer on concurrent use, fails its test instead of taking pytest down.
Every child compares its values with the naive formula (``tests/reference.py``) and with the serial results.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from tests.reference import make_case, naive_lrap, naive_lwlrap
from torch_lwlrap import multilabel_lrap, multilabel_lwlrap
from torch_lwlrap._ranking import get_engine, ranking_sums, use_engine

numba = pytest.importorskip("numba")
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


def test_serial_and_parallel_variants_give_identical_sums(monkeypatch):
    preds, target = make_case(7, 3000, 61, ignore_index=-1)
    positive, known = target == 1, target != -1
    results = []
    monkeypatch.setattr(_numba_runtime, "_idle_cores", lambda: 64)
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


def test_threads_for_never_exceeds_torch_threads_nor_the_idle_cores(monkeypatch):
    threads = torch.get_num_threads()
    monkeypatch.setattr(_numba_runtime, "_idle_cores", lambda: 64)
    try:
        torch.set_num_threads(1)
        assert _numba_runtime.threads_for(1 << 40) == 1
        torch.set_num_threads(threads)
        limit = min(threads, numba.config.NUMBA_NUM_THREADS)
        assert _numba_runtime.threads_for(1 << 40) == limit
        small = _numba_runtime.PARALLEL_MIN_SCORES_PER_THREAD * 2 - 1
        assert _numba_runtime.threads_for(small) == 1  # one thread's work: no parallel region
        assert _numba_runtime.threads_for(32 * 527) == 1
        for idle in (1, 0, -7):  # every core busy: serial, whatever the size
            monkeypatch.setattr(_numba_runtime, "_idle_cores", lambda: idle)
            assert _numba_runtime.threads_for(1 << 40) == 1
    finally:
        torch.set_num_threads(threads)


def test_idle_cores_reads_the_running_tasks(monkeypatch, tmp_path):
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    loadavg = tmp_path / "loadavg"
    monkeypatch.setattr(_numba_runtime, "_LOADAVG", str(loadavg))
    for running, want in ((1, cores), (cores + 3, -2)):  # the running count includes the calling thread
        loadavg.write_text(f"0.50 0.40 0.30 {running}/321 4567\n")
        assert _numba_runtime._idle_cores() == want
    loadavg.unlink()
    assert _numba_runtime._idle_cores() == cores  # no such file (not Linux): the cores are taken as free
