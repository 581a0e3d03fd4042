"""Choosing the engine path without code changes (``TORCH_LWLRAP_ENGINE``) and the Triton path's fallback.

GPU failures are simulated on the CPU: ``_triton_kernel.GPU_DEVICE_TYPES`` gains "cpu" and ``_capability``
reports a GPU generation, so CPU tensors take the Triton path's launch; the kernel then fails as it would on a
user's machine (a compile error, too few resources, no driver), or Triton is missing, or the GPU is too old. Every
case checks the warning, that the batch is ranked on the torch path and that the values equal the naive formula.
"""

from __future__ import annotations

import asyncio
import math
import threading
import warnings

import pytest
import torch

from tests.reference import make_case, naive_lrap, naive_lwlrap
from torch_lwlrap import EngineFallbackWarning, MultilabelLWLRAP, multilabel_lrap, multilabel_lwlrap
from torch_lwlrap import _dispatch, _numba_kernel, _numba_one_pass, _ranking
from torch_lwlrap._ranking import ENGINE_VARIABLE, ENGINES, get_engine, use_engine

TOL = dict(rel=1e-12, abs=1e-12)


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    """Each test starts as a fresh process would: no Triton failure seen, no warning given, no variable set."""
    monkeypatch.setattr(_dispatch, "_triton_failure", None)
    monkeypatch.setattr(_dispatch, "_warned", set())
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)


def _spy_paths(monkeypatch, with_thread=False):
    """Record which ranking path runs: a list that receives "sort", "count" or "numba" per call (with
    ``with_thread``: ``(the calling thread's name, path)``)."""
    calls = []
    for name in ("_sort_path", "_count_path"):
        original = getattr(_ranking, name)

        def spy(*args, _original=original, _name=name[1:-5], **kwargs):
            calls.append((threading.current_thread().name, _name) if with_thread else _name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(_ranking, name, spy)
    # The numba path ranks a batch with its chunked passes, or in one pass over each row: either is "numba".
    for module, name in ((_numba_kernel, "ranking_sums_numba"), (_numba_one_pass, "one_pass_sums")):
        original = getattr(module, name)

        def numba_spy(*args, _original=original, **kwargs):
            calls.append((threading.current_thread().name, "numba") if with_thread else "numba")
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, numba_spy)
    return calls


# --- TORCH_LWLRAP_ENGINE ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["sort", "count", "numba", " Sort ", "auto", ""])
def test_variable_selects_the_path(monkeypatch, value):
    calls = _spy_paths(monkeypatch)
    monkeypatch.setenv(ENGINE_VARIABLE, value)
    preds, target = make_case(3, 40, 9, ignore_index=-1)
    got = multilabel_lwlrap(preds, target, ignore_index=-1)
    assert got.item() == pytest.approx(naive_lwlrap(preds, target, ignore_index=-1), **TOL)
    wanted = value.strip().lower() or "auto"
    assert get_engine() == wanted
    if wanted == "auto":
        wanted = "numba" if _numba_kernel.numba is not None else None
    if wanted is not None:
        assert calls and set(calls) == {wanted}


def test_use_engine_takes_precedence_over_the_variable(monkeypatch):
    calls = _spy_paths(monkeypatch)
    monkeypatch.setenv(ENGINE_VARIABLE, "count")
    preds, target = make_case(4, 30, 7)
    with use_engine("sort"):
        assert get_engine() == "sort"
        got = multilabel_lrap(preds, target)
    assert calls == ["sort"]
    assert get_engine() == "count"
    assert got.item() == pytest.approx(naive_lrap(preds, target), **TOL)


