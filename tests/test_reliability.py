"""Reliability tests: the failures users actually hit.

* property-based comparisons with the naive loops of :mod:`tests.reference` (and scikit-learn) on every engine
  path, with ties, infinite scores, ignored labels, extra dimensions, sample weights and tiny chunk sizes;
* layout and dtype invariance (strided, transposed, expanded, half precision inputs);
* exact accumulation over millions of rows;
* nothing lost: a rejected batch leaves every state bit untouched, through ``update`` and ``forward``;
* checkpoint and resume, bit for bit;
* determinism across chunk sizes and batch splits.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from sklearn.metrics import label_ranking_average_precision_score as sklearn_lrap

from tests.conftest import DEVICES, engine_paths_for
from tests.reference import label_precisions, naive_lrap, naive_lwlrap, naive_lwlrap_per_class
from torch_lwlrap import (
    MultilabelLRAP,
    MultilabelLWLRAP,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_lwlrap_per_class,
)
from torch_lwlrap._ranking import use_engine

AVERAGES = ("weighted", "macro", "none")
TIES = ("max", "index", "expected")
IGNORE = -1
TOL = 1e-12
#: Every (device, engine path) pair the property-based tests check on each drawn case.
ENGINES_ON_DEVICES = [(device, engine) for device in DEVICES for engine in engine_paths_for(device)]


# ----------------------------------------------------------------------------------------------------------------
# Helpers


def assert_matches(actual, expected, *, rtol: float = TOL, atol: float = TOL) -> None:
    """``actual`` (a float64 tensor) equals ``expected`` (float or list, NaN where NaN) to ``rtol``/``atol``."""
    assert isinstance(actual, torch.Tensor)
    assert actual.dtype == torch.float64
    np.testing.assert_allclose(
        actual.detach().cpu().numpy(), np.asarray(expected, dtype=np.float64), rtol=rtol, atol=atol, equal_nan=True
    )


def call(fn, *, undefined: bool):
    """Run ``fn``; when the value is undefined (NaN) it must come with the library's warning, else none at all."""
    if undefined:
        with pytest.warns(UserWarning, match="undefined"):
            return fn()
    return fn()


def is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


@dataclass
class Case:
    scores: np.ndarray  # float64 (N, C) or (N, C, d)
    target: np.ndarray  # int64, same shape; 0, 1 and IGNORE when ignore_index is set
    ignore_index: Optional[int]
    weight: Optional[np.ndarray]  # float64 (N,) or (N, d), non-negative

    @property
    def num_labels(self) -> int:
        return self.scores.shape[1]

    def tensors(self, device="cpu"):
        weight = None if self.weight is None else torch.from_numpy(self.weight).to(device)
        return torch.from_numpy(self.scores).to(device), torch.from_numpy(self.target).to(device), weight


SMALL_INTS = st.integers(-2, 2).map(float)
INFINITIES = st.sampled_from([-math.inf, math.inf])
WEIGHTS = st.one_of(st.just(0.0), st.integers(0, 4).map(float), st.floats(0, 1e3, allow_subnormal=False))


@st.composite
def cases(draw, *, ignore=True, extra_dims=True, weights=True, finite=False):
    """Random small batches: heavy ties, +/-inf, fully tied rows, all-positive / no-positive / all-ignored rows."""
    n = draw(st.integers(1, 9), label="N")
    c = draw(st.integers(1, 8), label="C")
    d = draw(st.sampled_from([None, None, 1, 2, 3]), label="d") if extra_dims else None
    m = n * (d or 1)
    kinds = ["small integers", "floats"] if finite else ["small integers", "small integers and inf", "floats"]
    kind = draw(st.sampled_from(kinds), label="scores")
    elements = {
        "small integers": SMALL_INTS,
        "small integers and inf": st.one_of(SMALL_INTS, INFINITIES),
        "floats": st.floats(allow_nan=False, allow_infinity=not finite),
    }[kind]
    scores = draw(hnp.arrays(np.float64, (m, c), elements=elements))
    tied_rows = draw(hnp.arrays(np.bool_, (m,)), label="fully tied rows")
    scores[tied_rows] = scores[tied_rows, :1]

    ignore_index = draw(st.sampled_from([None, IGNORE]), label="ignore_index") if ignore else None
    values = [0, 1] + ([IGNORE] if ignore_index is not None else [])
    target = draw(hnp.arrays(np.int64, (m, c), elements=st.sampled_from(values)))
    # 0: as drawn, 1: all positive, 2: no positive, 3: all ignored
    modes = [0, 0, 0, 1, 2] + ([3] if ignore_index is not None else [])
    row_mode = draw(hnp.arrays(np.int64, (m,), elements=st.sampled_from(modes)), label="row modes")
    target[row_mode == 1] = 1
    target[row_mode == 2] = 0
    target[row_mode == 3] = IGNORE

    if d is not None:  # rows (n, d) -> (N, C, d)
        scores = np.ascontiguousarray(scores.reshape(n, d, c).transpose(0, 2, 1))
        target = np.ascontiguousarray(target.reshape(n, d, c).transpose(0, 2, 1))
    weight = None
    if weights and draw(st.booleans(), label="weighted"):
        shape = draw(st.sampled_from([(n,), (n, d)] if d is not None else [(n,)]), label="weight shape")
        weight = draw(hnp.arrays(np.float64, shape, elements=WEIGHTS))
    return Case(scores, target, ignore_index, weight)


