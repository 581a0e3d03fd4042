"""Checkpoints carry the options their states were made with; collections never merge metrics whose options differ;
``k`` beyond the number of labels costs nothing more than ``k = C``.

Every refused checkpoint is refused through ``metric.load_state_dict``, through a parent module (``strict`` or not)
and through Lightning, with one line naming both sets of options; every accepted one resumes to the value of an
uninterrupted run, which is checked against the functions on all data and a naive reference.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Dict, List, Tuple

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torchmetrics import MetricCollection

from tests.reference import naive_lwlrap
from tests.reference_ranking import naive_coverage_error, naive_retrieval
from torch_lwlrap import (
    MultilabelCoverageError,
    MultilabelKendallDistanceAtK,
    MultilabelLRAP,
    MultilabelLWLRAP,
    MultilabelNDCG,
    MultilabelOneError,
    MultilabelRankCorrelation,
    MultilabelRankingLoss,
    MultilabelRankingMetrics,
    MultilabelRetrievalAtK,
    MultilabelTieReport,
    multilabel_coverage_error,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_one_error,
    multilabel_ranking_loss,
    multilabel_retrieval_at_k,
)
from torch_lwlrap._checks import TIES
from torch_lwlrap.metrics._tags import PREVIOUS_LAYOUT, TAG_LAYOUT
from torch_lwlrap._rank_reductions import RANKING_METRICS

C = 6

# class, options of the checkpoint; then (option, value of the loading metric) pairs it must refuse.
CASES: List[Tuple[type, Dict[str, Any], List[Tuple[str, Any]]]] = [
    (
        MultilabelLWLRAP,
        dict(num_labels=C, ties="max"),
        [("ties", "expected"), ("ignore_index", -1), ("num_labels", C + 1), ("num_bootstrap", 8)],
    ),
    (
        MultilabelLWLRAP,
        dict(num_labels=C, num_bootstrap=8, bootstrap_seed=1),
        [("num_bootstrap", 4), ("num_bootstrap", 0), ("bootstrap_seed", 2), ("bootstrap_seed", 2**63 - 1)],
    ),
    (
        MultilabelLRAP,
        dict(num_labels=C, ties="index", ignore_index=-1),
        [("ties", "max"), ("ignore_index", None), ("ignore_index", 2), ("num_labels", C - 1), ("num_bootstrap", 4)],
    ),
    (
        MultilabelLRAP,
        dict(num_labels=C, num_bootstrap=4, bootstrap_seed=2**62),
        [("num_bootstrap", 5), ("bootstrap_seed", 2**62 + 1), ("num_bootstrap", 0)],
    ),
    (MultilabelTieReport, dict(num_labels=C), [("ignore_index", -1), ("num_labels", C + 1)]),
    (MultilabelCoverageError, dict(num_labels=C), [("ties", "index"), ("ignore_index", -1), ("num_labels", C + 1)]),
    (MultilabelRankingLoss, dict(num_labels=C, ties="expected"), [("ties", "max"), ("num_labels", 2)]),
    (MultilabelOneError, dict(num_labels=C, ignore_index=-1), [("ignore_index", -2), ("ties", "expected")]),
    (
        MultilabelRetrievalAtK,
        dict(num_labels=C, k=2),
        [("k", 3), ("k", (2, 3)), ("k", 2**40), ("metrics", ("hit", "ndcg")), ("ties", "index"), ("num_labels", C + 1)],
    ),
    (
        MultilabelRetrievalAtK,
        dict(num_labels=C, k=(1, 10**6), metrics=("ap",)),
        [("k", (10**6, 1)), ("k", (1, 10**6 + 1)), ("metrics", ("rr",))],
    ),
    (
        MultilabelRankingMetrics,
        dict(num_labels=C, k=(1, 3)),
        [
            ("metrics", ("lwlrap", "lrap")),
            ("k", (1, 4)),
            ("retrieval_metrics", ("hit",)),
            ("num_labels", C + 1),
            ("ties", "expected"),
            ("ignore_index", -1),
        ],
    ),
    (MultilabelRankingMetrics, dict(num_labels=C, metrics=("lwlrap",)), [("metrics", ("lwlrap", "lrap"))]),
]

REFUSALS = [(cls, options, name, value) for cls, options, changes in CASES for name, value in changes]


def _id(case) -> str:
    cls, options, name, value = case
    return f"{cls.__name__}-{'-'.join(f'{k}={v}' for k, v in options.items() if k != 'num_labels')}-{name}={value}"


def _batches(num_labels: int, count: int = 4, seed: int = 0, ignore: bool = False):
    generator = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        preds = torch.randint(0, 4, (7 + i, num_labels), generator=generator).float()  # ties
        target = torch.randint(0, 2, (7 + i, num_labels), generator=generator)
        if ignore:
            target[torch.rand(target.shape, generator=generator) < 0.1] = -1
        out.append((preds, target))
    return out


def _fed(metric, batches):
    for preds, target in batches:
        metric.update(preds, target)
    return metric


def _persistent(metric):
    metric.persistent(True)
    return metric


def _states(metric) -> Dict[str, torch.Tensor]:
    return {name: getattr(metric, name).clone() for name in metric._defaults}


def _refusal_line(cls, theirs: str, ours: str, where: str = "") -> str:
    return (
        f"{cls.__name__} checkpoint{where} was made with {theirs}; this metric has {ours}: create the metric with the "
        f"checkpoint's options"
    )


def _refused(call: Callable[[], Any], line: str) -> None:
    with pytest.raises(RuntimeError) as info:
        call()
    message = str(info.value)
    assert message.count("\n") == 1, message  # torch's header, then the one line
    assert message.split("\n\t")[1] == line, message


@pytest.mark.parametrize("case", REFUSALS, ids=[_id(case) for case in REFUSALS])
def test_a_checkpoint_made_with_other_options_is_refused(case):
    cls, options, name, value = case
    saved = _persistent(_fed(cls(**options), _batches(options["num_labels"], 2, ignore="ignore_index" in options)))
    with warnings.catch_warnings():  # k=(1, 3) without "retrieval" among the metrics: ignored, with a warning
        warnings.filterwarnings("ignore", message=".*apply to the 'retrieval' metrics", category=UserWarning)
        other = cls(**{**options, name: value})
    if name == "num_bootstrap" and value and "bootstrap_seed" not in options:
        other = cls(**{**options, name: value, "bootstrap_seed": 5})  # any seed: the replicates differ first
    fresh = _states(other)
    theirs, ours = saved._option_values(), other._option_values()
    assert theirs[name] != ours[name]
    differ = [key for key in theirs if theirs[key] != ours[key]]  # k and metrics go with "retrieval", B with seeds
    line = _refusal_line(
        cls, ", ".join(f"{k}={theirs[k]!r}" for k in differ), ", ".join(f"{k}={ours[k]!r}" for k in differ)
    )
    state = saved.state_dict()

    # the metric itself, strict or not
    for strict in (True, False):
        _refused(lambda: other.load_state_dict(dict(state), strict=strict), line)
    # a parent module, strict or not: the line names where the metric is
    model = torch.nn.ModuleDict({"val": other})
    parent = {f"val.{key}": value for key, value in state.items()}
    for strict in (True, False):
        with pytest.raises(RuntimeError, match=r"^Error\(s\) in loading state_dict for ModuleDict:\n\t"):
            model.load_state_dict(dict(parent), strict=strict)
        _refused(
            lambda: model.load_state_dict(dict(parent), strict=strict),
            line.replace(" checkpoint was", " checkpoint at 'val' was"),
        )
    # nothing was loaded
    for key, value in fresh.items():
        assert torch.equal(getattr(other, key), value), key


def test_the_line_names_every_option_that_differs():
    saved = _persistent(MultilabelLWLRAP(7, ties="max"))
    other = MultilabelLWLRAP(8, ties="expected")
    _refused(
        lambda: other.load_state_dict(saved.state_dict()),
        _refusal_line(MultilabelLWLRAP, "ties='max', num_labels=7", "ties='expected', num_labels=8"),
    )
    saved = _persistent(MultilabelRankingMetrics(C, k=(1, 3)))
    other = MultilabelRankingMetrics(C, metrics=("lwlrap",))
    theirs = "metrics=('coverage_error', 'ranking_loss', 'one_error', 'retrieval', 'lwlrap', 'lrap'), k=(1, 3), "
    theirs += "retrieval_metrics=('hit', 'precision', 'recall', 'ap', 'rr', 'ndcg')"
    _refused(
        lambda: other.load_state_dict(saved.state_dict()),
        _refusal_line(MultilabelRankingMetrics, theirs, "metrics=('lwlrap',), k=(), retrieval_metrics=()"),
    )


def test_a_checkpoint_of_another_metric_class_is_refused_naming_the_class_that_made_it():
    saved = _persistent(_fed(MultilabelTieReport(4), _batches(4, 1)))  # precision_sum and label_count too
    other = MultilabelLWLRAP(4)
    with pytest.raises(RuntimeError, match="MultilabelLWLRAP checkpoint was made by MultilabelTieReport: load it "
                                           "into a MultilabelTieReport"):
        other.load_state_dict(saved.state_dict())
    assert other.label_count.sum() == 0
    # Classes whose options would decode from each other's tags (two options each, or one): the class is named, not
    # options that no change of this metric could match.
    pairs = [
        (MultilabelKendallDistanceAtK(C, 1), MultilabelRankCorrelation(C)),
        (MultilabelRankCorrelation(C, method="kendall"), MultilabelKendallDistanceAtK(C, 2)),
        (MultilabelLWLRAP(C), MultilabelNDCG(C)),
        (MultilabelNDCG(C, k=3), MultilabelLWLRAP(C, num_bootstrap=3)),
        (MultilabelCoverageError(C), MultilabelRankingLoss(C)),
    ]
    for maker, loader in pairs:
        made, name = type(maker).__name__, type(loader).__name__
        fresh = _states(loader)
        with pytest.raises(RuntimeError, match=rf"{name} checkpoint was made by {made}: load it into a {made}$"):
            _persistent(loader).load_state_dict(_persistent(maker).state_dict())
        assert all(torch.equal(getattr(loader, key), value) for key, value in fresh.items())


def test_a_subclass_makes_and_loads_its_base_s_checkpoints():
    class ValidationLWLRAP(MultilabelLWLRAP):
        pass

    batches = _batches(C, 2)
    base = _persistent(_fed(MultilabelLWLRAP(C), batches))
    sub = _persistent(ValidationLWLRAP(C))
    sub.load_state_dict(base.state_dict())
    assert torch.equal(sub.precision_sum, base.precision_sum)
    again = _persistent(MultilabelLWLRAP(C))
    again.load_state_dict(_persistent(_fed(ValidationLWLRAP(C), batches)).state_dict())
    assert torch.equal(again.precision_sum, base.precision_sum)


def test_a_checkpoint_of_the_previous_layout_without_the_class_loads_when_the_options_agree():
    # Tags of the previous layout had no class entry: their options are read as before.
    saved = _persistent(_fed(MultilabelKendallDistanceAtK(C, 2), _score_pairs(C, 2, 1)))
    state = saved.state_dict()
    tag = state["options_tag"].tolist()
    state["options_tag"] = torch.tensor([PREVIOUS_LAYOUT] + tag[5:], dtype=torch.int64)
    resumed = _persistent(MultilabelKendallDistanceAtK(C, 2))
    resumed.load_state_dict(dict(state))
    assert torch.equal(resumed.kendall_distance_sum, saved.kendall_distance_sum)
    assert torch.equal(resumed.options_tag, saved.options_tag)  # its own tag, in this layout
    with pytest.raises(RuntimeError, match=r"checkpoint was made with k=2; this metric has k=3"):
        _persistent(MultilabelKendallDistanceAtK(C, 3)).load_state_dict(dict(state))


def test_a_checkpoint_without_the_metric_states_loads_as_before():
    # Metric states are in a state dict only after persistent(True): a module saved without them loads as ever.
    model = torch.nn.ModuleDict({"val": _fed(MultilabelLWLRAP(C), _batches(C, 1)), "head": torch.nn.Linear(2, 2)})
    other = torch.nn.ModuleDict({"val": MultilabelLWLRAP(C + 1, ties="expected"), "head": torch.nn.Linear(2, 2)})
    other.load_state_dict(model.state_dict())
    assert torch.equal(other["head"].weight, model["head"].weight)


def test_a_checkpoint_with_a_state_dropped_is_refused_as_incomplete():
    # Options that agree and one state missing: the line had told the user to create the metric with the
    # checkpoint's options, which are this metric's own.
    metric = _fed(MultilabelLWLRAP(C, num_bootstrap=10, bootstrap_seed=1), _batches(C, 2))
    metric.persistent(True)
    saved = metric.state_dict()
    saved.pop("bootstrap_lwlrap_samples")
    loader = MultilabelLWLRAP(C, num_bootstrap=10, bootstrap_seed=1)
    loader.persistent(True)
    before = {name: value.clone() for name, value in loader.metric_state.items()}
    with pytest.raises(RuntimeError) as info:
        loader.load_state_dict(saved)
    message = str(info.value)
    assert "checkpoint has no state 'bootstrap_lwlrap_samples', which this metric (" in message, message
    assert "the states are incomplete; load the whole `state_dict()`" in message, message
    assert "create the metric with the checkpoint's options" not in message, message
    assert all(torch.equal(before[name], value) for name, value in loader.metric_state.items())


@pytest.mark.parametrize(
    "saved, loader, update",
    [
        (
            lambda: MultilabelRetrievalAtK(C, (1, 3), metrics=("hit",)),
            lambda: MultilabelRetrievalAtK(C, (3, 1), metrics=("hit",)),
            "scores",
        ),
        (lambda: MultilabelNDCG(C, k=1), lambda: MultilabelNDCG(C, k=3), "scores"),
        (lambda: MultilabelLWLRAP(C, ties="index"), lambda: MultilabelLWLRAP(C), "scores"),
        (lambda: MultilabelKendallDistanceAtK(C, 1), lambda: MultilabelKendallDistanceAtK(C, 3), "pair"),
    ],
)
def test_a_checkpoint_without_its_options_tag_is_refused_with_the_way_to_load_it(saved, loader, update):
    """Sums without the record of their options (an entry dropped by hand, a dict built from the states) had loaded
    into a metric with any options of the same state shapes: hit@1 above hit@3, NDCG@1 read as NDCG@3."""
    generator = torch.Generator().manual_seed(11)
    preds = torch.randn(6, C, generator=generator)
    other = preds + torch.randn(6, C, generator=generator)
    target = (torch.rand(6, C, generator=generator) < 0.4).long()
    metric = saved()
    metric.persistent(True)
    metric.update(preds, other if update == "pair" else target)
    state = metric.state_dict()
    del state["options_tag"]
    fresh = loader()
    fresh.persistent(True)
    with pytest.raises(RuntimeError, match="records no options .* state_dict\\['options_tag'\\] = metric.options_tag"):
        fresh.load_state_dict(state)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compute before any update: the refused load left nothing
        assert not bool(torch.as_tensor(_values(fresh.compute())).nan_to_num(0).any())
    # The fix the message names: the entry of a metric with the options the sums were saved with
    same = saved()
    same.persistent(True)
    same.load_state_dict({**state, "options_tag": same.options_tag})
    assert _values(same.compute()) == _values(metric.compute())


def _values(value):
    return [v.item() for v in value.values()] if isinstance(value, dict) else value.tolist()


# ---------------------------------------------------------------------------------------------------------------
# Matching checkpoints resume exactly


def _reference(cls, options, preds, target):
    """The value over all data from the functions (the classes' own definitions) and, where cheap, a naive loop."""
    ties = options.get("ties", "max")
    ignore_index = options.get("ignore_index")
    kw = dict(ties=ties, ignore_index=ignore_index)
    if cls is MultilabelLWLRAP:
        value = multilabel_lwlrap(preds, target, **kw)
        torch.testing.assert_close(value.item(), naive_lwlrap(preds, target, ties, ignore_index), rtol=1e-12, atol=0)
        return value
    if cls is MultilabelLRAP:
        return multilabel_lrap(preds, target, **kw)
    if cls is MultilabelCoverageError:
        value = multilabel_coverage_error(preds, target, **kw)
        assert value.item() == pytest.approx(naive_coverage_error(preds, target, ties, ignore_index), rel=1e-12)
        return value
    if cls is MultilabelRankingLoss:
        return multilabel_ranking_loss(preds, target, **kw)
    if cls is MultilabelOneError:
        return multilabel_one_error(preds, target, **kw)
    if cls is MultilabelRetrievalAtK:
        value = multilabel_retrieval_at_k(preds, target, k=options["k"], **kw)
        naive = naive_retrieval(preds, target, (options["k"],) if isinstance(options["k"], int) else options["k"], **kw)
        for name, v in value.items():
            assert v.item() == pytest.approx(naive[name], rel=1e-12, abs=1e-15), name
        return value
    raise AssertionError(cls)


RESUMES = [
    (MultilabelLWLRAP, dict(num_labels=C, ties="expected", ignore_index=-1)),
    (MultilabelLWLRAP, dict(num_labels=C, num_bootstrap=64, bootstrap_seed=2**63 - 1)),
    (MultilabelLWLRAP, dict(num_labels=C, num_bootstrap=64)),  # drawn seed: the resumed metric takes the saved one
    (MultilabelLRAP, dict(num_labels=C, ties="index", num_bootstrap=64, bootstrap_seed=0)),
    (MultilabelTieReport, dict(num_labels=C, ignore_index=-1)),
    (MultilabelCoverageError, dict(num_labels=C, ignore_index=-1)),
    (MultilabelRankingLoss, dict(num_labels=C, ties="expected")),
    (MultilabelOneError, dict(num_labels=C)),
    (MultilabelRetrievalAtK, dict(num_labels=C, k=(1, 3, 2**40), ties="expected")),
    (MultilabelRankingMetrics, dict(num_labels=C, k=2, ties="index")),
]


@pytest.mark.parametrize("cls, options", RESUMES, ids=[f"{c.__name__}-{len(o)}" for c, o in RESUMES])
def test_a_matching_checkpoint_resumes_exactly(cls, options, tmp_path):
    ignore = "ignore_index" in options
    batches = _batches(C, 4, seed=1, ignore=ignore)
    torch.manual_seed(11)  # the drawn seed of the uninterrupted run
    uninterrupted = _fed(cls(**options), batches)
    torch.manual_seed(11)
    model = torch.nn.ModuleDict({"val": _persistent(cls(**options))})
    _fed(model["val"], batches[:2])
    torch.save(model.state_dict(), tmp_path / "ckpt.pt")
    torch.manual_seed(12)  # another drawn seed, if drawn: the checkpoint's must replace it
    resumed = torch.nn.ModuleDict({"val": _persistent(cls(**options))})
    resumed.load_state_dict(torch.load(tmp_path / "ckpt.pt", weights_only=True))
    _fed(resumed["val"], batches[2:])
    metric = resumed["val"]
    for name, value in _states(uninterrupted).items():
        assert torch.equal(getattr(metric, name), value), name
    assert metric._option_values() == uninterrupted._option_values()
    got, want = metric.compute(), uninterrupted.compute()
    if isinstance(want, dict):
        assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    else:
        assert torch.equal(got, want)
    if getattr(metric, "num_bootstrap", 0):
        assert all(torch.equal(a, b) for a, b in zip(metric.confidence_interval(), uninterrupted.confidence_interval()))
    if cls in (MultilabelTieReport, MultilabelRankingMetrics):
        return
    preds = torch.cat([p for p, _ in batches])
    target = torch.cat([t for _, t in batches])
    reference = _reference(cls, options, preds, target)
    if isinstance(reference, dict):
        for name, value in reference.items():
            torch.testing.assert_close(got[name], value, rtol=1e-12, atol=1e-15)
    else:
        torch.testing.assert_close(got, reference, rtol=1e-12, atol=1e-15)


def _score_pairs(num_labels: int, count: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randint(0, 4, (5 + i, num_labels), generator=generator).float(),
         torch.randint(0, 3, (5 + i, num_labels), generator=generator).float())
        for i in range(count)
    ]