def test_use_engine_is_restored_after_an_exception_and_when_nested(monkeypatch):
    """A batch that raises inside ``use_engine`` (a training step's error caught by the loop) must not leave the
    engine forced for the rest of the process: later calls take the variable's setting again."""
    from torch_lwlrap._engine_config import forced_chunk_elements

    monkeypatch.setenv(ENGINE_VARIABLE, "count")
    calls = _spy_paths(monkeypatch)
    preds, target = make_case(11, 30, 9)
    with pytest.raises(ValueError):
        with use_engine("sort"):
            multilabel_lwlrap(preds[:, :3], target)  # shapes disagree: the library raises inside the block
    assert get_engine() == "count"
    with use_engine("sort"):
        with pytest.raises(KeyError):
            with use_engine("count", chunk_elements=7):
                raise KeyError("the user's own error")
        assert get_engine() == "sort" and forced_chunk_elements() is None
    calls.clear()
    assert multilabel_lwlrap(preds, target).item() == pytest.approx(naive_lwlrap(preds, target), **TOL)
    assert set(calls) == {"count"}


def test_use_engine_in_one_thread_leaves_other_threads_on_their_own_setting(monkeypatch):
    """``use_engine`` holds in its own thread only: a thread that forces "count" for a while moves neither another
    thread's "sort" block nor its "auto", and every value stays exact."""
    calls = _spy_paths(monkeypatch, with_thread=True)
    preds, target = make_case(12, 60, 11)
    want = naive_lwlrap(preds, target)
    entered, checked = threading.Event(), threading.Event()
    seen, errors = {}, []

    def forcing():
        try:
            with use_engine("count"):
                entered.set()
                checked.wait(30)
                seen["forcing"] = get_engine()
                seen["forcing value"] = multilabel_lwlrap(preds, target).item()
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
            entered.set()

    worker = threading.Thread(target=forcing, name="forcing")
    worker.start()
    try:
        assert entered.wait(30)
        seen["main auto"] = get_engine()
        with use_engine("sort"):
            seen["main sort"] = get_engine()
            seen["main value"] = multilabel_lwlrap(preds, target).item()
    finally:
        checked.set()
        worker.join(60)
    assert not errors, errors
    assert (seen["main auto"], seen["main sort"], seen["forcing"]) == ("auto", "sort", "count"), seen
    assert seen["main value"] == pytest.approx(want, **TOL) and seen["forcing value"] == pytest.approx(want, **TOL)
    assert ("MainThread", "sort") in calls and ("forcing", "count") in calls
    assert ("MainThread", "count") not in calls and ("forcing", "sort") not in calls, calls
    assert get_engine() == "auto"


def test_use_engine_is_local_to_an_asyncio_task():
    """Two asyncio tasks (one thread, a context each): a task suspended inside ``use_engine("sort")`` leaves the
    other on its own setting."""
    preds, target = make_case(13, 20, 7)

    async def forcing(entered, release):
        with use_engine("sort"):
            entered.set()
            await release.wait()
            return get_engine()

    async def other(entered, release):
        await entered.wait()
        engine, value = get_engine(), multilabel_lrap(preds, target).item()
        release.set()
        return engine, value

    async def both():
        entered, release = asyncio.Event(), asyncio.Event()
        return await asyncio.gather(forcing(entered, release), other(entered, release))

    forced, (engine, value) = asyncio.run(both())
    assert (forced, engine) == ("sort", "auto")
    assert value == pytest.approx(naive_lrap(preds, target), **TOL)
    assert get_engine() == "auto"


def test_unknown_variable_value_is_a_clear_error_and_leaves_the_state(monkeypatch):
    metric = MultilabelLWLRAP(num_labels=6)
    preds, target = make_case(5, 20, 6)
    metric.update(preds, target)
    before = {name: value.clone() for name, value in metric.metric_state.items()}
    monkeypatch.setenv(ENGINE_VARIABLE, "cuda")
    with pytest.raises(ValueError) as error:
        metric.update(preds, target)
    message = str(error.value)
    assert ENGINE_VARIABLE in message and "'cuda'" in message
    assert all(name in message for name in ENGINES)
    with pytest.raises(ValueError, match=ENGINE_VARIABLE):
        multilabel_lwlrap(preds, target)
    for name, value in metric.metric_state.items():
        assert torch.equal(value, before[name]), name
    monkeypatch.delenv(ENGINE_VARIABLE)
    assert metric.compute().item() == pytest.approx(naive_lwlrap(preds, target), **TOL)


