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
from torch_lwlrap import _numba_kernel  # noqa: E402

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


@pytest.mark.parametrize("layer", _layers())
def test_four_threads_at_once_give_the_serial_results(layer):
    out = _run_child("threads", NUMBA_THREADING_LAYER=layer)
    assert "OK" in out


def test_serial_and_parallel_variants_give_identical_sums(monkeypatch):
    preds, target = make_case(7, 3000, 61, ignore_index=-1)
    positive, known = target == 1, target != -1
    results = []
    for min_scores in (10**12, 1):  # serial variant; parallel with every thread torch allows
        monkeypatch.setattr(_numba_kernel, "PARALLEL_MIN_SCORES_PER_THREAD", min_scores)
        with use_engine("numba"):
            for ties in ("max", "index"):
                results.append(ranking_sums(preds, positive & known, known, ties=ties))
    serial, parallel = results[:2], results[2:]
    for one, other in zip(serial, parallel):
        for a, b in zip(one, other):
            assert torch.equal(a, b)
    rows = slice(0, 40)
    want = naive_lwlrap(preds[rows], target[rows], ignore_index=-1)
    assert multilabel_lwlrap(preds[rows], target[rows], ignore_index=-1).item() == pytest.approx(want, **TOL)


def test_threads_for_never_exceeds_torch_threads(monkeypatch):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert _numba_kernel.threads_for(1 << 40) == 1
        torch.set_num_threads(threads)
        limit = min(threads, numba.config.NUMBA_NUM_THREADS)
        assert _numba_kernel.threads_for(1 << 40) == limit
        small = _numba_kernel.PARALLEL_MIN_SCORES_PER_THREAD * 2 - 1
        assert _numba_kernel.threads_for(small) == 1  # one thread's work: no parallel region
        assert _numba_kernel.threads_for(32 * 527) == 1
    finally:
        torch.set_num_threads(threads)


def test_use_engine_is_per_thread():
    # Two threads interleave their overrides; neither leaks into the other, nor into the main thread.
    steps = threading.Barrier(2)
    seen, errors = {}, []
    preds, target = make_case(11, 30, 8)

    def worker(name, engine, first):
        try:
            if not first:
                steps.wait()  # enter second
            with use_engine(engine, chunk_elements=64):
                if first:
                    steps.wait()
                steps.wait()  # both inside
                seen[name, "inside"] = get_engine()
                seen[name, "value"] = multilabel_lrap(preds, target).item()
                steps.wait()
                if not first:
                    steps.wait()  # leave second
            if first:
                steps.wait()
            seen[name, "after"] = get_engine()
        except BaseException as error:  # noqa: BLE001
            errors.append(error)

    threads = [
        threading.Thread(target=worker, args=("a", "sort", True)),
        threading.Thread(target=worker, args=("b", "count", False)),
    ]
    with use_engine("numba"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert get_engine() == "numba"
    assert not errors, errors
    assert seen["a", "inside"] == "sort" and seen["b", "inside"] == "count"
    assert seen["a", "after"] == "auto" and seen["b", "after"] == "auto"
    assert get_engine() == "auto"
    want = naive_lrap(preds, target)
    assert seen["a", "value"] == pytest.approx(want, **TOL) and seen["b", "value"] == pytest.approx(want, **TOL)