HOLDERS = [(cls, options, _batches) for cls, options in RESUMES] + [
    (MultilabelNDCG, dict(num_labels=C, k=3, gain="linear"), _score_pairs),
    (MultilabelRankCorrelation, dict(num_labels=C, method="kendall"), _score_pairs),
    (MultilabelKendallDistanceAtK, dict(num_labels=C, k=2), _score_pairs),
]


@pytest.mark.parametrize("cls, options, data", HOLDERS, ids=[f"{c.__name__}-{len(o)}" for c, o, _ in HOLDERS])
def test_updates_after_loading_write_into_neither_the_checkpoint_nor_another_metric(cls, options, data):
    # Updates add into the states in place: a state dict the caller still holds, loaded into two metrics, stays as
    # it was, and each metric counts its own batches only (as if fed without the checkpoint).
    first, second = data(C, 4, 1), data(C, 3, 2)
    torch.manual_seed(5)  # a drawn bootstrap seed: the same in every metric
    held = _fed(_persistent(cls(**options)), first[:2]).state_dict()
    saved = {name: value.clone() for name, value in held.items()}
    loaded = []
    for batches in (first[2:], second):
        torch.manual_seed(5)
        metric = _persistent(cls(**options))
        metric.load_state_dict(held)
        loaded.append(_fed(metric, batches))
    assert held.keys() == saved.keys() and all(torch.equal(held[k], saved[k]) for k in held)
    for metric, batches in zip(loaded, (first, first[:2] + second)):
        torch.manual_seed(5)
        for name, value in _states(_fed(cls(**options), batches)).items():
            assert torch.equal(getattr(metric, name), value), name