# --- The Triton path's fallback ----------------------------------------------------------------------------------


@pytest.fixture
def triton_kernel(monkeypatch):
    """The Triton module with CPU tensors taken for GPU ones (a Volta-or-newer GPU), and the "triton" path forced
    through the environment variable."""
    from torch_lwlrap import _triton_kernel as kernel  # imports without Triton: its host code is plain torch

    if getattr(kernel, "_INTERPRETED", False):
        pytest.skip("Triton's interpreter runs the kernel on CPU tensors in this process")
    monkeypatch.setattr(kernel, "GPU_DEVICE_TYPES", {"cuda", "cpu"})
    monkeypatch.setattr(kernel, "_capability", lambda device: (9, 0))
    monkeypatch.setenv(ENGINE_VARIABLE, "triton")
    return kernel


@pytest.fixture
def needs_triton():
    """Skip where Triton is not installed: the case replaces or launches the real kernels, or raises Triton's errors."""
    pytest.importorskip("triton", reason="needs Triton (pip install triton): the case uses the real kernels")


class FailingKernel:
    """A Triton kernel whose launch raises ``error``; counts its launches."""

    def __init__(self, error):
        self.error = error
        self.launches = 0

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.launches += 1
            raise self.error

        return launch


def _compile_error():
    import ast

    from triton.compiler.errors import CompilationError

    return CompilationError("def _rows_kernel(...): ...", ast.parse("x").body[0], "unsupported operation")


def _out_of_resources():
    from triton.runtime.errors import OutOfResources

    return OutOfResources(232448, 101376, "shared memory")


def _check_batches_fall_back(preds_target_pairs, cause, launches=None):
    """The first batch warns (naming ``cause``) and every batch equals the naive values; later ones do not warn."""
    (preds, target), *rest = preds_target_pairs
    with pytest.warns(EngineFallbackWarning, match=cause) as record:
        first = multilabel_lwlrap(preds, target, ignore_index=-1)
    assert len(record) == 1
    message = str(record[0].message)
    assert "exact" in message and "TORCH_LWLRAP_ENGINE" in message or "pip install" in message
    assert record[0].filename == __file__  # points at the caller's line
    assert first.item() == pytest.approx(naive_lwlrap(preds, target, ignore_index=-1), **TOL)
    calls_after_first = None if launches is None else launches()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for preds, target in rest:
            got = multilabel_lwlrap(preds, target, ignore_index=-1)
            assert got.item() == pytest.approx(naive_lwlrap(preds, target, ignore_index=-1), **TOL)
            got = multilabel_lrap(preds, target, ignore_index=-1, ties="index")
            assert got.item() == pytest.approx(naive_lrap(preds, target, ties="index", ignore_index=-1), **TOL)
    if launches is not None:
        assert launches() == calls_after_first, "the failed kernel was launched again"


CASES = [make_case(seed, n, c, ignore_index=-1) for seed, (n, c) in enumerate([(40, 9), (33, 17), (64, 5)])]


@pytest.mark.parametrize(
    "make_error, cause",
    [(_compile_error, "CompilationError"), (_out_of_resources, "OutOfResources: out of resource: shared memory")],
    ids=["compile", "launch-out-of-resources"],
)
@pytest.mark.usefixtures("needs_triton")
def test_kernel_failure_warns_once_and_ranks_on_torch(triton_kernel, monkeypatch, make_error, cause):
    failing = FailingKernel(make_error())
    monkeypatch.setattr(triton_kernel, "_rows_kernel", failing)
    monkeypatch.setattr(triton_kernel, "_tiled_kernel", failing)
    _check_batches_fall_back(CASES, cause, launches=lambda: failing.launches)
    assert failing.launches == 1
    assert isinstance(_dispatch._triton_failure, type(failing.error))


