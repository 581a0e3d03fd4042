"""The input gate's edges that mutation testing found unguarded: each test calls the public API as a user does and
checks the gate's answer (acceptance against an independent reference, refusal with the message's argument, shape,
value and fix) and that a refused batch leaves a metric's state as it was."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score

import torch_lwlrap
from tests.reference import naive_lrap, naive_lwlrap
from tests.test_core import TARGET_CASES
from torch_lwlrap import use_engine


def _batch(seed, n=6, c=4):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, c, generator=g, dtype=torch.float64)
    labels = (torch.rand(n, c, generator=g) < 0.4).long()
    labels[:, 0] = 1
    return logits, labels


def _state(metric):
    return {name: value.clone() for name, value in metric.metric_state.items()}


def _same_state(metric, before):
    after = metric.metric_state
    return after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)


# ---------------------------------------------------------------------------------------------------------------
# sample_weight: its shape and dtype


def test_one_weight_per_score_is_refused_and_the_metric_keeps_its_state():
    """Weights of the scores' shape ``(N, C)`` are no sample weights: refused naming the shapes that fit."""
    logits, labels = _batch(0)
    metric = torch_lwlrap.MultilabelLRAP(4)
    metric.update(logits, labels)
    before = _state(metric)
    message = (r"^Argument `sample_weight` must have shape \(6,\) to match `preds` of shape \(6, 4\), but got shape "
               r"\(6, 4\)\.")
    for step in (metric.update, metric):
        with pytest.raises(ValueError, match=message):
            step(logits.clone().requires_grad_(), labels, sample_weight=torch.ones(6, 4))
        assert _same_state(metric, before)
    with pytest.raises(ValueError, match=message):
        torch_lwlrap.multilabel_lrap(logits, labels, sample_weight=torch.ones(6, 4))
    with pytest.raises(ValueError, match=r"`sample_weight` must have shape \(6,\) or \(6, 2\) to match `preds` of "
                                         r"shape \(6, 4, 2\), but got shape \(6, 4, 2\)\."):
        torch_lwlrap.multilabel_lrap(logits[..., None].expand(6, 4, 2), labels[..., None].expand(6, 4, 2),
                                     sample_weight=torch.ones(6, 4, 2))
    want = label_ranking_average_precision_score(labels.numpy(), logits.numpy())
    assert metric.compute().item() == pytest.approx(want, rel=1e-12)


def test_the_per_frame_shape_is_offered_only_where_there_are_frames():
    logits, labels = _batch(1)
    with pytest.raises(ValueError, match=r"^Argument `sample_weight` must have shape \(6,\) to match `preds` of shape "
                                         r"\(6, 4\), but got shape \(5,\)\.$"):
        torch_lwlrap.multilabel_lrap(logits, labels, sample_weight=torch.ones(5))
    frames_p = torch.stack([logits, -logits], dim=-1)  # (6, 4, 2)
    frames_y = torch.stack([labels, labels], dim=-1)
    with pytest.raises(ValueError, match=r"^Argument `sample_weight` must have shape \(6,\) or \(6, 2\) to match "
                                         r"`preds` of shape \(6, 4, 2\), but got shape \(5,\)\.$"):
        torch_lwlrap.multilabel_lrap(frames_p, frames_y, sample_weight=torch.ones(5))
    # both shapes offered are taken: one weight per sample, or one per frame
    per_sample = torch.arange(1.0, 7.0, dtype=torch.float64)
    per_frame = torch.stack([per_sample, 7.0 - per_sample], dim=-1)
    for weight in (per_sample, per_frame):
        got = torch_lwlrap.multilabel_lrap(frames_p, frames_y, sample_weight=weight).item()
        want = naive_lrap(frames_p.numpy(), frames_y.numpy(), sample_weight=weight.numpy())
        assert got == pytest.approx(want, rel=1e-12)