def draw_chunk(data, case: Case, engine: str) -> Optional[int]:
    """None (the default budget) or a chunk of a few rows (or positives), so most batches span several chunks."""
    return data.draw(st.one_of(st.none(), st.integers(1, 3 * case.num_labels + 1)), label=f"chunk_elements[{engine}]")


# ----------------------------------------------------------------------------------------------------------------
# Property-based comparisons with the naive references


@given(case=cases(), ties=st.sampled_from(TIES), data=st.data())
def test_functions_match_naive_references_on_every_engine(case, ties, data):
    ignore_index = case.ignore_index
    lwlrap_ref = {avg: naive_lwlrap(case.scores, case.target, ties, ignore_index, avg) for avg in AVERAGES}
    per_class_ref, weights_ref, _ = naive_lwlrap_per_class(case.scores, case.target, ties, ignore_index)
    lrap_ref = naive_lrap(case.scores, case.target, ties, ignore_index)
    weighted_lrap_ref = None
    if case.weight is not None:
        weighted_lrap_ref = naive_lrap(case.scores, case.target, ties, ignore_index, sample_weight=case.weight)

    for device, engine in ENGINES_ON_DEVICES:
        preds, target, weight = case.tensors(device)
        chunk = draw_chunk(data, case, engine)
        with use_engine(engine, chunk_elements=chunk):
            for average in AVERAGES:
                expected = lwlrap_ref[average]
                got = call(
                    lambda: multilabel_lwlrap(preds, target, ties=ties, ignore_index=ignore_index, average=average),
                    undefined=is_nan(expected),
                )
                assert_matches(got, expected)
            per_class, weights = multilabel_lwlrap_per_class(preds, target, ties=ties, ignore_index=ignore_index)
            assert_matches(per_class, per_class_ref)
            assert_matches(weights, weights_ref)
            assert_matches(multilabel_lrap(preds, target, ties=ties, ignore_index=ignore_index), lrap_ref)
            if weight is not None:
                got = call(
                    lambda: multilabel_lrap(preds, target, sample_weight=weight, ties=ties, ignore_index=ignore_index),
                    undefined=is_nan(weighted_lrap_ref),
                )
                assert_matches(got, weighted_lrap_ref)


@given(case=cases(ignore=False, extra_dims=False, finite=True), data=st.data())
def test_lrap_matches_sklearn_on_every_engine(case, data):
    expected = sklearn_lrap(case.target, case.scores)
    weighted = case.weight is not None and case.weight.sum() > 0
    if weighted:
        expected_weighted = sklearn_lrap(case.target, case.scores, sample_weight=case.weight)
    for device, engine in ENGINES_ON_DEVICES:
        preds, target, weight = case.tensors(device)
        with use_engine(engine, chunk_elements=draw_chunk(data, case, engine)):
            assert_matches(multilabel_lrap(preds, target), expected)
            metric = MultilabelLRAP(case.num_labels).to(device)
            metric.update(preds, target)
            assert_matches(metric.compute(), expected)
            if weighted:
                assert_matches(multilabel_lrap(preds, target, sample_weight=weight), expected_weighted)


@given(case=cases(), ties=st.sampled_from(TIES), data=st.data())
def test_metrics_over_random_batch_splits_match_naive_references(case, ties, data):
    """Batches of any size (empty ones included) through ``update`` or ``forward``: the total equals one call."""
    n, c, ignore_index = case.scores.shape[0], case.num_labels, case.ignore_index
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4), label="batch boundaries"))
    bounds = [0, *cuts, n]
    device, engine = data.draw(st.sampled_from(ENGINES_ON_DEVICES), label="device and engine")
    average = data.draw(st.sampled_from(AVERAGES), label="average")
    use_forward = data.draw(st.booleans(), label="forward")
    preds, target, weight = case.tensors(device)
    lwlrap = MultilabelLWLRAP(c, average=average, ties=ties, ignore_index=ignore_index).to(device)
    lrap = MultilabelLRAP(c, ties=ties, ignore_index=ignore_index).to(device)
    with use_engine(engine, chunk_elements=draw_chunk(data, case, engine)):
        for lo, hi in zip(bounds, bounds[1:]):
            p, t = preds[lo:hi], target[lo:hi]
            w = None if weight is None else weight[lo:hi]
            if use_forward:
                expected = naive_lwlrap(case.scores[lo:hi], case.target[lo:hi], ties, ignore_index, average)
                batch_value = call(lambda: lwlrap(p, t), undefined=is_nan(expected) and average != "none")
                assert_matches(batch_value, expected)
                expected = naive_lrap(
                    case.scores[lo:hi], case.target[lo:hi], ties, ignore_index, None if w is None else w.cpu().numpy()
                )
                assert_matches(call(lambda: lrap(p, t, sample_weight=w), undefined=is_nan(expected)), expected)
            else:
                lwlrap.update(p, t)
                lrap.update(p, t, sample_weight=w)
        expected = naive_lwlrap(case.scores, case.target, ties, ignore_index, average)
        assert_matches(call(lwlrap.compute, undefined=is_nan(expected) and average != "none"), expected)
        expected = naive_lrap(case.scores, case.target, ties, ignore_index, case.weight)
        assert_matches(call(lrap.compute, undefined=is_nan(expected)), expected)