@pytest.mark.usefixtures("needs_triton")
def test_driver_mismatch_the_real_launch_fails_without_a_gpu(triton_kernel):
    # No kernel replaced: Triton itself refuses to launch on a machine without a driver for the tensors' device.
    _check_batches_fall_back(CASES, "Triton kernel failed on cpu")
    assert _dispatch._triton_failure is not None


def test_triton_missing(triton_kernel, monkeypatch):
    monkeypatch.setattr(triton_kernel, "triton", None)
    _check_batches_fall_back(CASES, "Triton is not installed.*pip install triton")


def test_triton_failing_to_import_warns_even_under_auto(triton_kernel, monkeypatch):
    monkeypatch.setattr(triton_kernel, "triton", None)
    monkeypatch.setattr(triton_kernel, "_IMPORT_ERROR", "ImportError: libcuda.so.1: cannot open shared object file")
    _check_batches_fall_back(CASES, "failed to import \\(ImportError: libcuda.so.1")
    assert triton_kernel.unavailable_reason(torch.device("cuda")).startswith("Triton is installed but failed")


@pytest.mark.usefixtures("needs_triton")
def test_gpu_older_than_volta(triton_kernel, monkeypatch):
    monkeypatch.setattr(triton_kernel, "_capability", lambda device: (6, 0))
    failing = FailingKernel(AssertionError("the kernel must not be launched on a GPU older than Volta"))
    monkeypatch.setattr(triton_kernel, "_rows_kernel", failing)
    monkeypatch.setattr(triton_kernel, "_tiled_kernel", failing)
    assert not triton_kernel.is_available("cpu")
    _check_batches_fall_back(CASES, "compute capability 6.0 is older than Volta \\(7.0\\)")
    assert failing.launches == 0
    assert _dispatch._triton_failure is None