def test_complex_weights_are_refused_by_name_and_the_metric_keeps_its_state():
    logits, labels = _batch(2)
    metric = torch_lwlrap.MultilabelLRAP(4)
    metric.update(logits, labels)
    before = _state(metric)
    weight = torch.ones(6, dtype=torch.complex64)
    message = r"^Argument `sample_weight` must be a real-valued tensor, but got dtype torch.complex64\."
    for step in (metric.update, metric):
        with pytest.raises(TypeError, match=message):
            step(logits, labels, sample_weight=weight)
        assert _same_state(metric, before)
    for validate_args in (True, False):
        with pytest.raises(TypeError, match=message):
            torch_lwlrap.multilabel_ranking_loss(logits, labels, sample_weight=weight, validate_args=validate_args)


# ---------------------------------------------------------------------------------------------------------------
# ignore_index at the bounds of the target's dtype


@pytest.mark.parametrize("dtype, mark", [(torch.int8, -128), (torch.int16, -(2**15)), (torch.int8, 127),
                                         (torch.uint8, 255)], ids=str)
def test_ignore_index_at_either_bound_of_the_target_dtype_marks_unknown_labels(dtype, mark):
    logits, labels = _batch(3, n=8, c=5)
    unknown = torch.zeros(8, 5, dtype=torch.bool)
    unknown[[0, 3, 5], [1, 2, 4]] = True
    marked = labels.masked_fill(unknown, mark)
    want = naive_lwlrap(logits.numpy(), marked.numpy(), ignore_index=mark)
    assert want != pytest.approx(naive_lwlrap(logits.numpy(), labels.numpy()), rel=1e-9)  # the marks matter
    stored = marked.to(dtype)
    assert torch.equal(stored.long(), marked)
    for engine in ("auto", "sort"):
        with use_engine(engine):
            got = torch_lwlrap.multilabel_lwlrap(logits, stored, ignore_index=mark).item()
        assert got == pytest.approx(want, rel=1e-12), engine
    metric = torch_lwlrap.MultilabelLWLRAP(5, ignore_index=mark)
    metric(logits.clone().requires_grad_(), stored)
    assert metric.compute().item() == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Target values checked by torch's comparisons (the torch engines, and targets with extra dimensions)


