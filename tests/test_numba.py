"""The compiled CPU path (the "numba" engine) against exact per-label precisions and the torch "sort" path.

Both of its row strategies are checked on every case: counting (the default for rows with few positives) and
sorting (forced with ``sort_above=0``), with several block sizes and with the chunked conversion of float16,
bfloat16 and non-contiguous inputs.
"""

from __future__ import annotations

import importlib.util

import warnings

import pytest
import torch

from tests.reference import (
    check_special_row_sums,
    exact_sums,
    low_bit_cases,
    make_case,
    naive_lrap,
    naive_lwlrap,
    run_kernel,
    special_rows_case,
)
from torch_lwlrap import MultilabelLWLRAP, multilabel_lrap, multilabel_lwlrap
from torch_lwlrap import _dispatch
from torch_lwlrap import _numba_kernel as kernel
from torch_lwlrap import _numba_one_pass
from torch_lwlrap._ranking import ranking_sums, use_engine

HAS_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (pip install numba: the cpu extra)")

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = dict(rtol=0, atol=1e-12)
#: (sort_above, block_rows): counted rows, sorted rows, and a mix with odd block sizes.
STRATEGIES = [(None, kernel.BLOCK_ROWS), (0, 3), (2, 1), (None, 7)]


def kernel_sums(preds, target, ties, ignore_index=None, **tuning):
    return run_kernel(kernel.ranking_sums_numba, preds, target, ties, ignore_index, **tuning)


def check(preds, target, ties, ignore_index=None, **tuning):
    want_class, want_sample = exact_sums(preds, target, ties, ignore_index)
    positive = target == 1
    known = None if ignore_index is None else target != ignore_index
    with use_engine("sort"):
        sort = ranking_sums(preds, positive, known, ties=ties)
    for sort_above, block_rows in STRATEGIES:
        options = dict(dict(sort_above=sort_above, block_rows=block_rows), **tuning)
        got_class, got_sample = kernel_sums(preds, target, ties, ignore_index, **options)
        message = lambda m: f"{options}: {m}"  # noqa: E731
        torch.testing.assert_close(got_class, want_class, **TOL, msg=message)
        torch.testing.assert_close(got_sample, want_sample, **TOL, msg=message)
        torch.testing.assert_close(got_class, sort.class_precision_sum, **TOL, msg=message)
        torch.testing.assert_close(got_sample, sort.sample_precision_sum, **TOL, msg=message)


@needs_numba
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
@pytest.mark.parametrize("num_classes", [1, 2, 7, 40])
def test_random_tied_scores(dtype, ties, ignore_index, num_classes):
    seed = 1000 * num_classes + 10 * DTYPES.index(dtype) + (ties == "index") + 2 * (ignore_index is not None)
    for density in (0.1, 0.5, 0.9):
        preds, target = make_case(seed, 30, num_classes, dtype=dtype, ignore_index=ignore_index, density=density)
        check(preds, target, ties, ignore_index)


@needs_numba
@pytest.mark.parametrize("ties", ["max", "index"])
def test_scores_that_differ_only_in_low_bits(ties):
    for preds, target in low_bit_cases():
        check(preds, target, ties)


@needs_numba
@pytest.mark.parametrize("ties", ["max", "index"])
def test_special_rows(ties):
    preds, target = special_rows_case()
    for sort_above in (None, 0):
        check_special_row_sums(kernel_sums(preds, target, ties, sort_above=sort_above)[1], ties)
    check(preds, target, ties)