def _same(got, want) -> bool:
    if isinstance(want, dict):
        return want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    return torch.equal(got, want)


@pytest.mark.parametrize("cls, options, data", HOLDERS, ids=[f"{c.__name__}-{len(o)}" for c, o, _ in HOLDERS])
def test_compute_after_a_load_or_a_merge_gives_the_new_states_value_without_a_warning(cls, options, data):
    # torchmetrics keeps compute()'s last result until the next update: a metric computed, then loaded (or merged
    # into) returned its old value; and a freshly loaded metric warned that compute was called before update
    # (warnings are errors here).
    batches = data(C, 4, 3)
    torch.manual_seed(5)
    saved = _fed(_persistent(cls(**options)), batches[:2])
    torch.manual_seed(5)
    want_saved = saved.compute()
    torch.manual_seed(5)
    want_all = _fed(cls(**options), batches).compute()

    torch.manual_seed(5)
    fresh = _persistent(cls(**options))
    fresh.load_state_dict(saved.state_dict())
    assert _same(fresh.compute(), want_saved)

    torch.manual_seed(5)
    other = _persistent(_fed(cls(**options), batches[2:]))
    other.compute()  # cached
    other.load_state_dict(saved.state_dict())
    assert _same(other.compute(), want_saved)

    if getattr(saved, "num_bootstrap", 0) or not hasattr(saved, "merge_state"):
        return  # a bootstrap metric refuses merges (tested in test_reliability); torchmetrics < 1.3 has no merge_state
    torch.manual_seed(5)
    merged = _fed(cls(**options), batches[2:])
    merged.compute()  # cached
    merged.merge_state(saved)
    assert _close(merged.compute(), want_all)
    empty = cls(**options)
    empty.merge_state(saved)
    assert _close(empty.compute(), want_saved)


def _close(got, want) -> bool:
    # Merged sums are added in another order than one stream's: equal up to float64 rounding.
    if isinstance(want, dict):
        return want.keys() == got.keys() and all(_close(got[k], want[k]) for k in want)
    if isinstance(want, tuple):
        return type(got) is type(want) and all(_close(a, b) for a, b in zip(got, want))
    if not isinstance(want, torch.Tensor):
        return got == pytest.approx(want, rel=1e-12, abs=1e-15, nan_ok=True)
    return torch.allclose(got.double(), want.double(), rtol=1e-12, atol=1e-15, equal_nan=True)


@pytest.mark.parametrize("cls, options, data", HOLDERS[:3] + HOLDERS[-1:], ids=["lwlrap", "bootstrap", "drawn", "distance"])
def test_loaded_states_are_on_the_metric_s_device(cls, options, data):
    # A checkpoint saved on the CPU, loaded into a metric already moved (here to the meta device, which needs no
    # GPU): its states follow the metric, so the next update adds to them where its sums are.
    held = _fed(_persistent(cls(**options)), data(C, 2, 1)).state_dict()
    metric = _persistent(cls(**options)).to("meta")
    metric.load_state_dict(held)
    assert {getattr(metric, name).device.type for name in metric._defaults} == {"meta"}


def test_a_drawn_seed_is_not_taken_over_an_explicit_one():
    saved = _persistent(MultilabelLRAP(C, num_bootstrap=4))  # drawn
    explicit = MultilabelLRAP(C, num_bootstrap=4, bootstrap_seed=saved.bootstrap_seed + 1)
    with pytest.raises(RuntimeError, match="was made with bootstrap_seed="):
        explicit.load_state_dict(saved.state_dict())
    same = MultilabelLRAP(C, num_bootstrap=4, bootstrap_seed=saved.bootstrap_seed)
    same.load_state_dict(saved.state_dict())
    assert same.bootstrap_seed == saved.bootstrap_seed


# ---------------------------------------------------------------------------------------------------------------
# Checkpoints of the previous version: the tag was [tie rule, has ignore_index, ignore_index(, num_labels)], and
# the ranking metrics kept k and the chosen metrics in states of their own.


def _previous_version(metric, state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    state = dict(state)
    values = metric._option_values()
    ignore = values["ignore_index"]
    ties = values.get("ties", "expected")
    tag = [TIES.index(ties), int(ignore is not None), ignore or 0]
    if isinstance(metric, (MultilabelLWLRAP, MultilabelLRAP, MultilabelTieReport)):
        tag.append(values["num_labels"])
    state["options_tag"] = torch.tensor(tag, dtype=torch.int64)
    if values.get("k"):
        state["retrieval_k"] = torch.tensor(values["k"], dtype=torch.int64)
    if isinstance(metric, MultilabelRankingMetrics):
        state["ranking_metrics_tag"] = torch.tensor([int(m in values["metrics"]) for m in RANKING_METRICS])
    for name in [n for n in state if n.endswith("_samples")]:  # it counted updates, under another name
        state[name.replace("_samples", "_updates")] = torch.tensor(1, dtype=torch.int64)
        del state[name]
    return state


PREVIOUS = [
    (MultilabelLWLRAP, dict(num_labels=C, ties="expected", ignore_index=-1), ("ties", "max")),
    (MultilabelLRAP, dict(num_labels=C), ("num_bootstrap", 4)),
    (MultilabelTieReport, dict(num_labels=C), ("ignore_index", -1)),
    (MultilabelCoverageError, dict(num_labels=C, ties="index"), ("ties", "max")),
    (MultilabelRetrievalAtK, dict(num_labels=C, k=2, metrics=("hit", "ap")), ("k", 3)),
    (MultilabelRetrievalAtK, dict(num_labels=C, k=2, metrics=("hit", "ap")), ("metrics", ("hit",))),
    (MultilabelRankingMetrics, dict(num_labels=C, k=2), ("num_labels", C + 1)),
    (MultilabelRankingMetrics, dict(num_labels=C, metrics=("lrap", "one_error")), ("metrics", ("lrap",))),
]


@pytest.mark.parametrize("cls, options, change", PREVIOUS, ids=[f"{c.__name__}-{ch[0]}" for c, _, ch in PREVIOUS])
def test_a_checkpoint_of_the_previous_version_loads_when_the_options_agree(cls, options, change):
    batches = _batches(C, 3, ignore="ignore_index" in options)
    uninterrupted = _fed(cls(**options), batches)
    saved = _persistent(_fed(cls(**options), batches[:1]))
    state = _previous_version(saved, saved.state_dict())
    assert state["options_tag"][0] != TAG_LAYOUT
    resumed = cls(**options)
    resumed.load_state_dict(dict(state))  # strict: the old k and metrics states are consumed
    assert torch.equal(resumed.options_tag, uninterrupted.options_tag)  # its own tag, not the old layout
    _fed(resumed, batches[1:])
    for name, value in _states(uninterrupted).items():
        assert torch.equal(getattr(resumed, name), value), name
    name, value = change
    other = cls(**{**options, name: value})
    fresh = _states(other)
    with pytest.raises(RuntimeError, match=rf"checkpoint was made with {name}=.*; this metric has {name}="):
        other.load_state_dict(dict(state), strict=False)
    for key, value in fresh.items():
        assert torch.equal(getattr(other, key), value), key


@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP])
@pytest.mark.parametrize("num_bootstrap", [8, 0])
def test_a_bootstrap_checkpoint_of_the_previous_version_is_refused_saying_why(cls, num_bootstrap):
    # Its weights were drawn per update: no options make its replicates continue this version's stream, and the
    # line says so instead of naming options to change.
    saved = _persistent(_fed(cls(num_labels=C, num_bootstrap=8, bootstrap_seed=3), _batches(C, 1)))
    state = _previous_version(saved, saved.state_dict())
    metric = cls(num_labels=C, num_bootstrap=num_bootstrap, bootstrap_seed=3)
    fresh = _states(metric)
    with pytest.raises(RuntimeError, match=r"checkpoint was made by an earlier version of torch_lwlrap, whose "
                                           r"bootstrap weights were drawn per update") as error:
        metric.load_state_dict(dict(state))
    assert "create the metric with the checkpoint's options" not in str(error.value)
    for key, value in fresh.items():
        assert torch.equal(getattr(metric, key), value), key