# ----------------------------------------------------------------------------------------------------------------
# Layout and dtype invariance


def layout_case(n=24, c=7, seed=7):
    """Scores that are multiples of 1/8 in [-2, 2] (exact in float16 and bfloat16) with ties, inf and ignored labels."""
    g = torch.Generator().manual_seed(seed)
    preds = torch.randint(-16, 17, (n, c), generator=g).double() / 8
    preds[3] = 0.5  # a fully tied row
    preds[5, 2], preds[6, 0], preds[6, 1] = math.inf, -math.inf, -math.inf
    target = (torch.rand(n, c, generator=g) < 0.35).long()
    target[torch.rand(n, c, generator=g) < 0.15] = IGNORE
    target[4] = IGNORE  # a fully ignored row
    target[8], target[9] = 1, 0  # all positive, no positive
    weight = torch.randint(0, 4, (n,), generator=g).double()
    return preds, target, weight


def all_values(preds, target, weight, ignore_index, ties="max"):
    """Every public value of a batch, as one flat float64 tensor on the CPU."""
    values = [multilabel_lwlrap(preds, target, ties=ties, ignore_index=ignore_index, average=a) for a in AVERAGES]
    values += list(multilabel_lwlrap_per_class(preds, target, ties=ties, ignore_index=ignore_index))
    values += [multilabel_lrap(preds, target, ties=ties, ignore_index=ignore_index)]
    values += [multilabel_lrap(preds, target, sample_weight=weight, ties=ties, ignore_index=ignore_index)]
    return torch.cat([v.reshape(-1).cpu() for v in values])


def naive_values(preds, target, weight, ignore_index, ties="max"):
    p, t, w = preds.double().cpu().numpy(), target.cpu().numpy(), weight.double().cpu().numpy()
    values = [naive_lwlrap(p, t, ties, ignore_index, a) for a in AVERAGES]
    per_class, weights, _ = naive_lwlrap_per_class(p, t, ties, ignore_index)
    values += [per_class, weights, naive_lrap(p, t, ties, ignore_index), naive_lrap(p, t, ties, ignore_index, w)]
    return np.concatenate([np.atleast_1d(np.asarray(v, dtype=np.float64)) for v in values])


def _column_step(x):
    big = x.new_zeros((x.shape[0], 2 * x.shape[1]))
    big[:, ::2] = x
    return big[:, ::2]


def _row_step(x):
    big = x.new_zeros((3 * x.shape[0], x.shape[1]))
    big[::3] = x
    return big[::3]


def _transposed(x):
    return x.t().contiguous().t()