@needs_numba
@pytest.mark.parametrize("ties", ["max", "index"])
def test_every_label_ignored_but_positives_and_wide_rows(ties, monkeypatch):
    monkeypatch.setattr(kernel, "SORT_POSITIVES_PER_LOG2", 48)  # dense rows of 1200 labels are sorted by default
    # Rows whose only known labels are positives, and a wide row where sorting is the default strategy.
    preds, target = make_case(13, 8, 9, ignore_index=-1)
    target[0] = torch.tensor([1, -1, -1, 1, -1, -1, -1, -1, -1])
    target[1] = -1
    check(preds, target, ties, -1)
    num_classes = 1200
    g = torch.Generator().manual_seed(14)
    # 40 score levels; a row of one score (a saturated output: ties="index" had rescanned the row for each tied
    # positive, O(C) each, 10 s for two rows of 200,000 labels); two levels in blocks of columns
    preds = torch.randint(0, 40, (4, num_classes), generator=g).float()
    preds[1] = 0.5
    preds[3] = (torch.arange(num_classes) // 100 % 2).float()
    target = (torch.rand(4, num_classes, generator=g) < 0.6).long()  # about 720 positives > sort_min_positives
    target[2, 100:150] = -1
    target[1, ::7] = -1
    assert (target == 1).sum(1).min() > kernel.sort_min_positives(num_classes)
    want_class, want_sample = exact_sums(preds, target, ties, -1)
    got_class, got_sample = kernel_sums(preds, target, ties, -1)
    torch.testing.assert_close(got_class, want_class, **TOL)
    torch.testing.assert_close(got_sample, want_sample, rtol=1e-14, atol=0)  # sums of about 700 precisions


@needs_numba
def test_saturated_probabilities_of_a_training_step_under_ties_index(monkeypatch):
    # A training step's sigmoid outputs that saturate (1.0 and 0.0 for most labels, carrying gradients), on wide
    # dense rows that the kernel sorts: ties="index" had rescanned the row for each tied positive.
    monkeypatch.setattr(kernel, "SORT_POSITIVES_PER_LOG2", 48)  # rows of 1200 labels sorted, as 10^5 are by default
    g = torch.Generator().manual_seed(21)
    logits = (40 * torch.randn(3, 1200, generator=g)).requires_grad_()
    probs = torch.sigmoid(logits)
    target = torch.rand(3, 1200, generator=g) < 0.6
    assert (target.sum(1) > kernel.sort_min_positives(1200)).all() and (probs == 1).sum() > 1000
    with use_engine("numba"):
        lwlrap = multilabel_lwlrap(probs, target, ties="index")
        lrap = multilabel_lrap(probs, target, ties="index")
    plain = probs.detach()
    assert lwlrap.item() == pytest.approx(naive_lwlrap(plain, target.long(), "index"), abs=1e-12)
    assert lrap.item() == pytest.approx(naive_lrap(plain, target.long(), "index"), abs=1e-12)


@needs_numba
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_non_contiguous_inputs_and_chunks(dtype):
    preds, target = make_case(31, 50, 10, dtype=dtype, ignore_index=-1)
    preds_t = preds.t().contiguous().t()
    wide = torch.zeros(50, 20, dtype=target.dtype)
    wide[:, ::2] = target
    target_strided = wide[:, ::2]
    assert not preds_t.is_contiguous() and not target_strided.is_contiguous()
    for chunk in (None, 1, 7, 33):
        check(preds_t, target_strided, "max", -1, chunk_elements=chunk)
        check(preds_t, target_strided, "index", -1, chunk_elements=chunk)


@needs_numba
def test_a_positive_flag_under_an_unknown_label_is_ignored():
    preds, target = make_case(17, 12, 9, ignore_index=-1)
    known = target != -1
    flagged = (target == 1) | ~known  # every unknown label also flagged positive
    want = kernel_sums(preds, target, "max", -1)
    counts = [torch.zeros(9, dtype=torch.int64), torch.zeros((2, 12), dtype=torch.int64)]
    got_class, got_sample = torch.zeros(9, dtype=torch.float64), torch.zeros(12, dtype=torch.float64)
    kernel.ranking_sums_numba(preds, flagged, known, got_class, counts[0], got_sample, *counts[1])
    torch.testing.assert_close((got_class, got_sample), want, **TOL)
    assert torch.equal(counts[0], (target == 1).sum(0)) and torch.equal(counts[1][0], (target == 1).sum(1))


@needs_numba
def test_thread_count_does_not_change_the_result():
    preds, target = make_case(41, 600, 33, density=0.2)
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 2):
            torch.set_num_threads(count)
            results.append(kernel_sums(preds, target, "max", block_rows=16))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@needs_numba
def test_adds_to_class_sums_and_overwrites_sample_sums():
    preds, target = make_case(51, 20, 9)
    first = kernel_sums(preds, target, "index")
    class_sum = torch.arange(9, dtype=torch.float64)
    class_count = torch.arange(9)
    sample_sum = torch.full((20,), 7.0, dtype=torch.float64)
    sample_counts = torch.full((2, 20), 7)
    kernel.ranking_sums_numba(
        preds, target == 1, None, class_sum, class_count, sample_sum, *sample_counts, ties="index"
    )
    torch.testing.assert_close(class_sum - torch.arange(9, dtype=torch.float64), first[0], **TOL)
    assert torch.equal(class_count - torch.arange(9), (target == 1).sum(0))
    torch.testing.assert_close(sample_sum, first[1], **TOL)
    assert torch.equal(sample_counts[0], (target == 1).sum(1)) and torch.equal(sample_counts[1], torch.full((20,), 9))


