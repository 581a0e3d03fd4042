"""The one dispatch: every backend says why it cannot serve some tensors, and the dispatch alone picks from those
reasons. Each test makes one backend give a reason (as a missing library, an old GPU or a foreign device would) and
checks that every caller follows: the ranking, the label counts, the ``"expected"`` rule and the bootstrap weights
move to their torch code, a forced engine warns with the backend's own reason, and every value stays exact
(naive references written from the formulas, in tests/reference.py)."""

from __future__ import annotations

import warnings

import pytest
import torch

import torch_lwlrap
from torch_lwlrap import (
    _bootstrap_kernel,
    _dispatch,
    _numba_counts,
    _numba_kernel,
    _numba_one_pass,
    _numba_rules,
    _triton_kernel,
)
from torch_lwlrap._engine_config import ENGINE_VARIABLE, use_engine

from .reference import make_case, naive_lwlrap

HAS_NUMBA = _numba_kernel.numba is not None
needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (pip install numba: the cpu extra)")


@pytest.fixture(autouse=True)
def fresh_process_state(monkeypatch):
    monkeypatch.setattr(_dispatch, "_triton_failure", None)
    monkeypatch.setattr(_dispatch, "_warned", set())
    monkeypatch.delenv(ENGINE_VARIABLE, raising=False)


def _refuse(monkeypatch, backend, reason="a reason given by the test"):
    monkeypatch.setattr(backend, "unavailable_reason", lambda device, dtype=None: reason)


def _calls(monkeypatch, module, name):
    calls = []
    original = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_reasons_name_every_backend():
    found = _dispatch.reasons("cpu", torch.float32)
    assert set(found) == {"numba", "triton", "sort", "count"}
    assert found["sort"] is None and found["count"] is None
    assert (found["numba"] is None) == HAS_NUMBA
    if not getattr(_triton_kernel, "_INTERPRETED", False):
        assert found["triton"] == "the kernel ranks CUDA tensors, not cpu ones"
    assert _dispatch.reasons("meta")["numba"] == "the numba kernels take CPU tensors, not meta ones"
    assert "int64" in _numba_kernel.unavailable_reason("cpu", torch.int64)


@pytest.mark.parametrize(
    "engine, device, wanted",
    [("auto", "cpu", "numba"), ("numba", "cpu", "numba"), ("sort", "cpu", None), ("count", "cpu", None),
     ("auto", "meta", None), ("numba", "meta", None), ("triton", "meta", None)],
)
def test_the_backend_each_engine_takes(engine, device, wanted):
    if wanted == "numba" and not HAS_NUMBA:
        wanted = None
    assert _dispatch.ranking_backend(device, torch.float32, engine) == wanted
    with use_engine(engine):
        assert _dispatch.ranking_backend(device, torch.float32) == wanted


def test_the_torch_path_auto_picks_by_density_on_the_cpu_only():
    dense, sparse = torch.full((527,), 20_000 * 100), torch.full((527,), 20)
    assert _dispatch.torch_path("auto", "cpu", 20_000, 527, dense) == "sort"
    assert _dispatch.torch_path("auto", "cpu", 20_000, 527, sparse) == "count"
    assert _dispatch.torch_path("auto", "meta", 20_000, 527, sparse) == "sort"  # no sync off the CPU
    assert _dispatch.torch_path("numba", "cpu", 20_000, 527, sparse) == "sort"  # a compiled engine that cannot run
    assert _dispatch.torch_path("count", "cpu", 20_000, 527, dense) == "count"


def _numba_ranking_spies(monkeypatch):
    """Spies on both of the numba backend's ranking entries: the one pass over each row (plain batches, ties "max"
    and "index") and the ranking with a separate value check (the rest)."""
    return [_calls(monkeypatch, _numba_one_pass, "one_pass_sums"),
            _calls(monkeypatch, _numba_kernel, "ranking_sums_numba")]