LAYOUTS = {
    "column step": _column_step,
    "row step": _row_step,
    "transposed": _transposed,
    "transposed with a step": lambda x: _column_step(x.t().contiguous()).t(),  # column-major rows with gaps
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("ties", TIES)
def test_strided_and_transposed_inputs(layout, ties, engine, device):
    preds, target, weight = layout_case()
    expected = all_values(preds, target, weight, IGNORE, ties)
    assert_matches(expected, naive_values(preds, target, weight, IGNORE, ties))
    make = LAYOUTS[layout]
    # views made on the device itself (copying a view with gaps to another device makes it contiguous)
    p, t, w = make(preds.to(device)), make(target.to(device)), _row_step(weight.to(device)[:, None])[:, 0]
    assert not p.is_contiguous() and not t.is_contiguous() and not w.is_contiguous()
    assert_matches(all_values(p, t, w, IGNORE, ties), expected.numpy())
    # mixed layouts: strided scores with contiguous labels and the other way round
    assert_matches(all_values(p, target.to(device), w, IGNORE, ties), expected.numpy())
    assert_matches(all_values(preds.to(device), t, weight.to(device), IGNORE, ties), expected.numpy())


@pytest.mark.parametrize("ties", TIES)
def test_expanded_stride_zero_inputs(ties, engine, device):
    preds, target, weight = layout_case()
    # one row repeated (stride 0), the labels of one row for every sample, and a broadcast weight
    row_labels = torch.tensor([[1, 0, IGNORE, 1, 0, 0, 1]], device=device)
    p = preds[2:3].to(device).expand(5, -1)
    t = row_labels.expand(5, -1)
    w = torch.tensor(2.5, dtype=torch.float64, device=device).expand(5)
    assert p.stride(0) == t.stride(0) == w.stride(0) == 0
    expected = all_values(p.contiguous(), t.contiguous(), w.contiguous(), IGNORE, ties)
    assert_matches(expected, naive_values(p, t, w, IGNORE, ties))
    assert_matches(all_values(p, t, w, IGNORE, ties), expected.numpy())

    t_all = row_labels.expand(preds.shape[0], -1)
    expected = naive_values(preds, t_all, weight, IGNORE, ties)
    assert_matches(all_values(preds.to(device), t_all, weight.to(device), IGNORE, ties), expected)


@pytest.mark.parametrize("ties", TIES)
def test_extra_dimensions_in_any_layout(ties, engine, device):
    g = torch.Generator().manual_seed(3)
    n, c, d = 6, 5, 4
    preds = (torch.randint(-8, 9, (n, d, c), generator=g).double() / 8).to(device).permute(0, 2, 1)  # (N, C, d)
    target = (torch.rand(n, d, c, generator=g) < 0.4).long().to(device).permute(0, 2, 1)
    target[0, :, 1] = IGNORE
    weight = torch.rand(d, n, generator=g).double().to(device).t()  # (N, d), transposed
    assert not preds.is_contiguous() and not weight.is_contiguous()
    expected = naive_values(preds, target, weight, IGNORE, ties)
    assert_matches(all_values(preds, target, weight, IGNORE, ties), expected)
    assert_matches(all_values(preds.contiguous(), target.contiguous(), weight.contiguous(), IGNORE, ties), expected)


PRED_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TARGET_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


@pytest.mark.parametrize("preds_dtype", PRED_DTYPES, ids=str)
@pytest.mark.parametrize("target_dtype", TARGET_DTYPES, ids=str)
def test_every_preds_and_target_dtype_gives_the_float64_result(preds_dtype, target_dtype, engine, device):
    preds, target, weight = layout_case()
    ignore_index = None if target_dtype in (torch.bool, torch.uint8) else IGNORE
    if ignore_index is None:
        target = target.clamp(min=0)  # no ignored labels where the dtype cannot hold -1
    expected = all_values(preds, target, weight, ignore_index)
    assert_matches(expected, naive_values(preds, target, weight, ignore_index))
    p, t = preds.to(device, preds_dtype), target.to(device, target_dtype)
    assert torch.equal(p.double().cpu(), preds)  # the scores are exact in every dtype
    got = all_values(p, t, weight.to(device, torch.float32), ignore_index)
    assert_matches(got, expected.numpy())
    metric = MultilabelLWLRAP(preds.shape[1], ignore_index=ignore_index).to(device)
    metric.update(p[:10], t[:10])
    metric.update(p[10:], t[10:])
    assert_matches(metric.compute(), expected[0].item())


def test_ignore_index_outside_the_target_dtype_is_not_wrapped_around():
    """-1 does not exist in uint8: a 255 label is an invalid value, not an ignored one (and 255 is not -1 in int8)."""
    preds = torch.tensor([[0.1, 0.5, 0.3, 0.2]])
    with pytest.raises(ValueError, match=r"`target`.*\[255\]"):
        multilabel_lwlrap(preds, torch.tensor([[255, 1, 0, 1]], dtype=torch.uint8), ignore_index=-1)
    with pytest.raises(ValueError, match=r"`target`.*\[-1\]"):
        multilabel_lrap(preds, torch.tensor([[-1, 1, 0, 1]], dtype=torch.int8), ignore_index=255)
    # without value checks nothing is ignored: 255 and -1 are simply not positive
    target = torch.tensor([[255, 1, 0, 1]], dtype=torch.uint8)
    expected = naive_lwlrap(preds.numpy(), [[0, 1, 0, 1]], "max", None, "weighted")
    assert_matches(multilabel_lwlrap(preds, target, ignore_index=-1, validate_args=False), expected)
    target = torch.tensor([[-1, 1, 0, 1]], dtype=torch.int8)
    assert_matches(multilabel_lwlrap(preds, target, ignore_index=255, validate_args=False), expected)
    # a representable ignore_index still works in a narrow dtype
    target = torch.tensor([[255, 1, 0, 1]], dtype=torch.uint8)
    expected = naive_lwlrap(preds.numpy(), target.numpy(), "max", 255, "weighted")
    assert_matches(multilabel_lwlrap(preds, target, ignore_index=255), expected)


# ----------------------------------------------------------------------------------------------------------------
# Exact accumulation


def _patterns(num_patterns: int, c: int, seed: int):
    """Rows to tile, with their exact per-label precisions from the naive reference."""
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 5, (num_patterns, c)) / 4
    scores[2] = 0.5
    scores[3, :2] = np.inf
    target = (rng.random((num_patterns, c)) < 0.3).astype(np.int64)
    target[0], target[1] = 1, 0
    class_sums = [[Fraction(0)] * c for _ in range(num_patterns)]
    sample_scores = []
    for p in range(num_patterns):
        positives = [j for j in range(c) if target[p, j] == 1]
        precisions = label_precisions(scores[p].tolist(), list(range(c)), positives, "max")
        for j, precision in precisions.items():
            class_sums[p][j] = precision
        trivial = len(positives) in (0, c)
        sample_scores.append(Fraction(1) if trivial else sum(precisions.values()) / len(positives))
    return scores, target, class_sums, sample_scores