# ---------------------------------------------------------------------------------------------------------------
# Lightning: the user's form


def _validated(lightning, module, batches, tmp_path):
    """A CPU trainer that has run ``module``'s validation over ``batches``, ready to save a checkpoint."""
    trainer = lightning.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path,
    )
    trainer.validate(module, dataloaders=torch.utils.data.DataLoader(batches, batch_size=None), verbose=False)
    return trainer


def test_lightning_checkpoint_with_other_options_is_refused(tmp_path):
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self, ties: str = "max", k: int = 2):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(C, C)
            self.lwlrap = MultilabelLWLRAP(C, ties=ties)
            self.retrieval = MultilabelRetrievalAtK(C, k=k)
            self.lwlrap.persistent(True)
            self.retrieval.persistent(True)

        def validation_step(self, batch, batch_idx):
            preds, target = batch
            self.lwlrap.update(self.layer(preds), target)
            self.retrieval.update(self.layer(preds), target)

    module = Module()
    with warnings.catch_warnings():  # Lightning's advice on workers and loggers
        warnings.simplefilter("ignore")
        _validated(lightning, module, _batches(C, 2), tmp_path).save_checkpoint(tmp_path / "run.ckpt")
    torch.save(module.state_dict(), tmp_path / "state.pt")
    assert module.lwlrap.label_count.sum() > 0

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same = Module.load_from_checkpoint(tmp_path / "run.ckpt")
    assert torch.equal(same.lwlrap.precision_sum, module.lwlrap.precision_sum)
    assert torch.equal(same.retrieval.retrieval_hit_sum, module.retrieval.retrieval_hit_sum)

    with pytest.raises(RuntimeError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Module.load_from_checkpoint(tmp_path / "run.ckpt", ties="expected", k=3)
    lines = str(info.value).split("\n\t")[1:]
    assert lines == [
        _refusal_line(MultilabelLWLRAP, "ties='max'", "ties='expected'", " at 'lwlrap'"),
        _refusal_line(MultilabelRetrievalAtK, "k=(2,)", "k=(3,)", " at 'retrieval'"),
    ]
    other = Module(ties="expected", k=3)
    for strict in (True, False):
        with pytest.raises(RuntimeError, match="MultilabelRetrievalAtK checkpoint at 'retrieval' was made with k="):
            other.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True), strict=strict)
    assert other.lwlrap.label_count.sum() == 0 and other.retrieval.retrieval_weight == 0


# ---------------------------------------------------------------------------------------------------------------
# set_dtype: the sums take its dtype; the options tag and the counts stay int64


def _results(metric) -> List[torch.Tensor]:
    """Every value a metric returns: compute(), and its per-class scores and interval where it has them."""
    value = metric.compute()
    out = list(value.values()) if isinstance(value, dict) else [value]
    if hasattr(metric, "per_class") and not isinstance(metric, MultilabelTieReport):
        out += list(metric.per_class())
    if getattr(metric, "num_bootstrap", 0):
        out += list(metric.confidence_interval())
    return out


@pytest.mark.parametrize("cls, options, data", HOLDERS, ids=[f"{c.__name__}-{len(o)}" for c, o, _ in HOLDERS])
def test_set_dtype_casts_the_sums_and_keeps_the_tag_the_counts_and_float64_results(cls, options, data, tmp_path):
    # float32 sums, for a device without float64. torchmetrics' set_dtype casts every state: a float tag no longer
    # tells which options a checkpoint was made with once rounded (a bfloat16 Kendall checkpoint loaded silently into
    # a Spearman metric), float counts stop growing, and results would come in the states' dtype.
    batches = data(C, 4, 5)
    torch.manual_seed(11)  # the drawn bootstrap seed, where one is drawn
    plain = _fed(cls(**options), batches)
    torch.manual_seed(11)
    cast = _fed(cls(**options).set_dtype(torch.float32), batches)
    for name, default in plain._defaults.items():
        value, want = getattr(cast, name), getattr(plain, name)
        if default.is_floating_point():
            assert value.dtype == cast._defaults[name].dtype == torch.float32, name
            torch.testing.assert_close(value.double(), want, rtol=1e-6, atol=1e-6 * want.abs().max())
        elif name == "options_tag":  # the same options; its last entry, the sums' dtype: float32 (1)
            assert value.dtype == torch.int64 and value.tolist() == want.tolist()[:-1] + [1]
        else:  # the counts: int64 and exact
            assert value.dtype == cast._defaults[name].dtype == torch.int64, name
            assert torch.equal(value, want), name
    for got, want in zip(_results(cast), _results(plain), strict=True):  # computed and returned in float64
        assert got.dtype == want.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)
    # A checkpoint of the cast metric resumes in a metric built and cast the same way, state for state.
    torch.manual_seed(11)
    first = _fed(_persistent(cls(**options).set_dtype(torch.float32)), batches[:2])
    torch.save(first.state_dict(), tmp_path / "cast.pt")
    resumed = _persistent(cls(**options).set_dtype(torch.float32))
    resumed.load_state_dict(torch.load(tmp_path / "cast.pt", weights_only=True))
    _fed(resumed, batches[2:])
    for name in plain._defaults:
        assert torch.equal(getattr(resumed, name), getattr(cast, name)), name
    cast.reset()  # the defaults were cast the same way
    assert all(getattr(cast, name).dtype == default.dtype for name, default in cast._defaults.items())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int32, torch.int64, "float16", "torch.half"],
                         ids=str)
def test_set_dtype_refuses_dtypes_that_cannot_hold_sums_of_many_samples(dtype):
    metric = _fed(MultilabelLRAP(C, num_bootstrap=8, bootstrap_seed=1), _batches(C, 1))
    before = _states(metric)
    with pytest.raises(ValueError, match=r"^MultilabelLRAP\.set_dtype\(.+\): the states are sums over every sample "
                                         r"seen, which .+ cannot hold .+ Use torch\.float32 \(on a device without "
                                         r"float64\) or torch\.float64"):
        metric.set_dtype(dtype)
    for name, state in before.items():  # nothing cast
        assert getattr(metric, name).dtype == state.dtype and torch.equal(getattr(metric, name), state), name
    collection = MetricCollection({"lrap": MultilabelLRAP(C), "ndcg": MultilabelNDCG(C)})
    with pytest.raises(ValueError, match=r"set_dtype"):
        collection.set_dtype(dtype)
    for name in ("float32", "torch.float32", "torch.FloatTensor", torch.float32):  # as torchmetrics takes it
        assert MultilabelLRAP(C).set_dtype(name).lrap_sum.dtype == torch.float32


def test_a_module_cast_leaves_float32_sums_and_kept_results_alone():
    # Lightning's precision="bf16-true" casts the whole model: no sum may follow, float32 ones neither.
    batches = _batches(C, 6, 7)
    model = torch.nn.Module()
    model.net = torch.nn.Linear(C, C)
    model.lrap32 = MultilabelLRAP(C).set_dtype(torch.float32)
    model.lrap = MultilabelLRAP(C)
    reference = MultilabelLRAP(C)
    for preds, target in batches[:3]:
        for metric in (model.lrap32, model.lrap, reference):
            metric.update(preds, target)
    kept = model.lrap.compute()  # torchmetrics keeps it until the next update
    model.to(torch.bfloat16)
    assert model.lrap32.lrap_sum.dtype == model.lrap32.weight_sum.dtype == torch.float32
    assert model.lrap.lrap_sum.dtype == torch.float64
    assert model.lrap.compute().dtype == torch.float64 and torch.equal(model.lrap.compute(), kept)
    for preds, target in batches[3:]:
        for metric in (model.lrap32, model.lrap, reference):
            metric.update(preds, target)
    assert torch.equal(model.lrap.compute(), reference.compute())
    torch.testing.assert_close(model.lrap32.compute(), reference.compute(), rtol=1e-6, atol=0)
    want = multilabel_lrap(torch.cat([p for p, _ in batches]), torch.cat([t for _, t in batches]))
    torch.testing.assert_close(reference.compute(), want, rtol=1e-12, atol=0)