@pytest.mark.usefixtures("needs_triton")
def test_a_kernel_that_returns_is_never_second_guessed(triton_kernel, monkeypatch):
    # Fallback happens on an exception only, never on the values: a launch that returns is taken as it is.
    launched = []

    class Succeeding:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append(grid)

    monkeypatch.setattr(triton_kernel, "_rows_kernel", Succeeding())
    monkeypatch.setattr(triton_kernel, "_tiled_kernel", Succeeding())
    preds, target = CASES[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # The fake launch writes nothing: the result is whatever the workspaces held, NaN when they held zeros.
        warnings.filterwarnings("ignore", "lwlrap is undefined without any positive label", UserWarning)
        multilabel_lwlrap(preds, target, ignore_index=-1)
    assert launched and _dispatch._triton_failure is None


@pytest.mark.usefixtures("needs_triton")
def test_metric_in_a_training_loop_survives_a_failing_kernel(triton_kernel, monkeypatch):
    # The user's form: a metric updated batch after batch (forward returns the batch value) while the GPU kernel
    # cannot launch; one warning, and the epoch value over all batches equals the naive one.
    failing = FailingKernel(_out_of_resources())
    monkeypatch.setattr(triton_kernel, "_rows_kernel", failing)
    monkeypatch.setattr(triton_kernel, "_tiled_kernel", failing)
    metric = MultilabelLWLRAP(num_labels=9, ignore_index=-1)
    batches = [make_case(10 + step, 16, 9, ignore_index=-1) for step in range(4)]
    logits = [preds.float().requires_grad_() for preds, _ in batches]
    with pytest.warns(EngineFallbackWarning) as record:
        for scores, (_, target) in zip(logits, batches):
            value = metric(scores, target)
            assert not value.requires_grad
            assert value.item() == pytest.approx(naive_lwlrap(scores.detach(), target, ignore_index=-1), **TOL)
    assert len(record) == 1 and failing.launches == 1
    all_preds = torch.cat([scores.detach() for scores in logits])
    all_target = torch.cat([target for _, target in batches])
    assert metric.compute().item() == pytest.approx(naive_lwlrap(all_preds, all_target, ignore_index=-1), **TOL)
    assert not math.isnan(metric.compute().item())


_BROKEN_NUMBA_CHILD = r"""
import json, warnings, torch, torch_lwlrap
from tests.reference import make_case, naive_lwlrap
preds, target = make_case(3, 40, 9)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    values = [torch_lwlrap.multilabel_lwlrap(preds, target).item() for _ in range(2)]
print(json.dumps({"values": values, "expected": naive_lwlrap(preds, target),
                  "warnings": [str(w.message) for w in caught]}))
"""


@pytest.mark.parametrize("engine", ["auto", "numba"])
def test_an_installed_numba_that_fails_to_import_is_named_with_its_error_not_as_missing(engine):
    """NUMBA_NUM_THREADS=0 makes `import numba` raise a ValueError: the warning had said "numba is not installed"
    (forced), or nothing at all (auto, as for a Triton that fails to import, which warns)."""
    pytest.importorskip("numba")
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    environ = dict(os.environ, NUMBA_NUM_THREADS="0", **{ENGINE_VARIABLE: engine})
    done = subprocess.run([sys.executable, "-c", _BROKEN_NUMBA_CHILD], capture_output=True, text=True, env=environ,
                          cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["values"] == pytest.approx([result["expected"]] * 2, **TOL)
    assert len(result["warnings"]) == 1, result["warnings"]  # once per cause
    message = result["warnings"][0]
    assert f"the {engine} engine cannot rank cpu tensors: numba fails to import (ValueError: Number of threads" in message
    assert "not installed" not in message and "pip install numba`" not in message
    assert "make `import numba` work" in message
    # the path it names is the one it takes: forced, the sort path; under auto, the one the label density picks
    assert ("torch sort path" in message) == (engine == "numba"), message
    assert ("torch path that suits each batch (sort or count)" in message) == (engine == "auto"), message


def test_a_failing_gpu_kernel_warns_once_and_ranks_on_torch_without_triton_installed(monkeypatch):
    """The fallback tests above need Triton (they skip without it): here the Triton backend accepts CPU tensors and
    its launch raises, with no Triton at all, so that a silent fallback fails everywhere."""
    from torch_lwlrap import _triton_kernel

    monkeypatch.setattr(_triton_kernel, "unavailable_reason", lambda device, dtype=None: None)
    launches = []

    def failing(*args, **kwargs):
        launches.append(1)
        raise RuntimeError("no driver for the test")

    monkeypatch.setattr(_triton_kernel, "ranking_sums_triton", failing)
    preds, target = make_case(14, 40, 9, ignore_index=-1)
    want = naive_lwlrap(preds, target, ignore_index=-1)
    with use_engine("triton"):
        with pytest.warns(EngineFallbackWarning, match="no driver for the test") as record:
            first = multilabel_lwlrap(preds, target, ignore_index=-1)
        assert len(record) == 1 and record[0].filename == __file__
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            again = multilabel_lwlrap(preds, target, ignore_index=-1)
    assert first.item() == pytest.approx(want, **TOL) and again.item() == pytest.approx(want, **TOL)
    assert len(launches) == 1, "the failed kernel was launched again"


def test_no_compiled_backend_is_named_for_scores_it_refuses():
    """The dtype is part of each backend's reason: ``ranking_backend`` (which doctor reports) names no backend for
    integer or complex scores (the input gate refuses them before ranking, so only this direct call sees it)."""
    pytest.importorskip("numba")
    for engine in ("auto", "numba"):
        assert _dispatch.ranking_backend("cpu", torch.float32, engine) == "numba"
        assert _dispatch.ranking_backend("cpu", torch.int64, engine) is None
        assert _dispatch.ranking_backend("cpu", torch.complex64, engine) is None