@needs_numba
@pytest.mark.parametrize("ties", ["max", "index"])
def test_public_functions_and_auto_engine(ties, monkeypatch):
    calls = []
    # The numba path ranks with its chunked passes or, for a 2-D contiguous batch, in one pass over each row.
    for module, name in ((kernel, "ranking_sums_numba"), (_numba_one_pass, "one_pass_sums")):
        original = getattr(module, name)

        def counting(*args, _original=original, **kwargs):
            calls.append(args[0].shape)
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    preds, target = make_case(61, 20, 5, ignore_index=-1)
    for engine in ("auto", "numba"):
        calls.clear()
        with use_engine(engine):
            for average in ("weighted", "macro"):
                got = multilabel_lwlrap(preds, target, ties=ties, ignore_index=-1, average=average).item()
                assert got == pytest.approx(naive_lwlrap(preds, target, ties, -1, average), abs=1e-12)
            got_lrap = multilabel_lrap(preds, target, ties=ties, ignore_index=-1).item()
            assert got_lrap == pytest.approx(naive_lrap(preds, target, ties, -1), abs=1e-12)
            metric = MultilabelLWLRAP(5, ties=ties, ignore_index=-1)
            metric.update(preds[:7], target[:7])
            metric.update(preds[7:], target[7:])
            assert metric.compute().item() == pytest.approx(naive_lwlrap(preds, target, ties, -1), abs=1e-12)
        assert len(calls) == 5, f"engine {engine!r} did not take the numba path for CPU tensors"


def test_numba_engine_falls_back_to_sort_where_unavailable(monkeypatch):
    monkeypatch.setattr(kernel, "unavailable_reason", lambda device, dtype=None: "switched off by the test")
    monkeypatch.setattr(_dispatch, "_warned", set())
    preds, target = make_case(91, 15, 6, ignore_index=-1)
    for engine in ("numba", "auto"):  # forced, it says why (once); auto takes the torch paths silently
        with use_engine(engine), warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            got = multilabel_lwlrap(preds, target, ignore_index=-1, ties="index").item()
        assert got == pytest.approx(naive_lwlrap(preds, target, "index", -1), abs=1e-12)
        messages = [str(w.message) for w in record]
        assert len(messages) == (1 if engine == "numba" else 0)
        assert all("cannot rank cpu tensors: switched off by the test" in message for message in messages)


@needs_numba
def test_kernel_argument_errors():
    scores = torch.zeros(2, 3)
    positive = torch.zeros(2, 3, dtype=torch.bool)
    sums = (
        torch.zeros(3, dtype=torch.float64),
        torch.zeros(3, dtype=torch.int64),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
    )
    with pytest.raises(TypeError, match=r"float16, bfloat16, float32 or float64 scores on the CPU, but got dtype "
                       r"torch.int32 on cpu"):
        kernel.ranking_sums_numba(scores.int(), positive, None, *sums)
    for ties in ("min", "expected"):  # "expected" is a reduction over label counts, not a kernel variant
        with pytest.raises(ValueError, match=rf"numba kernel ranks with `ties` in \('max', 'index'\), but got '{ties}'"):
            kernel.ranking_sums_numba(scores, positive, None, *sums, ties=ties)
    with pytest.raises(ValueError, match=r"`positive` must be a bool tensor of the shape of `preds` \(2, 3\), but "
                       r"got dtype torch.int64"):
        kernel.ranking_sums_numba(scores, positive.long(), None, *sums)
    strided = torch.zeros(4, dtype=torch.float64)[::2]
    with pytest.raises(ValueError, match=r"`sample_precision_sum` must be a contiguous float64 tensor of shape \(2,\)"):
        kernel.ranking_sums_numba(scores, positive, None, sums[0], sums[1], strided, *sums[3:])
    with pytest.raises(ValueError, match=r"`block_rows` must be positive, but got 0"):
        kernel.ranking_sums_numba(scores, positive, None, *sums, block_rows=0)
    assert not kernel.is_available("cpu", torch.int64) and not kernel.is_available("meta")


# ----------------------------------------------------------------------------------------------------------------
# Targets: the compiled value check and masks against torch's own comparisons