def test_merge_state_keeps_a_cast_metric_s_dtypes():
    from torchmetrics import Metric

    if not hasattr(Metric, "merge_state"):
        pytest.skip("this torchmetrics has no merge_state")
    batches = _batches(C, 4, 8)
    whole = _fed(MultilabelLWLRAP(C), batches)
    target = _fed(MultilabelLWLRAP(C).set_dtype(torch.float32), batches[:2])
    target.merge_state(_fed(MultilabelLWLRAP(C), batches[2:]))  # float64 sums into float32 ones
    assert target.precision_sum.dtype == torch.float32 and target.label_count.dtype == torch.int64
    assert torch.equal(target.label_count, whole.label_count)
    torch.testing.assert_close(target.compute(), whole.compute(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_checkpoint_an_earlier_set_dtype_cast_whole_loads_when_its_tag_reads_exactly(dtype):
    made = _fed(_persistent(MultilabelRankCorrelation(C, method="kendall")), _score_pairs(C, 3, 1))
    earlier = {name: value.to(dtype) for name, value in made.state_dict().items()}  # every state, tag and counts too
    resumed = _persistent(MultilabelRankCorrelation(C, method="kendall"))
    resumed.load_state_dict(earlier)
    for name, default in made._defaults.items():  # in this metric's dtypes again: int64 counts, float64 sums
        value = getattr(resumed, name)
        assert value.dtype == default.dtype, name
        torch.testing.assert_close(value.double(), getattr(made, name).double(), rtol=1e-6, atol=0)
    _refused(
        lambda: _persistent(MultilabelRankCorrelation(C)).load_state_dict(earlier),
        _refusal_line(MultilabelRankCorrelation, "method='kendall'", "method='spearman'"),
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_a_tag_an_earlier_set_dtype_rounded_is_refused_with_the_way_to_load_it(dtype):
    from torchmetrics import Metric

    made = _fed(_persistent(MultilabelRankCorrelation(C, method="kendall")), _score_pairs(C, 3, 1))
    earlier = {name: value.to(dtype) for name, value in made.state_dict().items()}
    line = (
        f"MultilabelRankCorrelation checkpoint has its options_tag in {dtype}, not int64 (metric.set_dtype in "
        f"earlier versions cast every state, and {dtype} can round a tag's entries): its options cannot be "
        f"checked. If it was made with this metric's options, set its 'options_tag' entry to this metric's "
        f"(state_dict['options_tag'] = metric.options_tag, under the metric's prefix) and load it again"
    )
    for method in ("spearman", "kendall"):  # a rounded tag (bfloat16; float16 past 2048) says nothing for sure
        fresh = _persistent(MultilabelRankCorrelation(C, method=method))
        _refused(lambda: fresh.load_state_dict(earlier), line)
        assert fresh.rank_correlation_count == 0
    resumed = _persistent(MultilabelRankCorrelation(C, method="kendall"))
    resumed.load_state_dict({**earlier, "options_tag": resumed.options_tag})  # the way the message gives
    assert torch.equal(resumed.rank_correlation_count, made.rank_correlation_count)
    assert resumed.rank_correlation_count.dtype == torch.int64
    if hasattr(Metric, "merge_state"):
        states = {name: value.clone() for name, value in made.metric_state.items()}
        states["options_tag"] = states["options_tag"].float()  # exact, but not this version's: load it first
        target = _fed(MultilabelRankCorrelation(C, method="kendall"), _score_pairs(C, 1, 2))
        before = _states(target)
        with pytest.raises(ValueError, match=r"cannot merge these states: their metric has an options tag in "
                                             r"torch\.float32: load its states into a metric of this version"):
            target.merge_state(states)
        assert all(torch.equal(getattr(target, key), state) for key, state in before.items())


def test_lightning_resumes_a_metric_cast_with_set_dtype(tmp_path):
    # float32 sums, as on a device without float64 (Apple's MPS): the checkpoint resumes, its options checked.
    lightning = pytest.importorskip("lightning")

    class Module(lightning.LightningModule):
        def __init__(self, method: str = "kendall"):
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(C, C)
            self.agreement = MultilabelRankCorrelation(C, method=method).set_dtype(torch.float32)
            self.agreement.persistent(True)

        def validation_step(self, batch, batch_idx):
            preds, reference = batch
            self.agreement.update(self.layer(preds), reference)
            self.log("agreement", self.agreement, on_epoch=True)

    batches = _score_pairs(C, 3, 4)
    module = Module()
    with warnings.catch_warnings():  # Lightning's advice on workers and loggers
        warnings.simplefilter("ignore")
        trainer = _validated(lightning, module, batches, tmp_path)
        # Lightning resets a logged metric after the epoch: feed it again, as a run saved mid-epoch holds it.
        with torch.no_grad():
            for preds, reference in batches:
                module.agreement.update(module.layer(preds), reference)
        trainer.save_checkpoint(tmp_path / "run.ckpt")
        same = Module.load_from_checkpoint(tmp_path / "run.ckpt")
    assert same.agreement.rank_correlation_sum.dtype == torch.float32
    assert same.agreement.rank_correlation_count.dtype == torch.int64
    assert torch.equal(same.agreement.rank_correlation_sum, module.agreement.rank_correlation_sum)
    assert torch.equal(same.agreement.rank_correlation_count, module.agreement.rank_correlation_count)
    with pytest.raises(RuntimeError) as info, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        Module.load_from_checkpoint(tmp_path / "run.ckpt", method="spearman")
    assert str(info.value).split("\n\t")[1:] == [
        _refusal_line(MultilabelRankCorrelation, "method='kendall'", "method='spearman'", " at 'agreement'")
    ]


# ---------------------------------------------------------------------------------------------------------------
# Collections


def _interval(metric) -> torch.Tensor:
    return torch.stack(metric.confidence_interval())


@pytest.mark.parametrize("bootstrap", [0, 16])
def test_forwards_that_sync_on_each_step_count_each_batch_once_in_a_compute_group(bootstrap):
    # dist_sync_on_step makes torchmetrics' forward update the accumulated states and keep them aside: the states
    # are added to in place, and a compute group shares one state tensor between its members (torchmetrics 1.2
    # keeps the states aside by reference), so each forward must start from states of its own.
    options = dict(num_bootstrap=bootstrap, bootstrap_seed=3, dist_sync_on_step=True)
    collection = MetricCollection({"micro": MultilabelLWLRAP(C, **options),
                                   "macro": MultilabelLWLRAP(C, average="macro", **options)})
    batches = _batches(C, 4, seed=2)
    collection.update(*batches[0])
    for preds, target in batches[1:]:
        values = collection(preds, target)
        assert values["micro"].item() == pytest.approx(naive_lwlrap(preds, target), rel=1e-12, abs=1e-12)
    alone = _fed(MultilabelLWLRAP(C, num_bootstrap=bootstrap, bootstrap_seed=3), batches)
    for name in ("micro", "macro"):
        for state, value in _states(alone).items():
            assert torch.equal(getattr(collection[name], state), value), (name, state)


@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP])
@pytest.mark.parametrize("first", ["empty", "no positive"])
def test_a_collection_keeps_bootstrap_metrics_with_other_seeds_apart(cls, first):
    empty = torch.zeros(0 if first == "empty" else 5, C)
    batches = [(empty, torch.zeros(empty.shape, dtype=torch.int64))] + _batches(C, 3)
    collection = MetricCollection(
        {"seed0": cls(C, num_bootstrap=64, bootstrap_seed=0), "seed1": cls(C, num_bootstrap=64, bootstrap_seed=1)}
    )
    for preds, target in batches:
        collection.update(preds, target)
    assert sorted(sorted(group) for group in collection.compute_groups.values()) == [["seed0"], ["seed1"]]
    alone = {seed: _fed(cls(C, num_bootstrap=64, bootstrap_seed=seed), batches) for seed in (0, 1)}
    assert torch.equal(_interval(collection["seed0"]), _interval(alone[0]))
    assert torch.equal(_interval(collection["seed1"]), _interval(alone[1]))
    assert not torch.equal(_interval(alone[0]), _interval(alone[1]))


@pytest.mark.parametrize(
    "make",
    [
        lambda i: MultilabelRetrievalAtK(C, k=2**40 + i),  # "close" as whole numbers
        lambda i: MultilabelLWLRAP(C, ignore_index=10**9 + i),
        lambda i: MultilabelLRAP(C, num_bootstrap=4, bootstrap_seed=2**62 + i),
        lambda i: MultilabelRankingMetrics(C, metrics=("lwlrap", "lrap")[: i + 1]),
        lambda i: MultilabelRankingMetrics(C, k=1, retrieval_metrics=(("hit",), ("hit", "rr"))[i]),
    ],
    ids=["k", "ignore_index", "seed", "metrics", "retrieval_metrics"],
)
def test_a_collection_never_merges_metrics_whose_options_differ(make):
    collection = MetricCollection({"a": make(0), "b": make(1)})
    num_labels = collection["a"].num_labels
    collection.update(torch.zeros(0, num_labels), torch.zeros(0, num_labels, dtype=torch.int64))
    assert len(collection.compute_groups) == 2


def test_a_metric_an_earlier_version_pickled_keeps_its_validate_args():
    # validate_args is a property now (it re-tags the metric); an earlier version pickled it as a plain attribute.
    import pickle

    batches = _score_pairs(C, 3, 3)
    for validate_args in (True, False):
        metric = _fed(MultilabelRankCorrelation(C, method="kendall", validate_args=validate_args), batches[:2])
        state = pickle.loads(pickle.dumps(metric)).__dict__
        state["validate_args"] = state.pop("_validate_args")
        earlier = MultilabelRankCorrelation.__new__(MultilabelRankCorrelation)
        earlier.__setstate__(state)
        assert earlier.validate_args is validate_args
        earlier(*batches[2])  # forward, then update
        earlier.update(*batches[2])
        whole = _fed(MultilabelRankCorrelation(C, method="kendall"), batches + batches[2:])
        torch.testing.assert_close(earlier.compute(), whole.compute(), rtol=1e-13, atol=0)


SETTINGS = [
    (MultilabelLWLRAP, dict(num_labels=C), _batches),
    (MultilabelLRAP, dict(num_labels=C, num_bootstrap=4, bootstrap_seed=1), _batches),
    (MultilabelNDCG, dict(num_labels=C, k=3), _score_pairs),
    (MultilabelRankCorrelation, dict(num_labels=C, method="kendall"), _score_pairs),
    (MultilabelKendallDistanceAtK, dict(num_labels=C, k=2), _score_pairs),
]


@pytest.mark.parametrize("cls, options, data", SETTINGS, ids=[c.__name__ for c, _, _ in SETTINGS])
def test_a_collection_keeps_metrics_that_check_or_keep_their_sums_differently_apart(cls, options, data):
    # Only a compute group's first member sees the batches: a metric with validate_args=True grouped after one
    # with validate_args=False took NaN batches silently, and a float64 one grouped with a float32 one read float32
    # sums. The settings sit at the tag's end; checkpoints and merges do not compare them.
    batches = data(C, 3, 9)
    switched = cls(**options)
    switched.validate_args = False  # after it is built: the tag follows
    collection = MetricCollection({
        "fast": cls(**options, validate_args=False),
        "strict": cls(**options),
        "float32": cls(**options).set_dtype(torch.float32),
        "switched": switched,
    })
    alone = cls(**options)
    for batch in batches:
        collection.update(*batch)
        alone.update(*batch)
    assert sorted(map(sorted, collection.compute_groups.values())) == [["fast", "switched"], ["float32"], ["strict"]]
    assert torch.equal(switched.options_tag, collection["fast"].options_tag)
    tag = switched.options_tag.clone()
    switched(*batches[0])  # forward skips update's checks without touching the tag
    assert torch.equal(switched.options_tag, tag) and switched.validate_args is False
    strict = collection["strict"]
    assert all(getattr(strict, name).dtype == default.dtype for name, default in alone._defaults.items())
    for name in alone._defaults:
        assert torch.equal(getattr(strict, name), getattr(alone, name)), name
    before = _states(strict)
    preds, other = (value.clone() for value in batches[0])
    preds[1, 2] = math.nan
    with pytest.raises(ValueError, match=r"Argument `preds(_a)?` contains NaN \(first at index \(1, 2\)\)"):
        collection.update(preds, other)
    assert all(torch.equal(getattr(strict, name), value) for name, value in before.items())
    # A checkpoint or a merge across settings: the options agree, so they load and add; each keeps its own tag.
    fast = _persistent(_fed(cls(**options, validate_args=False), batches))
    resumed = _persistent(cls(**options))
    resumed.load_state_dict(fast.state_dict())
    assert torch.equal(resumed.options_tag, cls(**options).options_tag)
    assert all(torch.equal(getattr(resumed, n), getattr(fast, n)) for n in alone._defaults if n != "options_tag")
    from torchmetrics import Metric

    if hasattr(Metric, "merge_state") and not options.get("num_bootstrap"):  # replicates never merge
        merged = _fed(cls(**options).set_dtype(torch.float32), batches[:1])
        tag = merged.options_tag.clone()
        merged.merge_state(_fed(cls(**options, validate_args=False), batches[1:]))
        assert torch.equal(merged.options_tag, tag)
        torch.testing.assert_close(merged.compute(), alone.compute(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "make, batches",
    [
        (lambda v: MultilabelLWLRAP(C, average=v), ("weighted", "macro")),
        (lambda v: MultilabelRetrievalAtK(C, k=2, empty_target=v), ("zero", "skip")),
    ],
    ids=["average", "empty_target"],
)
def test_options_that_only_change_compute_share_the_same_sums(make, batches):
    # average and empty_target are not in the tag: the shared sums are each metric's own, and each computes its value.
    first, second = batches
    collection = MetricCollection({"a": make(first), "b": make(second)})
    data = _batches(C, 2)
    for preds, target in data:
        target[0] = 0  # a sample without positive, for empty_target
        collection.update(preds, target)
    assert len(collection.compute_groups) == 1
    for name, option in (("a", first), ("b", second)):
        alone = _fed(make(option), data).compute()
        got = collection[name].compute()
        if isinstance(alone, dict):
            assert all(torch.equal(got[k], v) for k, v in alone.items())
        else:
            assert torch.equal(got, alone)


# ---------------------------------------------------------------------------------------------------------------
# k beyond the number of labels


class _Recorder(TorchDispatchMode):
    """Counts the aten operations run and the largest tensor any of them returns."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.Tensor):
                self.largest = max(self.largest, value.numel())
        return out


def _cost(call) -> Tuple[int, int]:
    with _Recorder() as recorder:
        call()
    return recorder.ops, recorder.largest


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_k_beyond_the_labels_gives_the_values_of_k_equal_to_c(ties):
    preds, target = _batches(C, 1, seed=3, ignore=True)[0]
    target[0] = 0  # a sample without positive
    big = (C + 1, 10**7, 2**62, 2**63 - 1)
    values = multilabel_retrieval_at_k(preds, target, k=(C,) + big, ties=ties, ignore_index=-1)
    naive = naive_retrieval(preds, target, (C,) + big, ties=ties, ignore_index=-1)
    for key, value in values.items():
        assert value.item() == pytest.approx(naive[key], rel=1e-12, abs=1e-300), key
    for name in ("hit", "recall", "ap", "rr", "ndcg"):
        for k in big:
            torch.testing.assert_close(values[f"{name}@{k}"], values[f"{name}@{C}"], rtol=1e-14, atol=0)
    for k in big:  # precision counts the top k, however many of them hold no label
        torch.testing.assert_close(values[f"precision@{k}"], values[f"precision@{C}"] * C / k, rtol=1e-14, atol=0)


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_k_beyond_the_labels_costs_what_k_equal_to_c_costs(ties):
    preds, target = _batches(C, 1, seed=4)[0]
    cost_c = _cost(lambda: multilabel_retrieval_at_k(preds, target, k=C, ties=ties))
    for k in (10**4, 2**62):
        assert _cost(lambda: multilabel_retrieval_at_k(preds, target, k=k, ties=ties)) == cost_c
        metric = MultilabelRetrievalAtK(C, k=k, ties=ties)
        reference = MultilabelRetrievalAtK(C, k=C, ties=ties)
        assert _cost(lambda: metric.update(preds, target)) == _cost(lambda: reference.update(preds, target))
        name = f"ndcg@{k}"
        assert metric.compute()[name] == reference.compute()[f"ndcg@{C}"]


def test_k_must_fit_an_int64():
    with pytest.raises(ValueError, match=r"Argument `k` must be below 2\*\*63"):
        MultilabelRetrievalAtK(C, k=2**63)
    with pytest.raises(ValueError, match=r"Argument `k` must be below 2\*\*63"):
        multilabel_retrieval_at_k(torch.rand(2, C), torch.ones(2, C), k=(1, 2**64))


# ---------------------------------------------------------------------------------------------------------------
# merge_state: torchmetrics' merge of another metric's states, refused across options and classes


MERGES = [
    (MultilabelLWLRAP, dict(num_labels=C), ("ties", "expected"), _batches),
    (MultilabelLRAP, dict(num_labels=C), ("ties", "index"), _batches),
    (MultilabelRetrievalAtK, dict(num_labels=C, k=2), ("k", 3), _batches),
    (MultilabelNDCG, dict(num_labels=C, k=3), ("gain", "linear"), _score_pairs),
    (MultilabelRankCorrelation, dict(num_labels=C), ("method", "kendall"), _score_pairs),
    (MultilabelKendallDistanceAtK, dict(num_labels=C, k=2), ("k", 3), _score_pairs),
]


@pytest.mark.parametrize("cls, options, change, data", MERGES, ids=[c.__name__ for c, *_ in MERGES])
def test_merge_state_adds_equal_metrics_and_refuses_other_options_or_classes(cls, options, change, data):
    from torchmetrics import Metric

    if not hasattr(Metric, "merge_state"):
        pytest.skip("this torchmetrics has no merge_state")
    batches = data(C, 4, 3)
    whole = _fed(cls(**options), batches)
    for incoming in (lambda m: m, lambda m: dict(m.metric_state)):  # a metric, or a dict of its states
        merged = _fed(cls(**options), batches[:2])
        merged.merge_state(incoming(_fed(cls(**options), batches[2:])))
        for name, value in _states(whole).items():  # sums of the two halves: the same up to the order of addition
            torch.testing.assert_close(getattr(merged, name), value, rtol=1e-13, atol=1e-13, msg=name)
    name, value = change
    for other, match in (
        (cls(**{**options, name: value}), rf"cannot merge these states: their metric was made with {name}=.*; this "
                                           rf"metric has {name}="),
        (MultilabelTieReport(C) if cls is not MultilabelTieReport else MultilabelLWLRAP(C),
         r"cannot merge these states: their metric was made by Multilabel\w+: merge it into a Multilabel\w+"),
    ):
        target = _fed(cls(**options), batches[:2])
        before = _states(target)
        with pytest.raises(ValueError, match=match):
            target.merge_state(other)
        with pytest.raises(ValueError, match=match):
            target.merge_state(dict(other.metric_state))
        assert all(torch.equal(getattr(target, key), state) for key, state in before.items())


@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP])
def test_merge_state_refuses_bootstrap_replicates(cls):
    # Two metrics of one process draw a sample's weights from the seed and its position in their own stream: the
    # merged replicates would weigh the two metrics' samples alike. Another seed is refused as another option.
    from torchmetrics import Metric

    if not hasattr(Metric, "merge_state"):
        pytest.skip("this torchmetrics has no merge_state")
    batches = _batches(C, 2)
    first = _fed(cls(C, num_bootstrap=4, bootstrap_seed=1), batches[:1])
    before = _states(first)
    with pytest.raises(ValueError, match=r"num_bootstrap=4 cannot merge another metric's states: .* not be\s+"
                                         r"independent\. Feed every batch to one metric"):
        first.merge_state(_fed(cls(C, num_bootstrap=4, bootstrap_seed=1), batches[1:]))
    with pytest.raises(ValueError, match=r"was made with bootstrap_seed=2; this metric has bootstrap_seed=1\.$"):
        first.merge_state(cls(C, num_bootstrap=4, bootstrap_seed=2))
    assert all(torch.equal(getattr(first, key), state) for key, state in before.items())


def test_merge_state_refuses_an_earlier_version_s_tag_and_merges_shape_only_metrics():
    from torchmetrics import Metric

    if not hasattr(Metric, "merge_state"):
        pytest.skip("this torchmetrics has no merge_state")
    metric = _fed(MultilabelLWLRAP(C), _batches(C, 1))
    states = {name: value.clone() for name, value in metric.metric_state.items()}
    tag = metric.options_tag.tolist()
    # the previous layout, the one before, and this layout without the run settings at its end
    for earlier in ([PREVIOUS_LAYOUT] + tag[5:], [0, 0, 0, C], tag[:-3]):
        states["options_tag"] = torch.tensor(earlier, dtype=torch.int64)
        with pytest.raises(ValueError, match=r"cannot merge these states: their metric has an earlier version's "
                                             r"options tag: load its states into a metric of this version"):
            metric.merge_state(dict(states))
        resumed = _persistent(MultilabelLWLRAP(C))
        resumed.load_state_dict(dict(states))  # the way the message gives
        merged = _fed(MultilabelLWLRAP(C), _batches(C, 1))
        merged.merge_state(resumed)
        assert torch.equal(merged.label_count, 2 * metric.label_count)
    shapes = MultilabelLWLRAP(C).to("meta")  # shape-only tests: the tags have no values to compare
    shapes.merge_state(MultilabelLWLRAP(C).to("meta"))
    assert shapes.label_count.device.type == "meta"


def test_merge_state_checks_a_meta_metric_s_options_and_refuses_mixing_meta_and_values():
    from torchmetrics import Metric

    if not hasattr(Metric, "merge_state"):
        pytest.skip("this torchmetrics has no merge_state")
    options = r"cannot merge these states: their metric was made with ties='index'; this metric has ties='max'"
    # a metric on meta still has options: the refusal names them, whichever side is on meta, or both
    for target, other in (("meta", "cpu"), ("cpu", "meta"), ("meta", "meta")):
        with pytest.raises(ValueError, match=options):
            MultilabelLWLRAP(C).to(target).merge_state(MultilabelLWLRAP(C, ties="index").to(other))
    fed = _fed(MultilabelLWLRAP(C), _batches(C, 2))
    before = _states(fed)
    meta = r"on cpu cannot merge states on meta: a metric on meta holds its states' shapes, not their values"
    with pytest.raises(ValueError, match=meta):
        fed.merge_state(MultilabelLWLRAP(C).to("meta"))
    with pytest.raises(ValueError, match=meta):
        fed.merge_state({name: value.to("meta") for name, value in fed.metric_state.items()})
    with pytest.raises(ValueError, match=r"MultilabelLWLRAP on meta cannot merge states on cpu"):
        MultilabelLWLRAP(C).to("meta").merge_state(fed)
    # a dict of sums without the tag, or without a sum
    with pytest.raises(ValueError, match=r"records no options \(the states have no 'options_tag', which every "
                                         r"torch_lwlrap metric's `metric_state` carries\).*states\['options_tag'\] = "):
        fed.merge_state({name: value for name, value in fed.metric_state.items() if name != "options_tag"})
    with pytest.raises(ValueError, match=r"has no state 'label_count'.*merge its whole `metric_state`"):
        fed.merge_state({name: value for name, value in fed.metric_state.items() if name != "label_count"})
    # a dict of meta states has no options to read, but its states must still be this metric's, in its shapes
    shapes = MultilabelLWLRAP(C).to("meta")
    with pytest.raises(ValueError, match=rf"their metric has state 'precision_sum' of shape \({C + 1},\), this "
                                         rf"metric \({C},\)"):
        shapes.merge_state(dict(MultilabelLWLRAP(C + 1).to("meta").metric_state))
    with pytest.raises(ValueError, match=r"their metric keeps states this metric does not \('lrap_sum', 'weight_sum'\): "
                                         r"they are another metric's"):
        shapes.merge_state(dict(MultilabelLRAP(C).to("meta").metric_state))
    shapes.merge_state(dict(MultilabelLWLRAP(C).to("meta").metric_state))
    assert all(torch.equal(getattr(fed, key), state) for key, state in before.items())
    fed.merge_state(fed)  # the refusals changed nothing: the metric merges (doubles) as before
    assert torch.equal(fed.label_count, 2 * before["label_count"])


# A tag no version wrote (a hand-edited or damaged state dict): another length, a flag other than 0/1, a tie rule
# or a label count out of range, an ignore_index beside a flag saying there is none.
GARBAGE_TAGS = [[5, 5, 5, 5, 5], [1, 2], [7], [0, 2, 0], [0, 0, 3], [0, 1, -1, 0], [99, 0, 0]]


@pytest.mark.parametrize("cls, options, data", HOLDERS, ids=[f"{c.__name__}-{len(o)}" for c, o, _ in HOLDERS])
def test_a_tag_no_version_wrote_is_refused_and_changes_nothing(cls, options, data):
    saved = _persistent(_fed(cls(**options), data(C, 1, 0)))
    target = _persistent(_fed(cls(**options), data(C, 2, 1)))
    before, value = _states(target), target.compute()
    for tag in GARBAGE_TAGS:
        state = dict(saved.state_dict())
        state["options_tag"] = torch.tensor(tag, dtype=torch.int64)
        for strict in (True, False):
            with pytest.raises(RuntimeError, match=rf"{cls.__name__} checkpoint was made by another metric class or "
                                                   rf"with other options \(an unknown options_tag\)"):
                target.load_state_dict(dict(state), strict=strict)
        for name, kept in before.items():
            assert torch.equal(getattr(target, name), kept), (tag, name)
    after = target.compute()
    if isinstance(value, dict):
        assert all(torch.equal(after[k], value[k]) for k in value)
    else:
        assert torch.equal(after, value)


def test_an_earlier_version_s_tag_still_loads_beside_the_refused_ones():
    # the same checks let every tag an earlier version wrote through (its options then compared)
    for cls, options in ((MultilabelLWLRAP, dict(num_labels=C, ties="index", ignore_index=-1)),
                         (MultilabelTieReport, dict(num_labels=C)), (MultilabelCoverageError, dict(num_labels=C))):
        batches = _batches(C, 2, ignore="ignore_index" in options)
        saved = _persistent(_fed(cls(**options), batches[:1]))
        state = _previous_version(saved, saved.state_dict())
        resumed = _persistent(cls(**options))
        resumed.load_state_dict(state)
        _fed(resumed, batches[1:])
        for name, value in _states(_fed(cls(**options), batches)).items():
            assert torch.equal(getattr(resumed, name), value), (cls.__name__, name)


@pytest.mark.parametrize("cls, options, data", HOLDERS, ids=[f"{c.__name__}-{len(o)}" for c, o, _ in HOLDERS])
def test_a_refused_batch_is_not_counted_as_an_update(cls, options, data):
    metric = cls(**options)
    good = data(C, 1, 0)[0]
    bad = (good[0][:, :-1], good[1][:, :-1])  # one label short
    with pytest.raises(ValueError):
        metric.update(*bad)
    assert metric._update_count == 0 and not metric.update_called
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.compute()  # torchmetrics' warning: nothing was added (beside the metric's own NaN warning, if any)
    assert any("before the ``update`` method" in str(w.message) for w in caught), [str(w.message) for w in caught]
    metric.update(*good)
    value = metric.compute()
    with pytest.raises(ValueError):
        metric.update(*bad)
    assert metric._update_count == 1 and metric._computed is not None  # the kept result stands: nothing changed
    again = metric.compute()
    if isinstance(value, dict):
        assert all(torch.equal(again[k], value[k]) for k in value)
    else:
        assert torch.equal(again, value)


class _MetaBuilt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(4, C)
        self.val_lwlrap = MultilabelLWLRAP(C, ties="index", ignore_index=-1)
        self.val_loss = MultilabelRankingLoss(C)
        self.val_boot = MultilabelLRAP(C, num_bootstrap=8, bootstrap_seed=3)
        self.agree = MultilabelKendallDistanceAtK(C, k=2)


def test_a_module_made_on_meta_and_materialized_with_to_empty_holds_new_metrics():
    with torch.device("meta"):
        module = _MetaBuilt()
    assert module.val_lwlrap.precision_sum.device.type == "meta"
    preds, target = _batches(C, 1, ignore=True)[0]
    shapes = MultilabelLWLRAP(C, validate_args=False).to("meta")  # a run of shapes: updates, without values
    shapes.update(preds.to("meta"), target.clamp(min=0).to("meta"))
    assert shapes.precision_sum.device.type == "meta"
    module.to_empty(device="cpu")  # the memory of every state, without data, then the states of new metrics
    fresh = _MetaBuilt()
    for name in ("val_lwlrap", "val_loss", "val_boot", "agree"):
        got, want = getattr(module, name), getattr(fresh, name)
        for state in want._defaults:
            assert torch.equal(getattr(got, state), getattr(want, state)), (name, state)
            assert torch.equal(got._defaults[state], want._defaults[state]), (name, state)
        assert not got.update_called
    module.val_lwlrap.update(preds, target)
    module.val_loss.update(preds, target.clamp(min=0))
    assert module.val_lwlrap.compute().item() == pytest.approx(naive_lwlrap(preds, target, "index", -1), rel=1e-12)
    from sklearn.metrics import label_ranking_loss

    expected = label_ranking_loss(target.clamp(min=0).numpy(), preds.numpy())
    assert module.val_loss.compute().item() == pytest.approx(expected, rel=1e-12)
    state = module.state_dict()  # a checkpoint of the materialized module loads into one made normally
    _persistent(fresh.val_lwlrap).load_state_dict({k[len("val_lwlrap."):]: v for k, v in state.items()
                                                   if k.startswith("val_lwlrap.")}, strict=False)


@pytest.mark.parametrize("make, second", [
    (lambda: MultilabelLWLRAP(C), "target"),
    (lambda: MultilabelRankingLoss(C), "target"),
    (lambda: MultilabelNDCG(C, k=2), "relevance"),
    (lambda: MultilabelKendallDistanceAtK(C, 2), "scores"),
])
def test_value_checks_on_meta_say_how_to_follow_shapes_there(make, second):
    # The value checks had failed on meta with torch's bare "Tensor.item() cannot be called on meta tensors".
    metric = make().to("meta")  # (made in a meta context, torchmetrics before 1.3 records its device as the CPU)
    preds = torch.randn(4, C, device="meta")
    other = {"target": torch.randint(0, 2, (4, C), device="meta"), "relevance": torch.rand(4, C, device="meta"),
             "scores": torch.randn(4, C, device="meta")}[second]
    with pytest.raises(ValueError, match=r"meta. device have shapes without values: pass .validate_args=False."):
        metric.update(preds, other)
    assert not metric.update_called  # a refused batch is not counted
    metric.validate_args = False  # as the message says: shapes only
    metric.update(preds, other)
    assert metric.update_called and all(getattr(metric, name).device.type == "meta" for name in metric._defaults)
    assert metric.to_empty(device="cpu") is metric  # as the message says: new states on a real device (the metric
    fresh = make()                                  # itself had refused torch's `recurse` keyword)
    fresh.validate_args = False  # the same options (the tag holds them)
    assert all(torch.equal(getattr(metric, name), getattr(fresh, name)) for name in fresh._defaults)
    assert not metric.update_called
    with pytest.raises(ValueError, match="validate_args=False"):
        multilabel_lwlrap(preds, torch.randint(0, 2, (4, C), device="meta"))


@pytest.mark.parametrize("make, second", [
    (lambda: MultilabelLWLRAP(C, validate_args=False), "target"),
    (lambda: MultilabelLWLRAP(C, average="macro", validate_args=False), "target"),
    (lambda: MultilabelLWLRAP(C, average="none", validate_args=False), "target"),
    (lambda: MultilabelLRAP(C, validate_args=False), "target"),
    (lambda: MultilabelRankingLoss(C, validate_args=False), "target"),
    (lambda: MultilabelRetrievalAtK(C, k=[1, 3], validate_args=False), "target"),
    (lambda: MultilabelNDCG(C, k=2, validate_args=False), "relevance"),
    (lambda: MultilabelKendallDistanceAtK(C, 2, validate_args=False), "scores"),
])
def test_compute_on_meta_gives_the_value_s_shapes(make, second):
    # A run of shapes on meta computes too: the value has the shape (and keys) it has on a real device. lwlrap and
    # LRAP had read their totals for the no-positive warning ("Tensor.item() cannot be called on meta tensors").
    g = torch.Generator().manual_seed(3)
    batch = (torch.randn(4, C, generator=g), {"target": (torch.rand(4, C, generator=g) < 0.5).long(),
                                              "relevance": torch.rand(4, C, generator=g) * 3,
                                              "scores": torch.randn(4, C, generator=g)}[second])
    real, shapes = make(), make().to("meta")
    real.update(*batch)
    shapes.update(*(tensor.to("meta") for tensor in batch))
    want, got = real.compute(), shapes.compute()
    if isinstance(want, dict):
        assert got.keys() == want.keys()
        want, got = list(want.values()), list(got.values())
    else:
        want, got = [want], [got]
    for value, shape in zip(want, got):
        assert shape.is_meta and shape.shape == value.shape and shape.dtype == value.dtype
        assert torch.isfinite(value).all()  # the real value is a value (the meta one has none to compare)


class _ResumableBatches:
    """A loader Lightning can resume mid-epoch: it has ``state_dict`` and ``load_state_dict`` (as torchdata's
    ``StatefulDataLoader``), the position of its next batch."""

    def __init__(self, batches):
        self.batches, self.position = batches, 0

    def __iter__(self):
        while self.position < len(self.batches):
            self.position += 1
            yield self.batches[self.position - 1]
        self.position = 0

    def __len__(self):
        return len(self.batches)

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_lightning_resumes_persistent_training_sums_mid_epoch_bit_identically(tmp_path):
    # The README's promise: persistent sums and a checkpoint written mid-epoch (every_n_train_steps) resume to the
    # uninterrupted run's value, when the loader resumes after the checkpoint's batch; a plain loader does not.
    lightning = pytest.importorskip("lightning")
    generator = torch.Generator().manual_seed(5)
    batches = [(torch.randn(9, 4, generator=generator), torch.randint(0, 2, (9, C), generator=generator))
               for _ in range(4)]

    class Module(lightning.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, C)
            self.train_lwlrap = MultilabelLWLRAP(C)
            self.train_lwlrap.persistent(True)
            self.logits: List[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.layer(x)
            self.logits.append(logits.detach().clone())
            self.train_lwlrap(logits, y)
            self.log("train_lwlrap", self.train_lwlrap, on_step=False, on_epoch=True)
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

    def fit(module, loader, where, **kwargs):
        callbacks = kwargs.pop("callbacks", [])
        trainer = lightning.Trainer(max_epochs=1, default_root_dir=tmp_path / where, logger=False,
                                    enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.fit(module, loader, **kwargs)
        return trainer.callback_metrics["train_lwlrap"].item(), [str(w.message) for w in caught]

    torch.manual_seed(0)
    whole = Module()
    every_two = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=2,
                                                           save_top_k=-1)
    value, _ = fit(whole, _ResumableBatches(batches), "whole", callbacks=[every_two])
    logits, target = torch.cat(whole.logits), torch.cat([y for _, y in batches])
    assert value == pytest.approx(naive_lwlrap(logits, target), rel=1e-12)  # the epoch, as the model scored it

    middle = tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    torch.manual_seed(1)
    resumed = Module()
    again, _ = fit(resumed, _ResumableBatches(batches), "resumed", ckpt_path=middle)
    assert again == value  # bit-identical
    assert len(resumed.logits) == 2 and torch.equal(torch.cat(resumed.logits), torch.cat(whole.logits[2:]))

    def plain_loader():  # torch's DataLoader, which cannot resume mid-epoch (the batches as they are)
        return torch.utils.data.DataLoader(batches, batch_size=None)

    torch.manual_seed(0)  # the same run with a plain loader: its checkpoints, then a resume from the middle
    every_two = lightning.pytorch.callbacks.ModelCheckpoint(dirpath=tmp_path / "plain", every_n_train_steps=2,
                                                           save_top_k=-1)
    assert fit(Module(), plain_loader(), "plain_whole", callbacks=[every_two])[0] == value
    plain, messages = fit(Module(), plain_loader(), "plain", ckpt_path=tmp_path / "plain" / "epoch=0-step=2.ckpt")
    assert any("not resumable" in message for message in messages), messages  # Lightning's warning, as written
    assert plain != value  # batches 0-1 counted twice, 2-3 never: the README's case for a stateful loader


def test_a_module_made_on_meta_and_cast_keeps_float64_sums_when_materialized():
    # model.to(torch.bfloat16) before to_empty (a bf16-true run built on meta): the sums stay float64 there too, so
    # updates after materializing add exactly.
    with torch.device("meta"):
        module = _MetaBuilt()
    module.to(torch.bfloat16).to_empty(device="cpu")
    assert module.head.weight.dtype == torch.bfloat16
    assert module.val_lwlrap.precision_sum.dtype == torch.float64 and module.val_loss.ranking_loss_sum.dtype == torch.float64
    assert module.val_lwlrap._defaults["precision_sum"].dtype == torch.float64
    preds, target = _batches(C, 1, ignore=True)[0]
    module.val_lwlrap.update(preds, target)
    assert module.val_lwlrap.compute().item() == pytest.approx(naive_lwlrap(preds, target, "index", -1), rel=1e-12)