@needs_numba
def test_a_reason_moves_auto_to_the_torch_paths_silently(monkeypatch):
    spies = _numba_ranking_spies(monkeypatch)
    preds, target = make_case(5, 50, 12)
    want = naive_lwlrap(preds, target)
    assert torch_lwlrap.multilabel_lwlrap(preds, target).item() == pytest.approx(want, abs=1e-12)
    assert any(spies)  # without a reason, auto ranks these with numba: the spies see it
    for spy in spies:
        spy.clear()
    _refuse(monkeypatch, _numba_kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # silently
        assert torch_lwlrap.multilabel_lwlrap(preds, target).item() == pytest.approx(want, abs=1e-12)
    assert not any(spies)


@needs_numba
def test_a_forced_engine_warns_with_the_backends_own_reason(monkeypatch):
    _refuse(monkeypatch, _numba_kernel, "the kernel is switched off by the test")
    preds, target = make_case(5, 50, 12)
    with use_engine("numba"), pytest.warns(torch_lwlrap.EngineFallbackWarning) as record:
        got = torch_lwlrap.multilabel_lwlrap(preds, target)
        torch_lwlrap.multilabel_lwlrap(preds, target)  # once per cause
    assert got.item() == pytest.approx(naive_lwlrap(preds, target), abs=1e-12)
    assert len(record) == 1
    assert "numba engine cannot rank cpu tensors: the kernel is switched off by the test" in str(record[0].message)


@needs_numba
def test_the_counts_follow_their_backend(monkeypatch):
    preds, target = make_case(6, 40, 12)
    expected = torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    counted = _calls(monkeypatch, _numba_counts, "label_counts_numba")
    torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    assert counted
    counted.clear()
    _refuse(monkeypatch, _numba_counts)
    got = torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    assert got.item() == pytest.approx(expected.item(), abs=1e-12)
    assert torch_lwlrap.tie_report(preds, target).label_count == int(target.sum())
    assert not counted


@needs_numba
def test_the_expected_rule_follows_its_backend(monkeypatch):
    preds, target = make_case(6, 40, 12)
    expected = torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    evaluated = _calls(monkeypatch, _numba_rules, "expected_precision")
    torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    assert evaluated
    evaluated.clear()
    _refuse(monkeypatch, _numba_rules)
    got = torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    assert got.item() == pytest.approx(expected.item(), abs=1e-12)
    assert not evaluated


@needs_numba
def test_the_bootstrap_weights_follow_their_backend(monkeypatch):
    preds, target = make_case(40, 12, 10)
    drawn = _calls(monkeypatch, _bootstrap_kernel, "class_sums_numba")
    compiled = torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=50, seed=3)
    assert drawn
    drawn.clear()
    _refuse(monkeypatch, _bootstrap_kernel)
    in_torch = torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=50, seed=3)
    assert not drawn
    # The same weights either way: the intervals agree to rounding (the torch path adds in another order).
    for a, b in zip(compiled, in_torch):
        assert torch.allclose(a, b, rtol=0, atol=1e-12)


def test_a_torch_engine_keeps_every_step_in_torch(monkeypatch):
    spies = [
        *_numba_ranking_spies(monkeypatch),
        _calls(monkeypatch, _numba_counts, "label_counts_numba"),
        _calls(monkeypatch, _numba_rules, "expected_precision"),
        _calls(monkeypatch, _bootstrap_kernel, "class_sums_numba"),
    ]
    preds, target = make_case(30, 20, 10)
    with use_engine("sort"):
        for ties in ("max", "index", "expected"):
            torch_lwlrap.multilabel_lwlrap(preds, target, ties=ties)
            torch_lwlrap.multilabel_lrap(preds, target, ties=ties)
        torch_lwlrap.tie_report(preds, target)
        torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=50)
        for name in ("counts", "rules", "bootstrap"):
            assert not _dispatch.compiled_cpu_pass(name, "cpu")
    assert not any(spies)
    if HAS_NUMBA:  # and the spies do see the compiled steps where the engine is auto
        torch_lwlrap.multilabel_lwlrap(preds, target)
        torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
        assert spies[0] and spies[2] and spies[3]


# --- The chunk budgets: one config, each under its own name, a forced size honoured by every one ----------------


def test_every_budget_has_its_own_name_and_a_forced_size_replaces_each():
    from torch_lwlrap import _engine_config

    values = {name: getattr(_engine_config, name) for name in _engine_config.BUDGETS}
    assert len(values) == 8 and all(isinstance(v, int) and v > 0 for v in values.values())
    for name in _engine_config.BUDGETS[1:]:
        assert _engine_config.chunk_elements(name) == values[name]
        with use_engine("auto", chunk_elements=123):
            assert _engine_config.chunk_elements(name) == 123
    with pytest.raises(ValueError, match="INPUT_CHUNK_BYTES"):
        _engine_config.chunk_elements("INPUT_CHUNK_BYTES")


@needs_numba
def test_the_counts_pass_honours_a_forced_chunk(monkeypatch):
    """The compiled counts convert a float16 batch a chunk of rows at a time: the forced size sets the chunk."""
    converted = []
    original = torch.Tensor.to

    def spy(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.dtype == torch.float16 and out.dtype == torch.float32:
            converted.append(self.shape[0])
        return out

    preds, target = make_case(7, 64, 10)
    preds = preds.clamp(-3, 3).half()
    expected = torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    monkeypatch.setattr(torch.Tensor, "to", spy)
    with use_engine("numba", chunk_elements=10 * 8):
        got = torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
    assert got.item() == pytest.approx(expected.item(), abs=1e-12)
    assert converted and max(converted) <= 8