def check_exact_accumulation(rows: int, num_batches: int, device: str, c: int = 8, num_patterns: int = 48):
    """Tile pattern rows ``rows`` times, feed them in ``num_batches`` uneven batches, compare with exact fractions."""
    scores, target, class_sums, sample_scores = _patterns(num_patterns, c, seed=11)
    g = torch.Generator().manual_seed(5)
    index = torch.randint(num_patterns, (rows,), generator=g)
    sample_weight = torch.randint(0, 4, (rows,), generator=g).to(torch.float32)
    copies = torch.bincount(index, minlength=num_patterns).tolist()
    weight_per_pattern = torch.bincount(index, weights=sample_weight.double(), minlength=num_patterns).tolist()

    # exact expectations, with fractions
    class_total = [sum(copies[p] * class_sums[p][j] for p in range(num_patterns)) for j in range(c)]
    class_count = [sum(copies[p] * int(target[p, j]) for p in range(num_patterns)) for j in range(c)]
    assert all(class_count)
    per_class = [class_total[j] / class_count[j] for j in range(c)]
    expected = {"weighted": sum(class_total) / sum(class_count), "macro": sum(per_class) / c}
    lrap = sum(Fraction(weight_per_pattern[p]) * sample_scores[p] for p in range(num_patterns))
    lrap /= Fraction(sum(weight_per_pattern))

    preds = torch.from_numpy(scores).float()[index].to(device)
    labels = torch.from_numpy(target).bool()[index].to(device)
    sample_weight = sample_weight.to(device)
    bounds = torch.randint(rows, (num_batches - 1,), generator=g).sort().values.tolist()
    lwlrap_metric = MultilabelLWLRAP(c, average="none").to(device)
    lrap_metric = MultilabelLRAP(c).to(device)
    for lo, hi in zip([0, *bounds], [*bounds, rows]):
        lwlrap_metric.update(preds[lo:hi], labels[lo:hi])
        lrap_metric.update(preds[lo:hi], labels[lo:hi], sample_weight=sample_weight[lo:hi])

    assert lwlrap_metric.label_count.tolist() == class_count
    assert_matches(lwlrap_metric.precision_sum, [float(s) for s in class_total], rtol=1e-9, atol=0)
    assert_matches(lwlrap_metric.compute(), [float(v) for v in per_class], rtol=1e-9, atol=0)
    for average in ("weighted", "macro"):
        metric = MultilabelLWLRAP(c, average=average).to(device)
        metric.merge_state(lwlrap_metric)
        with warnings.catch_warnings():  # torchmetrics counts no update for a merged state
            warnings.filterwarnings("ignore", message=".*called before the ``update``")
            assert_matches(metric.compute(), float(expected[average]), rtol=1e-9, atol=0)
    assert lrap_metric.weight_sum.item() == sum(weight_per_pattern)
    assert_matches(lrap_metric.compute(), float(lrap), rtol=1e-9, atol=0)


def test_many_batches_accumulate_exactly_on_every_engine(engine, device):
    check_exact_accumulation(rows=1 << 17, num_batches=100, device=device)


@pytest.mark.slow  # 7 s to 45 s on two busy CPU cores
def test_millions_of_rows_accumulate_exactly(device):
    check_exact_accumulation(rows=1 << 21, num_batches=128, device=device)


@pytest.mark.parametrize("cast", ["to(bfloat16)", "to(dtype=float16)", "half", "bfloat16", "float"])
def test_module_casts_keep_the_float64_sums(cast, device):
    """Mixed-precision trainers cast whole modules (``module.to(torch.bfloat16)``): the sums must stay exact."""
    preds, target, weight = layout_case(n=300, c=7)
    reference_lwlrap, reference_lrap = MultilabelLWLRAP(7, ignore_index=IGNORE), MultilabelLRAP(7, ignore_index=IGNORE)
    lwlrap, lrap = MultilabelLWLRAP(7, ignore_index=IGNORE), MultilabelLRAP(7, ignore_index=IGNORE)
    module = torch.nn.ModuleDict({"lwlrap": lwlrap, "lrap": lrap}).to(device)
    for m in (reference_lwlrap, reference_lrap, lwlrap, lrap):
        m.to(device)
    for lo in range(0, 300, 50):  # cast mid-way, with a state already accumulated
        if lo == 150:
            {
                "to(bfloat16)": lambda: module.to(torch.bfloat16),
                "to(dtype=float16)": lambda: module.to(dtype=torch.float16),
                "half": module.half,
                "bfloat16": module.bfloat16,
                "float": module.float,
            }[cast]()
        batch = preds[lo : lo + 50].to(device), target[lo : lo + 50].to(device)
        for m in (reference_lwlrap, lwlrap):
            m.update(*batch)
        for m in (reference_lrap, lrap):
            m.update(*batch, sample_weight=weight[lo : lo + 50].to(device))
    assert lwlrap.precision_sum.dtype == lrap.lrap_sum.dtype == lrap.weight_sum.dtype == torch.float64
    assert lwlrap.label_count.dtype == torch.int64
    assert lwlrap.precision_sum.device.type == torch.device(device).type
    assert torch.equal(lwlrap.compute(), reference_lwlrap.compute())
    assert torch.equal(lrap.compute(), reference_lrap.compute())
    lwlrap.reset()
    lrap.reset()  # the defaults were not cast either
    assert lwlrap.precision_sum.dtype == lrap.lrap_sum.dtype == torch.float64


# ----------------------------------------------------------------------------------------------------------------
# Nothing lost: rejected batches leave the state untouched