def _target_with(dtype, values, transpose):
    """A 37 x 11 target of ``dtype`` holding 0, 1 and each of ``values`` somewhere; transposed: non-contiguous."""
    g = torch.Generator().manual_seed(len(values))
    target = torch.randint(0, 2, (11, 37) if transpose else (37, 11), generator=g).double()
    flat = target.view(-1)
    for at, value in enumerate(values):
        flat[(at * 97) % flat.numel()] = value
    target = target.t() if transpose else target
    return target.to(dtype)


@needs_numba
@pytest.mark.parametrize("dtype", kernel.TARGET_DTYPES, ids=str)
@pytest.mark.parametrize("transpose", [False, True], ids=["contiguous", "transposed"])
def test_target_check_and_masks_agree_with_torch(dtype, transpose):
    floating = dtype.is_floating_point
    signed = dtype != torch.uint8
    extra = [2, 7] + ([0.5, -0.0, 1e-30, float("nan"), float("inf")] if floating else []) + ([-5] if signed else [])
    ignore_values = [None] + ([-1] if signed else [255]) + ([-100] if signed else [])
    for ignore_index in ignore_values:
        for values in ([], [ignore_index] if ignore_index is not None else [], *([v] for v in extra)):
            target = _target_with(dtype, values, transpose)
            assert kernel.handles_target(target)
            assert target.is_contiguous() != transpose
            wide = target.double()
            allowed = (wide == 0) | (wide == 1)
            if ignore_index is not None:
                allowed |= wide == ignore_index
            case = f"{dtype}, values {values}, ignore_index {ignore_index}"
            assert kernel.target_is_bad(target, ignore_index) == bool((~allowed).any()), case
            positive, known = kernel.target_masks(target, ignore_index)
            assert torch.equal(positive, wide == 1), case
            if ignore_index is None:
                assert known is None
            else:
                assert torch.equal(known, wide != ignore_index), case


@needs_numba
def test_targets_the_compiled_helpers_leave_to_torch():
    assert not kernel.handles_target(torch.zeros(3, 4, dtype=torch.bool))  # needs no mask
    assert not kernel.handles_target(torch.zeros(3, 4, dtype=torch.float16))  # numba cannot read it
    assert not kernel.handles_target(torch.zeros(3, 4, dtype=torch.bfloat16))
    assert not kernel.handles_target(torch.zeros(3, 4, 2))  # flattened into samples first
    assert not kernel.handles_target(torch.zeros(3, 4, device="meta"))
    assert kernel.handles_target(torch.zeros(3, 4, dtype=torch.int16))


@needs_numba
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32, torch.uint8], ids=str)
def test_public_functions_decode_targets_compiled(dtype, monkeypatch):
    """The numba path's chunked passes check and decode the target with its helpers (no torch comparison), with
    the same result; a bad value is still rejected with the values found. (A 2-D contiguous batch is checked and
    decoded inside the one pass over its rows, ``tests/test_one_pass.py``: a forced chunk size takes the passes.)"""
    calls = []
    for name in ("target_is_bad", "target_masks"):
        original = getattr(kernel, name)
        monkeypatch.setattr(kernel, name, lambda *a, _f=original, _n=name: calls.append(_n) or _f(*a))
    preds, target = make_case(5, 300, 13, ignore_index=None)
    target = target.to(dtype)
    ignore_index = 255 if dtype == torch.uint8 else -1
    target[::7, 3] = ignore_index
    with use_engine("auto", chunk_elements=10**6):
        got = multilabel_lwlrap(preds, target, ignore_index=ignore_index)
        got_lrap = multilabel_lrap(preds, target, ignore_index=ignore_index)
    assert calls == ["target_is_bad", "target_masks"] * 2
    assert got.item() == multilabel_lwlrap(preds, target, ignore_index=ignore_index).item()  # the one pass
    with use_engine("sort"):  # torch's comparisons
        assert got == pytest.approx(multilabel_lwlrap(preds, target, ignore_index=ignore_index).item(), abs=1e-12)
        assert got_lrap == pytest.approx(multilabel_lrap(preds, target, ignore_index=ignore_index).item(), abs=1e-12)
    assert calls == ["target_is_bad", "target_masks"] * 2
    assert got == pytest.approx(naive_lwlrap(preds, target, ignore_index=ignore_index), abs=1e-12)
    target[4, 5] = 2
    message = r"`target` must contain only 0, 1 and ignore_index=-?\d+, but found the values \[2(\.0)?\]"
    for chunk_elements in (None, 10**6):
        with use_engine("auto", chunk_elements), pytest.raises(ValueError, match=message):
            multilabel_lwlrap(preds, target, ignore_index=ignore_index)