@pytest.mark.parametrize("row", [0, 3, 5])
@pytest.mark.parametrize("engine", ["sort", "count", "auto"])
def test_a_soft_label_in_any_row_is_refused_on_the_torch_paths(engine, row):
    logits, labels = _batch(4)
    metric = torch_lwlrap.MultilabelLWLRAP(4)
    metric.update(logits, labels)
    before = _state(metric)
    soft = labels.double()
    soft[row, 1] = 0.5
    frames_p, frames_y = torch.stack([logits, logits], -1), torch.stack([labels.double(), soft], -1)
    message = r"^Argument `target` must contain only 0 and 1, but found the values \[0\.5\]: soft labels"
    with use_engine(engine):
        cases = [(frames_p, frames_y)] + ([] if engine == "auto" else [(logits, soft)])
        for preds, target in cases:
            with pytest.raises(ValueError, match=message):
                torch_lwlrap.multilabel_lwlrap(preds, target)
            with pytest.raises(ValueError, match=message):
                metric.update(preds, target)
            assert _same_state(metric, before)
        # the labels as 0/1 floats are taken, with the value of the integer labels
        got = torch_lwlrap.multilabel_lwlrap(frames_p, torch.stack([labels.double()] * 2, -1)).item()
    assert got == pytest.approx(naive_lwlrap(logits.numpy(), labels.numpy()), rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Shape messages: hints only where their fix works


def test_a_float_target_of_one_value_per_sample_gets_no_one_hot_hint():
    """``one_hot`` takes int64 class indices: a float vector gets the plain shape message (it is not indices)."""
    logits, labels = _batch(5)
    with pytest.raises(ValueError) as raised:
        torch_lwlrap.multilabel_lwlrap(logits, labels.argmax(1).double())
    assert str(raised.value) == ("Arguments `preds` and `target` must have the same shape (N, C, ...), but got (6, 4) "
                                 "for `preds` and (6,) for `target`.")
    with pytest.raises(ValueError, match=r"looks like one class index per sample.*one_hot\(target, 4\)` makes\.$"):
        torch_lwlrap.multilabel_lwlrap(logits, labels.argmax(1))


def test_the_classes_in_the_last_of_several_extra_dimensions_get_the_movedim_hint():
    preds = torch.rand(2, 7, 3, 5)
    labels = torch.randint(0, 2, (2, 7, 3, 5))
    with pytest.raises(ValueError, match=r"shape \(2, 7, 3, 5\): the classes look like the last dimension, move them "
                                         r"to dimension 1 with `preds.movedim\(-1, 1\)` and `target.movedim\(-1, 1\)`"):
        torch_lwlrap.multilabel_lwlrap(preds, labels, num_labels=5)
    with pytest.raises(ValueError) as raised:  # dimension 2 has the size, the last one does not: no hint
        torch_lwlrap.multilabel_lwlrap(torch.rand(2, 7, 5, 3), torch.randint(0, 2, (2, 7, 5, 3)), num_labels=5)
    assert str(raised.value) == "Expected 5 labels (`num_labels`) in dimension 1 of `preds`, but got shape (2, 7, 5, 3)."
    want = naive_lwlrap(preds.movedim(-1, 1).double().numpy(), labels.movedim(-1, 1).numpy())
    got = torch_lwlrap.multilabel_lwlrap(preds.movedim(-1, 1), labels.movedim(-1, 1), num_labels=5).item()
    assert got == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Marks of unknown labels written into an unsigned target


def test_a_negative_ignore_index_written_into_uint8_labels_gets_the_unsigned_fix():
    logits, labels = _batch(6)
    target = labels.to(torch.uint8)
    target[1, 2] = 254  # -2 written into uint8
    with pytest.raises(ValueError, match=r"found the values \[254\]: `target` is uint8, which holds no negative value: "
                                         r"-2 written into it is stored as 254\. If these values mark unknown labels, "
                                         r"pass `ignore_index=254`"):
        torch_lwlrap.multilabel_lwlrap(logits, target, ignore_index=-2)
    signed = target.to(torch.int64).masked_fill(target == 254, -2)  # the fix, as the message writes it
    want = naive_lwlrap(logits.numpy(), signed.numpy(), ignore_index=-2)
    assert torch_lwlrap.multilabel_lwlrap(logits, signed, ignore_index=-2).item() == pytest.approx(want, rel=1e-12)
    assert torch_lwlrap.multilabel_lwlrap(logits, target, ignore_index=254).item() == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Graded relevance: the bound of exponential gains


def _naive_ndcg(scores, grades):
    """NDCG of distinct scores with gains 2**rel - 1, averaged over the rows."""
    values = []
    for s, g in zip(scores.tolist(), grades.tolist()):
        gains = [math.expm1(r * math.log(2)) for r in g]
        order = sorted(range(len(s)), key=lambda j: -s[j])
        dcg = sum(gains[j] / math.log2(p + 2) for p, j in enumerate(order))
        ideal = sum(v / math.log2(p + 2) for p, v in enumerate(sorted(gains, reverse=True)))
        values.append(dcg / ideal)
    return float(np.mean(values))


@pytest.mark.parametrize("dtype", [torch.float64, torch.int16, torch.int64], ids=str)
def test_exponential_gains_take_grades_up_to_1023_and_refuse_1024(dtype):
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6]], dtype=torch.float64)
    grades = torch.tensor([[1023, 0, 1022, 3], [2, 1023, 0, 1021]], dtype=dtype)
    want = _naive_ndcg(scores, grades)
    assert torch_lwlrap.multilabel_ndcg(scores, grades).item() == pytest.approx(want, rel=1e-12)
    metric = torch_lwlrap.MultilabelNDCG(4)
    metric.update(scores, grades)
    before = _state(metric)
    too_large = grades.clone()
    too_large[1, 2] = 1024
    message = (r"^Argument `relevance` must be below 1024 with gain=\"exponential\" \(2\*\*rel - 1 must be a float64\), "
               r"but found the values \[1024(\.0)?\] \(first at index \(1, 2\)\)")
    with pytest.raises(ValueError, match=message):
        torch_lwlrap.multilabel_ndcg(scores, too_large)
    with pytest.raises(ValueError, match=message):
        metric.update(scores, too_large)
    assert _same_state(metric, before)
    assert metric.compute().item() == pytest.approx(want, rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Target values on the torch paths: the numba path checks a 2-D CPU target in its own compiled pass, so the gate's
# torch checks (the range of an integer target, the count of any other) run where it does not: the torch engines
# (as on a GPU), and targets with extra dimensions.

TORCH_PATH_CASES = TARGET_CASES  # test_core's cases, on the default engine there


@pytest.mark.parametrize("dtype, ignore_index, value, accepted", TORCH_PATH_CASES, ids=str)
@pytest.mark.parametrize("route", ["sort", "count", "frames"])
def test_target_value_checks_on_the_torch_paths(route, dtype, ignore_index, value, accepted):
    logits, labels = _batch(7, n=5, c=4)
    target = labels.to(dtype, copy=True)
    target[3, 2] = value
    if route == "frames":  # (N, C, 2): the second frame holds the value
        engine, preds, target = "auto", torch.stack([logits, -logits], -1), torch.stack([labels.to(dtype), target], -1)
    else:
        engine, preds = route, logits
    metric = torch_lwlrap.MultilabelLWLRAP(4, ignore_index=ignore_index)
    with use_engine(engine):
        if accepted:
            want = naive_lwlrap(preds.numpy(), target.double().numpy(), ignore_index=ignore_index)
            got = torch_lwlrap.multilabel_lwlrap(preds, target, ignore_index=ignore_index).item()
            assert got == pytest.approx(want, rel=1e-12)
            metric.update(preds, target)
            assert metric.compute().item() == pytest.approx(want, rel=1e-12)
            return
        metric.update(logits, labels)
        before = _state(metric)
        message = r"^Argument `target` must contain only 0(,| and) 1"
        with pytest.raises(ValueError, match=message):
            torch_lwlrap.multilabel_lwlrap(preds, target, ignore_index=ignore_index)
        with pytest.raises(ValueError, match=message):
            metric(preds.clone().requires_grad_(), target)
        assert _same_state(metric, before)


# ---------------------------------------------------------------------------------------------------------------
# Graded relevance with linear gains: infinity is no grade


def test_an_infinite_grade_is_refused_with_linear_gains_and_the_metric_keeps_its_state():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4], [0.3, 0.6, 0.1]], dtype=torch.float64)
    grades = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 1.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    metric = torch_lwlrap.MultilabelNDCG(3, gain="linear")
    metric.update(scores, grades)
    before = _state(metric)
    bad = grades.clone()
    bad[1, 1] = math.inf
    message = (r"^Argument `relevance` must be non-negative and finite, but found the values \[inf\] \(first at index "
               r"\(1, 1\)\)\.")
    with pytest.raises(ValueError, match=message):
        torch_lwlrap.multilabel_ndcg(scores, bad, gain="linear")
    with pytest.raises(ValueError, match=message):
        metric(scores.clone().requires_grad_(), bad)
    assert _same_state(metric, before)
    # NDCG with linear gains, from its formula (distinct scores: one order)
    values = []
    for s, g in zip(scores.tolist(), grades.tolist()):
        order = sorted(range(3), key=lambda j: -s[j])
        dcg = sum(g[j] / math.log2(p + 2) for p, j in enumerate(order))
        values.append(dcg / sum(v / math.log2(p + 2) for p, v in enumerate(sorted(g, reverse=True))))
    assert metric.compute().item() == pytest.approx(float(np.mean(values)), rel=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Functions of two systems' scores name the argument in the fix too


def test_the_fix_for_a_second_system_s_numpy_scores_names_its_argument():
    logits, labels = _batch(8)
    with pytest.raises(TypeError, match=r"^Argument `preds_b` must be a torch.Tensor, but got ndarray: convert it "
                                        r"with `torch.as_tensor\(preds_b\)`\.$"):
        torch_lwlrap.compare_lwlrap(logits, logits.numpy(), labels, num_bootstrap=10)
    with pytest.raises(TypeError, match=r"^Argument `preds_a` must be a torch.Tensor, but got ndarray: convert it "
                                        r"with `torch.as_tensor\(preds_a\)`\.$"):
        torch_lwlrap.compare_lwlrap(logits.numpy(), logits, labels, num_bootstrap=10)


# ---------------------------------------------------------------------------------------------------------------
# An ignore_index that a float target cannot hold exactly: a value merely rounding to it is no mark


@pytest.mark.parametrize("dtype, mark, stored", [(torch.float32, 16777217, 16777216.0), (torch.float16, 70000, math.inf),
                                                 (torch.bfloat16, 257, 256.0)], ids=str)
@pytest.mark.parametrize("engine", ["auto", "sort", "count"])
def test_an_ignore_index_a_float_target_cannot_hold_marks_nothing(engine, dtype, mark, stored):
    """torch rounds ``ignore_index`` to the target's dtype when it compares them: 16777217 would match a float32
    target's 16777216.0, 70000 a float16 target's inf. Such a value is refused with the fix; the mark the fix names
    (-1) is taken; a target without the rounded value is scored with every label known."""
    logits, labels = _batch(9, n=5, c=4)
    target = labels.to(dtype)
    target[2, 3] = mark  # the mark written into the target: stored rounded
    assert target[2, 3].item() == stored
    name = str(dtype).replace("torch.", "")
    message = (rf"found the values \[{re.escape(repr(stored))}\]: `target` is {name}, which cannot hold "
               rf"ignore_index={mark} exactly \(it is stored as {re.escape(repr(stored))}\)")
    metric = torch_lwlrap.MultilabelLWLRAP(4, ignore_index=mark)
    with use_engine(engine):
        metric.update(logits, labels.to(dtype))
        before = _state(metric)
        with pytest.raises(ValueError, match=message):
            torch_lwlrap.multilabel_lwlrap(logits, target, ignore_index=mark)
        with pytest.raises(ValueError, match=message):
            metric(logits.clone().requires_grad_(), target)
        assert _same_state(metric, before)
        fixed = labels.to(dtype)
        fixed[2, 3] = -1
        got = torch_lwlrap.multilabel_lwlrap(logits, fixed, ignore_index=-1).item()
        plain = torch_lwlrap.multilabel_lwlrap(logits, labels.to(dtype), ignore_index=mark).item()
    assert got == pytest.approx(naive_lwlrap(logits.numpy(), fixed.double().numpy(), ignore_index=-1), rel=1e-12)
    assert plain == pytest.approx(naive_lwlrap(logits.numpy(), labels.numpy()), rel=1e-12)
    assert metric.compute().item() == pytest.approx(plain, rel=1e-12)
    # a mark the dtype holds exactly stays a mark
    held = labels.to(torch.float32)
    held[2, 3] = 16777216
    want = naive_lwlrap(logits.numpy(), held.double().numpy(), ignore_index=16777216)
    assert torch_lwlrap.multilabel_lwlrap(logits, held, ignore_index=16777216).item() == pytest.approx(want, rel=1e-12)