def _good(n=4, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    preds = torch.randint(0, 4, (n, c), generator=g).float() / 4
    target = (torch.rand(n, c, generator=g) < 0.5).long()
    target[0, 0] = 1
    target[1, 1] = IGNORE
    return preds, target


def _with(tensor, index, value):
    tensor = tensor.clone()
    tensor[index] = value
    return tensor


P, T = _good()
W = torch.ones(4)
META = torch.device("meta")


def _nested(tensor, layout):
    """``tensor``'s rows as a nested tensor of two parts, as a pipeline of variable-length batches holds them."""
    with warnings.catch_warnings():  # torch calls the strided layout a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([tensor[:2], tensor[2:]], layout=layout)



# (id, args, kwargs, error, fragments the message must contain); every metric uses num_labels=3, ignore_index=-1
BAD_BATCHES = [
    ("preds is a list", (P.tolist(), T), {}, TypeError, ["`preds`", "list"]),
    ("target is a numpy array", (P, T.numpy()), {}, TypeError, ["`target`", "ndarray"]),
    ("integer preds", (P.long(), T), {}, TypeError, ["`preds`", "torch.int64"]),
    ("swapped arguments", (T, P), {}, TypeError, ["`preds`", "torch.int64", "look swapped"]),
    ("zero classes", (torch.rand(4, 0), torch.zeros(4, 0)), {}, ValueError, ["`preds`", "one class", "(4, 0)"]),
    ("complex target", (P, T.to(torch.complex64)), {}, TypeError, ["`target`", "complex64"]),
    ("NaN in preds", (_with(P, (1, 2), math.nan), T), {}, ValueError, ["`preds`", "NaN", "(1, 2)"]),
    ("shape mismatch", (P, torch.zeros(5, 3, dtype=torch.long)), {}, ValueError, ["`target`", "(4, 3)", "(5, 3)"]),
    ("1-D inputs", (P[0], T[0]), {}, ValueError, ["`preds`", "2 dimensions", "(3,)"]),
    ("wrong num_labels", (torch.rand(4, 5), torch.zeros(4, 5)), {}, ValueError, ["`num_labels`", "3", "(4, 5)"]),
    ("target value 2", (P, _with(T, (2, 0), 2)), {}, ValueError, ["`target`", "[2]", "ignore_index=-1"]),
    ("target value -2", (P, _with(T, (2, 0), -2)), {}, ValueError, ["`target`", "[-2]"]),
    ("target value 0.5", (P, _with(T.float(), (2, 0), 0.5)), {}, ValueError, ["`target`", "[0.5]"]),
    ("uint8 target 255", (P, _with(T.clamp(min=0), (3, 2), 255).byte()), {}, ValueError, ["`target`", "[255]"]),
    ("float8 preds", (P.to(torch.float8_e4m3fn), T), {}, TypeError, ["`preds`", "float8_e4m3fn", "`preds.float()`"]),
    ("float8 target", (P, T.float().to(torch.float8_e5m2)), {}, TypeError, ["`target`", "float8_e5m2", "`target.float()`"]),
    ("sparse preds", (P.to_sparse(), T), {}, TypeError, ["`preds`", "sparse_coo", "`preds.to_dense()`"]),
    ("sparse target", (P, T.to_sparse()), {}, TypeError, ["`target`", "sparse_coo", "`target.to_dense()`"]),
    ("nested preds", (_nested(P, torch.strided), T), {}, TypeError, ["`preds`", "nested", "`torch.cat(preds.unbind())`"]),
    ("jagged preds", (_nested(P, torch.jagged), T), {}, TypeError, ["`preds`", "nested", "`torch.cat(preds.unbind())`"]),
    ("nested target", (P, _nested(T, torch.strided)), {}, TypeError, ["`target`", "nested", "`torch.cat(target.unbind())`"]),
    ("preds and target on meta", (P.to(META), T.to(META)), {}, ValueError, ["`preds`", "meta", "cpu"]),
    ("target on meta", (P, T.to(META)), {}, ValueError, ["`target`", "meta"]),
]
if torch.cuda.is_available():
    BAD_BATCHES.append(("inputs on cuda", (P.cuda(), T.cuda()), {}, ValueError, ["`preds`", "cuda", "cpu"]))
BAD_WEIGHTS = [
    ("sample_weight is a list", {"sample_weight": [1.0] * 4}, TypeError, ["`sample_weight`", "list"]),
    ("sample_weight shape", {"sample_weight": torch.ones(3)}, ValueError, ["`sample_weight`", "(3,)", "(4,)"]),
    ("sample_weight 2-D", {"sample_weight": torch.ones(4, 1)}, ValueError, ["`sample_weight`", "(4, 1)"]),
    ("negative weight", {"sample_weight": _with(W, 1, -1.5)}, ValueError, ["`sample_weight`", "-1.5"]),
    ("NaN weight", {"sample_weight": _with(W, 2, math.nan)}, ValueError, ["`sample_weight`", "[nan] (first at index (2,))"]),
    ("inf weight", {"sample_weight": _with(W, 2, math.inf)}, ValueError, ["`sample_weight`", "inf"]),
    ("bool weight", {"sample_weight": W.bool()}, TypeError, ["`sample_weight`", "torch.bool", "`sample_weight.double()`"]),
    ("float8 weight", {"sample_weight": W.to(torch.float8_e4m3fn)}, TypeError, ["`sample_weight`", "float8_e4m3fn"]),
    ("sparse weight", {"sample_weight": W.to_sparse()}, TypeError, ["`sample_weight`", "sparse_coo"]),
    ("weight on meta", {"sample_weight": W.to(META)}, ValueError, ["`sample_weight`", "meta"]),
]
METRICS = {
    "lwlrap-weighted": lambda: MultilabelLWLRAP(3, ignore_index=IGNORE),
    "lwlrap-none": lambda: MultilabelLWLRAP(3, average="none", ignore_index=IGNORE),
    "lrap": lambda: MultilabelLRAP(3, ignore_index=IGNORE),
}
REJECTIONS = [
    pytest.param(metric, args, kwargs, error, fragments, id=f"{name}-{metric}")
    for metric in METRICS
    for name, args, kwargs, error, fragments in BAD_BATCHES
] + [
    pytest.param("lrap", (P, T), kwargs, error, fragments, id=f"{name}-lrap")
    for name, kwargs, error, fragments in BAD_WEIGHTS
]


def _expected(metric_name, batches):
    preds = torch.cat([b[0] for b in batches]).double().numpy()
    target = torch.cat([b[1] for b in batches]).numpy()
    if metric_name == "lrap":
        return naive_lrap(preds, target, "max", IGNORE)
    return naive_lwlrap(preds, target, "max", IGNORE, metric_name.split("-")[1])


@pytest.mark.parametrize("mode", ["update", "forward"])
@pytest.mark.parametrize("metric_name, args, kwargs, error, fragments", REJECTIONS)
def test_rejected_batch_raises_and_loses_nothing(metric_name, args, kwargs, error, fragments, mode):
    metric = METRICS[metric_name]()
    first, second = _good(seed=1), _good(seed=2)
    step = metric.update if mode == "update" else metric
    step(*first)
    before = {name: value.clone() for name, value in metric.metric_state.items()}

    with pytest.raises(error) as raised:
        step(*args, **kwargs)
    for fragment in fragments:
        assert fragment in str(raised.value), f"{fragment!r} missing from the message: {raised.value}"
    # the traceback names the metric that refused it (below the message)
    assert raised.value.__notes__ == [f"(raised by {type(metric).__name__}(ties='max', ignore_index={IGNORE}, "
                                      f"num_labels=3, num_bootstrap=0, bootstrap_seed=None))"]

    after = metric.metric_state
    assert after.keys() == before.keys()
    for name, value in before.items():
        assert after[name].dtype == value.dtype and after[name].device == value.device, name
        assert torch.equal(after[name], value), f"state {name} changed by a rejected batch"
    step(*second)  # still accepts batches
    assert_matches(metric.compute(), _expected(metric_name, [first, second]))


@pytest.mark.parametrize("mode", ["update", "forward"])
def test_a_collection_s_refusal_names_its_member_and_those_that_added_the_batch(mode):
    # torchmetrics updates a collection's members one after another: a batch that one member refuses (here a target
    # marked -1, which only the first member ignores) has been added by those before it. The traceback says which
    # member refused and which hold the batch, and the refusing member keeps its states.
    from torchmetrics import MetricCollection

    collection = MetricCollection({"ignoring": MultilabelLWLRAP(3, ignore_index=-1), "plain": MultilabelLWLRAP(3)})
    g = torch.Generator().manual_seed(5)
    first = (torch.randn(6, 3, generator=g), (torch.rand(6, 3, generator=g) < 0.5).long())
    first[1][0] = 1
    step = collection.update if mode == "update" else collection
    step(*first)
    preds, target = torch.randn(4, 3, generator=g), torch.ones(4, 3, dtype=torch.long)
    target[0, 0], target[1, 2] = -1, 0
    with pytest.raises(ValueError, match=r"pass `ignore_index=-1`") as raised:
        step(preds, target)
    (note,) = raised.value.__notes__
    assert note.startswith("(raised by the MetricCollection's member 'plain', MultilabelLWLRAP(ties='max', "
                           "ignore_index=None, num_labels=3")
    assert "The members updated before it ('ignoring') have added the batch" in note
    values = collection.compute()
    expected = naive_lwlrap(first[0].double().numpy(), first[1].numpy(), "max", None, "weighted")
    assert_matches(values["plain"], expected)  # the refusing member as before the batch
    assert values["ignoring"] != values["plain"]  # the member before it added the batch, as the note says
    plain_first = MetricCollection({"a_plain": MultilabelLWLRAP(3), "b_ignoring": MultilabelLWLRAP(3, ignore_index=-1)})
    with pytest.raises(ValueError) as raised:
        plain_first.update(preds, target)
    assert raised.value.__notes__ == [
        "(raised by the MetricCollection's member 'a_plain', MultilabelLWLRAP(ties='max', ignore_index=None, "
        "num_labels=3, num_bootstrap=0, bootstrap_seed=None))"
    ]  # the first member refused: no member holds the batch


def test_a_refusal_in_a_collection_with_compute_groups_names_every_member_holding_the_batch():
    # With compute groups torchmetrics updates the first member of each group, the others share its states: 'c'
    # shares 'a's (same class and options) and holds the batch that 'b' refused, though it comes after 'b'.
    from torchmetrics import MetricCollection

    g = torch.Generator().manual_seed(0)
    preds, target = torch.randn(6, 3, generator=g), (torch.rand(6, 3, generator=g) < 0.5).long()
    target[0] = 1
    bad = target.clone()
    bad[0, 0] = -1
    for groups, holding in ((True, "('a', 'c')"), (False, "('a')")):
        collection = MetricCollection({"a": MultilabelLWLRAP(3, ignore_index=-1), "b": MultilabelLRAP(3),
                                       "c": MultilabelLWLRAP(3, ignore_index=-1)}, compute_groups=groups)
        collection.update(preds, target)  # the first update finds the groups
        with pytest.raises(ValueError) as raised:
            collection.update(preds, bad)
        (note,) = raised.value.__notes__
        assert note.startswith("(raised by the MetricCollection's member 'b', MultilabelLRAP(") and (
            f"The members updated before it {holding} have added the batch" in note), note
        values = collection.compute()
        assert (values["c"] == values["a"]) == groups and values["a"] != values["b"]


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint and resume


def _batches(device, count=8, c=6, seed=21):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        n = int(torch.randint(1, 40, (1,), generator=g))
        preds = torch.randn(n, c, generator=g).round(decimals=1)
        target = (torch.rand(n, c, generator=g) < 0.3).long()
        target[torch.rand(n, c, generator=g) < 0.1] = IGNORE
        target[0] = 1  # every class has a positive, so no per-class NaN
        weight = torch.rand(n, generator=g) * 3
        out.append((preds.to(device), target.to(device), weight.to(device)))
    return out


CHECKPOINTED = {
    "lwlrap-weighted": lambda: MultilabelLWLRAP(6, ignore_index=IGNORE),
    "lwlrap-macro": lambda: MultilabelLWLRAP(6, average="macro", ignore_index=IGNORE, ties="index"),
    "lwlrap-none": lambda: MultilabelLWLRAP(6, average="none", ignore_index=IGNORE),
    "lrap": lambda: MultilabelLRAP(6, ignore_index=IGNORE),
}


def _feed(metric, batches):
    for preds, target, weight in batches:
        if isinstance(metric, MultilabelLRAP):
            metric.update(preds, target, sample_weight=weight)
        else:
            metric.update(preds, target)


@pytest.mark.parametrize("kind", list(CHECKPOINTED))
def test_checkpoint_mid_epoch_and_resume_is_bit_identical(kind, tmp_path, device):
    batches = _batches(device)
    uninterrupted = CHECKPOINTED[kind]().to(device)
    _feed(uninterrupted, batches)

    # a model holding the metric is checkpointed after three batches...
    model = torch.nn.ModuleDict({"metric": CHECKPOINTED[kind]().to(device)})
    model["metric"].persistent(True)
    _feed(model["metric"], batches[:3])
    path = tmp_path / "checkpoint.pt"
    torch.save(model.state_dict(), path)
    saved_keys = set(model.state_dict())
    assert saved_keys == {f"metric.{name}" for name in model["metric"].metric_state}
    del model

    # ...and a fresh process resumes from it
    resumed = torch.nn.ModuleDict({"metric": CHECKPOINTED[kind]().to(device)})
    resumed.load_state_dict(torch.load(path, weights_only=True, map_location=device))
    _feed(resumed["metric"], batches[3:])

    for name, value in uninterrupted.metric_state.items():
        assert torch.equal(resumed["metric"].metric_state[name], value), name
    assert torch.equal(resumed["metric"].compute(), uninterrupted.compute())
    # and both equal the naive reference
    preds = torch.cat([b[0] for b in batches]).cpu().double().numpy()
    target = torch.cat([b[1] for b in batches]).cpu().numpy()
    metric = uninterrupted
    if kind == "lrap":
        weight = torch.cat([b[2] for b in batches]).cpu().double().numpy()
        expected = naive_lrap(preds, target, "max", IGNORE, weight)
    else:
        expected = naive_lwlrap(preds, target, metric.ties, IGNORE, metric.average)
    assert_matches(uninterrupted.compute(), expected)


# ----------------------------------------------------------------------------------------------------------------
# Determinism


@pytest.mark.parametrize("ties", TIES)
def test_same_value_whatever_the_chunk_size_or_batch_split(ties, device):
    g = torch.Generator().manual_seed(4)
    n, c = 301, 10
    preds = (torch.randint(0, 6, (n, c), generator=g).double() / 2).to(device)
    target = (torch.rand(n, c, generator=g) < 0.25).long()
    target[torch.rand(n, c, generator=g) < 0.1] = IGNORE
    target = target.to(device)
    weight = (torch.rand(n, generator=g).double() * 2).to(device)
    splits = {
        "one batch": [n],
        "uneven": [1, 50, 3, 97, 0, 150],
        "tens": [10] * 30 + [1],
    }

    def run(split):
        lwlrap = MultilabelLWLRAP(c, average="none", ties=ties, ignore_index=IGNORE).to(device)
        lrap = MultilabelLRAP(c, ties=ties, ignore_index=IGNORE).to(device)
        for p, t, w in zip(preds.split(split), target.split(split), weight.split(split)):
            lwlrap.update(p, t)
            lrap.update(p, t, sample_weight=w)
        per_class, weights = lwlrap.per_class()
        return torch.cat([lwlrap.precision_sum, per_class, weights, lrap.compute()[None], lrap.weight_sum[None]]).cpu()

    results = {}
    for engine in engine_paths_for(device):
        for chunk in (None, 1, 7, 64, 1000, 1 << 30):
            with use_engine(engine, chunk_elements=chunk):
                for name, split in splits.items():
                    if name != "one batch" and chunk not in (None, 7):
                        continue
                    results[engine, chunk, name] = run(split)
    first = next(iter(results.values()))
    for key, value in results.items():
        torch.testing.assert_close(value, first, rtol=1e-12, atol=1e-12, msg=lambda m: f"{key}: {m}")

    p, t, w = preds.cpu().numpy(), target.cpu().numpy(), weight.cpu().numpy()
    expected_per_class, expected_weights, _ = naive_lwlrap_per_class(p, t, ties, IGNORE)
    assert_matches(first[c : 2 * c], expected_per_class)
    assert_matches(first[2 * c : 3 * c], expected_weights)
    assert_matches(first[3 * c], naive_lrap(p, t, ties, IGNORE, w))
