"""Core semantics: worked examples, scikit-learn, the naive formula loops, every engine path and device."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score as sklearn_lrap
from torchmetrics import MetricCollection

from tests.reference import naive_lrap, naive_lwlrap, naive_lwlrap_per_class
from torch_lwlrap import (
    MultilabelLRAP,
    MultilabelLWLRAP,
    __version__,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_lwlrap_per_class,
)
from tests.conftest import DEVICES, ENGINE_PATHS
from torch_lwlrap._ranking import use_engine

ENGINES = ENGINE_PATHS


def random_case(seed, n=None, c=None, levels=4, density=0.3, device="cpu"):
    """Small integer scores (heavy ties) and sparse-ish labels."""
    g = torch.Generator().manual_seed(seed)
    n = n if n is not None else int(torch.randint(1, 40, (1,), generator=g))
    c = c if c is not None else int(torch.randint(1, 12, (1,), generator=g))
    preds = torch.randint(0, levels, (n, c), generator=g).double()
    target = (torch.rand(n, c, generator=g) < density).long()
    return preds.to(device), target.to(device)


def test_version():
    assert isinstance(__version__, str) and __version__.count(".") == 2


# ----------------------------------------------------------------------------------------------------------------
# Worked examples of the original write-ups


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("engine", ENGINES)
def test_worked_examples(device, engine):
    scores = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]], device=device)
    with use_engine(engine):
        # scikit-learn's user guide examples
        assert multilabel_lrap(scores, torch.tensor([[1, 0, 0], [0, 0, 1]], device=device)).item() == pytest.approx(
            5 / 12, abs=1e-15
        )
        assert multilabel_lrap(scores, torch.tensor([[1, 0, 1], [0, 0, 1]], device=device)).item() == pytest.approx(
            2 / 3, abs=1e-15
        )
        # torchmetrics' 3x3 example: (1/2 + (1/1 + 2/3)/2 + 1) / 3 = 0.7777...
        scores3 = torch.tensor([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1], [0.9, 0.7, 0.6]], device=device)
        target3 = torch.tensor([[1, 0, 0], [1, 0, 1], [1, 1, 0]], device=device)
        assert multilabel_lrap(scores3, target3).item() == pytest.approx(7 / 9, abs=1e-15)
        # the challenge notebook's lwlrap example
        preds = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]], device=device)
        target = torch.tensor([[1, 0, 1], [0, 1, 1]], device=device)
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(0.7916666666666666, abs=1e-15)
        per_class, weights = multilabel_lwlrap_per_class(preds, target)
        torch.testing.assert_close(per_class.cpu(), torch.tensor([2 / 3, 1.0, 0.75], dtype=torch.float64))
        torch.testing.assert_close(weights.cpu(), torch.tensor([0.25, 0.25, 0.5], dtype=torch.float64))
        macro = multilabel_lwlrap(preds, target, average="macro").item()
        assert macro == pytest.approx((2 / 3 + 1 + 0.75) / 3, abs=1e-15)


def test_tie_rules_on_a_fully_tied_row():
    preds = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    target = torch.tensor([[0, 1, 0, 1]])
    # "max": every label has rank 4 and 2 positives at or above it -> 2/4 each
    assert multilabel_lrap(preds, target, ties="max").item() == pytest.approx(0.5, rel=1e-12)
    # "index": columns ranked 1..4 in order -> column 1: 1/2, column 3: 2/4
    assert multilabel_lrap(preds, target, ties="index").item() == pytest.approx((1 / 2 + 2 / 4) / 2, rel=1e-12)
    assert multilabel_lwlrap(preds, target, ties="index", average="none")[[1, 3]].tolist() == [0.5, 0.5]


def test_scores_are_ranked_raw_not_through_sigmoid():
    # float32 sigmoid of 20 and 30 is exactly 1.0; ranked raw, 30 is strictly ahead of 20.
    preds = torch.tensor([[20.0, 30.0, -5.0]])
    target = torch.tensor([[1, 0, 0]])
    assert multilabel_lrap(preds, target).item() == pytest.approx(0.5, rel=1e-12)
    assert multilabel_lrap(torch.sigmoid(preds), target).item() == pytest.approx(0.5, rel=1e-12)  # tie -> rank 2 too
    target = torch.tensor([[0, 1, 0]])
    assert multilabel_lrap(preds, target).item() == 1.0
    assert multilabel_lrap(torch.sigmoid(preds), target).item() == pytest.approx(0.5, rel=1e-12)


def test_infinite_scores():
    inf = float("inf")
    preds = torch.tensor([[inf, -inf, 0.0, inf], [-inf, -inf, 1.0, 2.0]])
    target = torch.tensor([[0, 1, 0, 1], [1, 0, 0, 0]])
    for ties in ("max", "index"):
        expected = naive_lwlrap(preds.numpy(), target.numpy(), ties=ties)
        assert multilabel_lwlrap(preds, target, ties=ties).item() == pytest.approx(expected, abs=1e-15)


# ----------------------------------------------------------------------------------------------------------------
# Random data against scikit-learn and the naive loops


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("device", DEVICES)
def test_against_sklearn(engine, device):
    for seed in range(60):
        preds, target = random_case(seed, device=device)
        p, t = preds.cpu().numpy(), target.cpu().numpy()
        weights = np.random.default_rng(seed).uniform(0, 2, size=len(p))
        with use_engine(engine, chunk_elements=1 + seed % 17):
            assert multilabel_lrap(preds, target).item() == pytest.approx(sklearn_lrap(t, p), abs=1e-12)
            got = multilabel_lrap(preds, target, sample_weight=torch.tensor(weights, device=device)).item()
            assert got == pytest.approx(sklearn_lrap(t, p, sample_weight=weights), abs=1e-12)
            if t.sum() > 0:
                # overall lwlrap = LRAP with each sample weighted by its number of positives
                expected = sklearn_lrap(t, p, sample_weight=t.sum(1))
                assert multilabel_lwlrap(preds, target).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("device", DEVICES)
def test_against_naive_loops(engine, ties, device):
    for seed in range(40):
        preds, target = random_case(seed, device=device, density=0.2 + 0.6 * (seed % 3) / 2)
        if seed % 2:  # mark some labels unknown
            unknown = torch.rand(target.shape, generator=torch.Generator().manual_seed(seed)) < 0.25
            target = target.masked_fill(unknown.to(device), -1)
            ignore_index = -1
        else:
            ignore_index = None
        p, t = preds.cpu().numpy(), target.cpu().numpy()
        with use_engine(engine, chunk_elements=1 + seed % 23):
            for average in ("weighted", "macro"):
                expected = naive_lwlrap(p, t, ties=ties, ignore_index=ignore_index, average=average)
                got = multilabel_lwlrap(preds, target, average=average, ties=ties, ignore_index=ignore_index)
                if math.isnan(expected):
                    assert torch.isnan(got)
                else:
                    assert got.item() == pytest.approx(expected, abs=1e-12)
            if (t == 1).any():
                expected = naive_lwlrap(p, t, ties=ties, ignore_index=ignore_index, average="none")
                got = multilabel_lwlrap(preds, target, average="none", ties=ties, ignore_index=ignore_index)
                np.testing.assert_allclose(got.cpu().numpy(), expected, atol=1e-12)
                per_class, weights, _ = naive_lwlrap_per_class(p, t, ties=ties, ignore_index=ignore_index)
                got_pc, got_w = multilabel_lwlrap_per_class(preds, target, ties=ties, ignore_index=ignore_index)
                np.testing.assert_allclose(got_pc.cpu().numpy(), per_class, atol=1e-12)
                np.testing.assert_allclose(got_w.cpu().numpy(), weights, atol=1e-15)
            expected = naive_lrap(p, t, ties=ties, ignore_index=ignore_index)
            got = multilabel_lrap(preds, target, ties=ties, ignore_index=ignore_index)
            assert got.item() == pytest.approx(expected, abs=1e-12)


def test_engines_agree_on_larger_data():
    g = torch.Generator().manual_seed(7)
    preds = torch.randint(0, 50, (3000, 97), generator=g).float()
    target = torch.rand(3000, 97, generator=g) < 0.05
    results = {}
    for engine in ENGINES:
        with use_engine(engine):
            results[engine] = (
                multilabel_lwlrap(preds, target, average="none"),
                multilabel_lrap(preds, target, ties="index"),
            )
    torch.testing.assert_close(results["sort"][0], results["count"][0], rtol=0, atol=1e-12, equal_nan=True)
    torch.testing.assert_close(results["sort"][1], results["count"][1], rtol=0, atol=1e-12)
    expected = sklearn_lrap(target.numpy(), preds.numpy(), sample_weight=target.sum(1).numpy())
    assert multilabel_lwlrap(preds, target).item() == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Shapes, dtypes, accumulation


@pytest.mark.parametrize("device", DEVICES)
def test_batch_accumulation_equals_one_call(device):
    preds, target = random_case(11, n=200, c=9, device=device)
    weight = torch.rand(200, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(device)
    lw = MultilabelLWLRAP(9, average="none").to(device)
    lr = MultilabelLRAP(9).to(device)
    splits = torch.randperm(199, generator=torch.Generator().manual_seed(5))[:12].add(1).sort().values.tolist()
    bounds = [0, *splits, 200]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        lw.update(preds[start:stop], target[start:stop])
        lr.update(preds[start:stop], target[start:stop], sample_weight=weight[start:stop])
    torch.testing.assert_close(lw.compute(), multilabel_lwlrap(preds, target, average="none"), atol=1e-12, rtol=0)
    expected = sklearn_lrap(target.cpu().numpy(), preds.cpu().numpy(), sample_weight=weight.cpu().numpy())
    assert lr.compute().item() == pytest.approx(expected, abs=1e-12)


def test_extra_dimensions_become_samples():
    g = torch.Generator().manual_seed(2)
    preds = torch.randint(0, 3, (4, 5, 6), generator=g).float()  # (N, C, T)
    target = (torch.rand(4, 5, 6, generator=g) < 0.4).int()
    flat_p = preds.permute(0, 2, 1).reshape(-1, 5)
    flat_t = target.permute(0, 2, 1).reshape(-1, 5)
    assert multilabel_lwlrap(preds, target).item() == pytest.approx(
        naive_lwlrap(flat_p.numpy(), flat_t.numpy()), abs=1e-12
    )
    weight = torch.arange(1.0, 5.0)
    expected = sklearn_lrap(flat_t.numpy(), flat_p.numpy(), sample_weight=weight.repeat_interleave(6).numpy())
    assert multilabel_lrap(preds, target, sample_weight=weight).item() == pytest.approx(expected, abs=1e-12)
    full_weight = weight[:, None].expand(4, 6)
    assert multilabel_lrap(preds, target, sample_weight=full_weight).item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16,
                                   torch.float32, torch.float64])
def test_every_target_dtype(dtype):
    preds, target = random_case(4, n=50, c=7)
    expected = naive_lwlrap(preds.numpy(), target.numpy())
    assert multilabel_lwlrap(preds, target.to(dtype)).item() == pytest.approx(expected, abs=1e-12)
    assert multilabel_lrap(preds, target.to(dtype)).item() == pytest.approx(
        sklearn_lrap(target.numpy(), preds.numpy()), abs=1e-12
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_low_precision_preds_ties_are_real_ties(dtype, device):
    g = torch.Generator().manual_seed(9)
    raw = torch.randn(300, 11, generator=g, dtype=torch.float64)
    target = (torch.rand(300, 11, generator=g) < 0.3).to(device)
    preds = raw.to(dtype)  # rounding in low precision creates ties, which count as ties
    reference_scores = preds.double().numpy()
    for ties in ("max", "index"):
        expected = naive_lwlrap(reference_scores, target.cpu().numpy(), ties=ties)
        for engine in ENGINES:
            with use_engine(engine):
                got = multilabel_lwlrap(preds.to(device), target, ties=ties)
            assert got.item() == pytest.approx(expected, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Empty and degenerate cases


def test_empty_batch_is_a_no_op():
    metric = MultilabelLWLRAP(3)
    lrap = MultilabelLRAP(3)
    preds = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]])
    target = torch.tensor([[1, 0, 1], [0, 1, 1]])
    metric.update(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.long))
    lrap.update(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.long))
    assert metric.label_count.sum() == 0 and lrap.weight_sum == 0
    metric.update(preds, target)
    lrap.update(preds, target)
    metric.update(torch.empty(0, 3), torch.empty(0, 3, dtype=torch.long))
    assert metric.compute().item() == pytest.approx(0.7916666666666666, rel=1e-12)
    assert lrap.compute().item() == pytest.approx(sklearn_lrap(target.numpy(), preds.numpy()), rel=1e-12)


def test_no_positive_label_gives_nan_with_a_warning():
    preds = torch.rand(4, 3)
    target = torch.zeros(4, 3)
    for average in ("weighted", "macro"):
        with pytest.warns(UserWarning, match="no target was 1"):
            assert torch.isnan(multilabel_lwlrap(preds, target, average=average))
    assert torch.isnan(multilabel_lwlrap(preds, target, average="none")).all()
    # scikit-learn: a sample without positive scores 1
    assert multilabel_lrap(preds, target).item() == sklearn_lrap(target.numpy(), preds.numpy()) == 1.0
    with pytest.warns(UserWarning, match="without samples"):
        assert torch.isnan(multilabel_lrap(torch.empty(0, 3), torch.empty(0, 3)))


def test_all_positive_and_all_ignored_rows():
    preds = torch.tensor([[0.3, 0.2, 0.1], [0.5, 0.4, 0.3], [0.1, 0.2, 0.3]])
    target = torch.tensor([[1, 1, 1], [-1, -1, -1], [1, 0, -1]])
    # row 0: all positive -> 1; row 1: nothing known -> 1; row 2: column 0 ranked below column 1 -> 1/2
    assert multilabel_lrap(preds, target, ignore_index=-1).item() == pytest.approx((1 + 1 + 0.5) / 3, rel=1e-12)
    assert multilabel_lwlrap(preds, target, ignore_index=-1, average="none").tolist() == [
        pytest.approx((1 + 0.5) / 2, rel=1e-12), 1.0, 1.0
    ]


# ----------------------------------------------------------------------------------------------------------------
# Metric classes


def test_metric_collection_forward_reset_state_dict_pickle():
    preds, target = random_case(21, n=90, c=6)
    collection = MetricCollection({"lwlrap": MultilabelLWLRAP(6), "lrap": MultilabelLRAP(6)})
    batch_values = collection(preds[:40], target[:40])
    want_lwlrap = naive_lwlrap(preds[:40].numpy(), target[:40].numpy())
    assert batch_values["lwlrap"].item() == pytest.approx(want_lwlrap, rel=1e-12)
    want_lrap = sklearn_lrap(target[:40].numpy(), preds[:40].numpy())
    assert batch_values["lrap"].item() == pytest.approx(want_lrap, rel=1e-12)
    collection.update(preds[40:], target[40:])
    values = collection.compute()
    assert values["lwlrap"].item() == pytest.approx(naive_lwlrap(preds.numpy(), target.numpy()), abs=1e-12)
    assert values["lrap"].item() == pytest.approx(sklearn_lrap(target.numpy(), preds.numpy()), abs=1e-12)

    metric = MultilabelLWLRAP(6)
    metric.persistent(True)
    metric.update(preds[:50], target[:50])
    restored = MultilabelLWLRAP(6)
    restored.persistent(True)
    restored.load_state_dict(metric.state_dict())
    unpickled = pickle.loads(pickle.dumps(metric))
    for m in (metric, restored, unpickled):
        m.update(preds[50:], target[50:])
    assert metric.compute().item() == restored.compute().item() == unpickled.compute().item()

    metric.reset()
    assert metric.label_count.sum() == 0 and metric.precision_sum.sum() == 0
    metric.update(preds[:10], target[:10])
    assert metric.compute().item() == pytest.approx(naive_lwlrap(preds[:10].numpy(), target[:10].numpy()), rel=1e-12)


def test_metric_attributes_and_state_types():
    lw, lr = MultilabelLWLRAP(5), MultilabelLRAP(5)
    for m in (lw, lr):
        assert m.higher_is_better is True and m.is_differentiable is False and m.full_state_update is False
    assert lw.precision_sum.dtype == torch.float64 and lw.precision_sum.shape == (5,)
    assert lw.label_count.dtype == torch.int64 and lw.label_count.shape == (5,)
    assert lr.lrap_sum.dtype == torch.float64 and lr.weight_sum.dtype == torch.float64
    assert set(lw._reductions) == {"precision_sum", "label_count", "options_tag"}
    assert set(lr._reductions) == {"lrap_sum", "weight_sum", "options_tag"}


# ----------------------------------------------------------------------------------------------------------------
# Validation: clear errors, and a rejected batch loses nothing


BAD_INPUTS = [
    (lambda: ([[0.1, 0.2]], torch.tensor([[0, 1]])), TypeError, "`preds` must be a torch.Tensor"),
    (lambda: (torch.tensor([[1, 2]]), torch.tensor([[0, 1]])), TypeError, "floating point"),
    (lambda: (torch.tensor([[0.1, float("nan")]]), torch.tensor([[0, 1]])), ValueError, "NaN"),
    (lambda: (torch.rand(2, 2), torch.tensor([[0, 1]])), ValueError, r"\(2, 2\).*\(1, 2\)"),
    (lambda: (torch.rand(2), torch.tensor([0, 1])), ValueError, "at least 2 dimensions"),
    (lambda: (torch.rand(2, 3), torch.ones(2, 3)), ValueError, "Expected 2 labels"),
    (lambda: (torch.rand(1, 2), torch.tensor([[0, 2]])), ValueError, r"found the values \[2\]"),
]


@pytest.mark.parametrize("make, error, message", BAD_INPUTS)
def test_bad_inputs_raise_and_lose_nothing(make, error, message):
    good_p, good_t = torch.tensor([[0.1, 0.7], [0.4, 0.3]]), torch.tensor([[1, 0], [1, 1]])
    for metric in (MultilabelLWLRAP(2), MultilabelLRAP(2)):
        metric.update(good_p, good_t)
        before = {k: v.clone() for k, v in metric.metric_state.items()}
        with pytest.raises(error, match=message):
            metric.update(*make())
        for key, value in metric.metric_state.items():
            assert torch.equal(value, before[key])
        metric.update(good_p, good_t)
        functional = multilabel_lwlrap if isinstance(metric, MultilabelLWLRAP) else multilabel_lrap
        assert metric.compute().item() == pytest.approx(
            functional(torch.cat([good_p, good_p]), torch.cat([good_t, good_t])).item(), rel=1e-12
        )


def test_bad_options_and_sample_weight():
    preds, target = torch.rand(3, 4), torch.ones(3, 4)
    with pytest.raises(ValueError, match="`average`"):
        multilabel_lwlrap(preds, target, average="micro")
    with pytest.raises(ValueError, match="`ties`"):
        multilabel_lrap(preds, target, ties="min")
    with pytest.raises(ValueError, match="`ties`"):
        MultilabelLWLRAP(4, ties="average")
    with pytest.raises(ValueError, match="`num_labels`"):
        MultilabelLRAP(0)
    with pytest.raises(ValueError, match="`ignore_index`"):
        MultilabelLWLRAP(4, ignore_index=1)
    with pytest.raises(ValueError, match=r"`sample_weight` must have shape \(3,\).*\(4,\)"):
        multilabel_lrap(preds, target, sample_weight=torch.ones(4))
    with pytest.raises(ValueError, match=r"non-negative.*-1\.0"):
        multilabel_lrap(preds, target, sample_weight=torch.tensor([1.0, -1.0, 2.0]))
    with pytest.raises(ValueError, match="target` must contain only 0, 1 and ignore_index=-1"):
        multilabel_lwlrap(preds, torch.full((3, 4), -2), ignore_index=-1)


def test_validate_args_false_skips_value_checks_only():
    preds = torch.tensor([[0.2, 0.8]])
    # values are not inspected ...
    assert multilabel_lwlrap(preds, torch.tensor([[1, 0]]), validate_args=False).item() == 0.5
    # ... but shapes always are
    with pytest.raises(ValueError, match="same shape"):
        multilabel_lwlrap(preds, torch.tensor([[1, 0, 1]]), validate_args=False)


# Each fast path of the value checks (range of an integer target, non-zero count of any other target, minimum of the
# scores) against a value that only the exact check would catch.
TARGET_CASES = [
    # (dtype, ignore_index, value placed in one cell, accepted)
    (torch.int64, None, 1, True),
    (torch.int64, None, 2, False),
    (torch.int64, None, -1, False),
    (torch.int64, -1, -1, True),
    (torch.int64, -1, -2, False),
    (torch.int64, 2, 2, True),
    (torch.int64, 2, 3, False),
    (torch.int64, 5, 5, True),
    (torch.int64, 5, 3, False),  # allowed values {0, 1, 5} are no range: counted
    (torch.int8, -100, -100, True),
    (torch.int8, -100, -99, False),
    (torch.uint8, -1, 255, False),  # -1 cannot be a uint8 value: 255 is not taken for it
    (torch.float32, None, 0.5, False),
    (torch.float32, None, 1e-45, False),  # a denormal next to 0
    (torch.float32, None, 1 - 2**-24, False),  # next to 1
    (torch.float32, None, float("nan"), False),
    (torch.float32, None, float("inf"), False),
    (torch.float32, -1, -1.0, True),
    (torch.float32, -1, -0.5, False),
    (torch.float16, -1, -1.0, True),
    (torch.float64, 7, 7.0, True),
    (torch.float64, 7, 7.5, False),
    (torch.float64, None, -0.0, True),
]


@pytest.mark.parametrize("dtype, ignore_index, value, accepted", TARGET_CASES)
@pytest.mark.parametrize("device", DEVICES)
def test_target_value_checks(dtype, ignore_index, value, accepted, device):
    preds = torch.rand(4, 5, generator=torch.Generator().manual_seed(0)).to(device)
    target = torch.tensor([[1, 0, 0, 1, 0]] * 4, dtype=dtype)
    target[2, 3] = value
    target = target.to(device)
    if accepted:
        known = target != ignore_index if ignore_index is not None else torch.ones_like(target, dtype=torch.bool)
        expected = naive_lwlrap(preds.cpu().numpy(), target.cpu().double().numpy(), ignore_index=ignore_index)
        got = multilabel_lwlrap(preds, target, ignore_index=ignore_index).item()
        assert got == pytest.approx(expected, abs=1e-12) and known.any()
    else:
        with pytest.raises(ValueError, match=r"Argument `target` must contain only 0(,| and) 1"):
            multilabel_lwlrap(preds, target, ignore_index=ignore_index)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("device", DEVICES)
def test_nan_scores_are_found_among_infinities(dtype, device):
    preds = torch.tensor([[float("inf"), float("-inf"), 0.0], [1.0, -1.0, 2.0]], dtype=dtype, device=device)
    target = torch.tensor([[1, 0, 1], [0, 1, 0]], device=device)
    want = naive_lwlrap(preds.cpu().double(), target.cpu())
    assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, rel=1e-12)
    preds[1, 2] = float("nan")
    with pytest.raises(ValueError, match=r"`preds` contains NaN \(first at index \(1, 2\)\)"):
        multilabel_lwlrap(preds, target)


@pytest.mark.parametrize("engine", ["auto"] + ENGINES)
def test_nan_scores_are_found_by_every_engine_path_in_any_row(engine):
    # On the numba path the NaN check happens in the ranking pass itself: it must cover rows without a positive,
    # extra dimensions (the index names the input's own shape) and every score dtype, and lose no state.
    preds = torch.rand(4, 5, 3, generator=torch.Generator().manual_seed(1))
    target = torch.zeros(4, 5, 3, dtype=torch.long)
    target[0, 1, 0] = 1
    preds[3, 2, 1] = float("nan")  # sample (3, t=1) has no positive
    metric = MultilabelLWLRAP(5)
    metric.update(preds[:1], target[:1])
    before = metric.precision_sum.clone(), metric.label_count.clone()
    with use_engine(engine):
        for dtype in (torch.float16, torch.float32, torch.float64):
            with pytest.raises(ValueError, match=r"`preds` contains NaN \(first at index \(3, 2, 1\)\)"):
                multilabel_lwlrap(preds.to(dtype), target)
            with pytest.raises(ValueError, match=r"`preds` contains NaN \(first at index \(3, 2, 1\)\)"):
                multilabel_lrap(preds.to(dtype), target)
        with pytest.raises(ValueError, match="NaN"):
            metric.update(preds, target)
        assert torch.equal(metric.precision_sum, before[0]) and torch.equal(metric.label_count, before[1])
        # validate_args=False looks at no value: no error (the NaN sample has no positive, so no rank meets it)
        assert multilabel_lwlrap(preds, target, validate_args=False).item() == pytest.approx(
            naive_lwlrap(preds[:, :, [0]].numpy(), target[:, :, [0]].numpy()), rel=1e-12
        )


@pytest.mark.parametrize("engine", ENGINES)
def test_ranking_sums_check_nan_on_every_path(engine):
    # The engine's own NaN check: in the numba pass, by one read of the scores on the other paths.
    from torch_lwlrap._ranking import ScoresContainNaN, ranking_sums

    preds, target = random_case(3, n=6, c=5)
    positive = target == 1
    with use_engine(engine):
        clean = ranking_sums(preds, positive, check_nan=True)
        expected = ranking_sums(preds, positive)
        torch.testing.assert_close(clean.class_precision_sum, expected.class_precision_sum, rtol=0, atol=1e-12)
        preds[4, 1] = float("nan")
        with pytest.raises(ScoresContainNaN):
            ranking_sums(preds, positive, check_nan=True)
