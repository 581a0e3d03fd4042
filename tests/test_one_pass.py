"""The numba backend's one pass over each row (``_numba_one_pass.one_pass_sums``): a 2-D contiguous batch has its
target checked, its NaN scores found, its positives found and its ranks counted in one compiled pass, with no mask
of the target made. It must give the sums of the chunked passes to the bit (serial or threaded), hand every bad
batch back to the gate (same error, state unchanged), and be what a training loop's ``update`` runs.
"""

from __future__ import annotations

import pytest
import torch

from tests.reference import exact_sums, make_case, naive_lrap, naive_lwlrap

pytest.importorskip("numba")

from torch_lwlrap import MultilabelLRAP, MultilabelLWLRAP, multilabel_lrap, multilabel_lwlrap  # noqa: E402
from torch_lwlrap import _numba_kernel, _numba_one_pass, _numba_runtime  # noqa: E402
from torch_lwlrap import _engine_config  # noqa: E402
from torch_lwlrap._engine_config import use_engine  # noqa: E402
from torch_lwlrap._types import RankingSums  # noqa: E402

TARGET_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32,
                 torch.float64]


def _passes(preds, target, ties, ignore_index=None):
    """The chunked passes' sums (``ranking_sums_numba``), from masks made by torch."""
    positive = target == 1
    known = None if ignore_index is None else target != ignore_index
    sums = RankingSums.zeros(*preds.shape)
    _numba_kernel.ranking_sums_numba(preds, positive, known, *sums, ties=ties)
    return sums


def _one_call(preds, target, ties, ignore_index=None, validate=True, **tuning):
    status, sums = _numba_one_pass.one_pass_sums(preds, target, ignore_index, validate, ties, **tuning)
    assert status == _numba_one_pass.ONE_PASS_OK
    return RankingSums(*sums)


def _spy(monkeypatch):
    """Count the calls of the one pass (the dispatch looks it up at each call)."""
    calls = []
    original = _numba_one_pass.one_pass_sums

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        calls.append(result[0])
        return result

    monkeypatch.setattr(_numba_one_pass, "one_pass_sums", spy)
    return calls


@pytest.mark.parametrize("target_dtype", TARGET_DTYPES)
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
def test_the_sums_of_the_passes_to_the_bit(target_dtype, ties, ignore_index):
    if ignore_index is not None and target_dtype == torch.bool:
        pytest.skip("a bool target has no ignored value")
    if ignore_index is not None and target_dtype == torch.uint8:
        ignore_index = 255
    # 300 rows: three blocks of class sums; heavy ties, infinities, rows with no positive and with every label.
    preds, target = make_case(7, 300, 37, ignore_index=ignore_index)
    target[0] = 1
    target[1] = 0
    target = target.to(target_dtype)
    for scores in (preds, preds.double(), torch.randn(300, 37)):
        one, passes = _one_call(scores, target, ties, ignore_index), _passes(scores, target, ties, ignore_index)
        for name, a, b in zip(RankingSums._fields, one, passes):
            assert torch.equal(a, b), name
    exact_class, exact_sample = exact_sums(preds, target.long(), ties, ignore_index)
    one = _one_call(preds, target, ties, ignore_index)
    torch.testing.assert_close(one.class_precision_sum, exact_class, rtol=1e-14, atol=1e-12)
    torch.testing.assert_close(one.sample_precision_sum, exact_sample, rtol=1e-14, atol=1e-12)


@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
def test_rows_with_many_positives_are_sorted_as_in_the_passes(monkeypatch, ties, ignore_index):
    monkeypatch.setattr(_numba_kernel, "SORT_POSITIVES_PER_LOG2", 1)  # rows with more than log2(C) positives
    preds, target = make_case(3, 150, 64, density=0.6, ignore_index=ignore_index)
    one, passes = _one_call(preds, target, ties, ignore_index), _passes(preds, target, ties, ignore_index)
    for name, a, b in zip(RankingSums._fields, one, passes):
        assert torch.equal(a, b), name
    want = exact_sums(preds, target, ties, ignore_index)[0]
    torch.testing.assert_close(one.class_precision_sum, want, rtol=1e-14, atol=1e-12)


def test_a_bool_target_is_any_non_zero_byte():
    # A bool tensor viewed from other bytes (uint8.view(torch.bool), frombuffer, DLPack) holds bytes other than 1:
    # torch reads each non-zero byte as True, and so do both routes.
    generator = torch.Generator().manual_seed(4)
    preds = torch.rand(40, 29, generator=generator)
    raw = (torch.rand(40, 29, generator=generator) < 0.3).to(torch.uint8) * torch.randint(1, 255, (40, 29),
                                                                                           generator=generator, dtype=torch.uint8)
    target = raw.view(torch.bool)
    want = naive_lwlrap(preds, (raw != 0).long())
    assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, rel=1e-12)
    with use_engine("numba", chunk_elements=10**6):  # the passes
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, rel=1e-12)
    assert multilabel_lrap(preds, target).item() == pytest.approx(naive_lrap(preds, (raw != 0).long()), rel=1e-12)


@pytest.mark.parametrize("target_dtype", [torch.float32, torch.float64])
def test_an_ignore_index_far_from_the_labels(target_dtype):
    # Any int64 the target's dtype holds exactly is an ignore_index; one it would round marks nothing (its rounding
    # is refused as a label, with the fix); beyond int64 is refused up front.
    preds, target = make_case(6, 30, 11)
    target = target.to(target_dtype)
    for ignore_index in (2**62, -(2**63), 2**53 - 1 if target_dtype == torch.float64 else 2**24 - 1):
        target[::4, 2] = float(ignore_index)
        got = multilabel_lwlrap(preds, target, ignore_index=ignore_index).item()
        with use_engine("sort"):
            assert got == pytest.approx(multilabel_lwlrap(preds, target, ignore_index=ignore_index).item(), rel=1e-12)
        assert got == pytest.approx(naive_lwlrap(preds, target, ignore_index=target[0, 2].item()), rel=1e-12)
    target[::4, 2] = float(2**62 + 1)  # stored as 2**62
    for engine in ("auto", "sort"):
        with use_engine(engine), pytest.raises(ValueError, match=r"cannot hold ignore_index=4611686018427387905 "):
            multilabel_lwlrap(preds, target, ignore_index=2**62 + 1)
    for ignore_index in (2**63, 2**64, -(2**70)):
        with pytest.raises(ValueError, match=r"`ignore_index` must fit an int64"):
            multilabel_lwlrap(preds, target, ignore_index=ignore_index)
        with pytest.raises(ValueError, match=r"`ignore_index` must fit an int64"):
            MultilabelLRAP(num_labels=11, ignore_index=ignore_index)


def test_an_empty_batch_and_the_sums_under_sub_chunks(monkeypatch):
    status, sums = _numba_one_pass.one_pass_sums(torch.zeros(0, 5), torch.zeros(0, 5), None, True, "max")
    assert status == _numba_one_pass.ONE_PASS_OK and [t.shape[0] for t in sums] == [5, 5, 0, 0, 0]
    # The passes cut a batch with ignored labels into sub-chunks of rows: their blocks differ, the sums agree up to
    # rounding.
    monkeypatch.setattr(_engine_config, "NUMBA_CONVERSION_CHUNK_ELEMENTS", 1000)
    preds, target = make_case(8, 700, 23, ignore_index=-1)
    one, passes = _one_call(preds, target, "max", -1), _passes(preds, target, "max", -1)
    torch.testing.assert_close(one.class_precision_sum, passes.class_precision_sum, rtol=1e-14, atol=1e-12)
    for name in ("class_label_count", "sample_precision_sum", "sample_label_count", "sample_known_count"):
        assert torch.equal(getattr(one, name), getattr(passes, name)), name


def test_positives_at_every_offset_of_the_words():
    # Rows of 1 to 19 labels of each dtype: a positive in every column, at the buffer's first and last bytes, in
    # words shared by two rows; -0.0 and NaN targets are not positives (validate=False).
    for num_classes in range(1, 20):
        for dtype in TARGET_DTYPES:
            for column in range(num_classes):
                target = torch.zeros(5, num_classes, dtype=dtype)
                target[:, column] = 1
                if dtype.is_floating_point:
                    target[1, (column + 1) % num_classes] = -0.0 if num_classes > 1 else 1
                preds = torch.arange(5 * num_classes, dtype=torch.float32).reshape(5, num_classes)
                one = _one_call(preds, target, "max", validate=False)
                assert one.sample_label_count.tolist() == [1] * 5, (num_classes, dtype, column)
                assert one.class_label_count.tolist() == target.eq(1).sum(0).tolist()
            # An offset buffer: the tensor's first byte is not 8-byte aligned.
            storage = torch.zeros(4 * num_classes + 3, dtype=dtype)
            target = storage[3:].view(4, num_classes)
            target[:, -1] = 1
            one = _one_call(torch.randn(4, num_classes), target, "max")
            assert one.class_label_count[-1].item() == 4


@pytest.mark.parametrize("call", ["function", "update", "forward"])
@pytest.mark.parametrize("bad", ["nan", "target_value", "ignore_value"])
def test_a_bad_batch_is_handed_back_to_the_gate(monkeypatch, call, bad):
    calls = _spy(monkeypatch)
    preds, target = torch.randn(8, 6), torch.zeros(8, 6)
    target[:, 2] = 1
    if bad == "nan":
        preds[5, 4] = float("nan")
        message = r"`preds` contains NaN \(first at index \(5, 4\)\)"
    elif bad == "target_value":
        target[3, 1] = 2.0
        message = r"`target` must contain only 0, 1 and ignore_index=-1, but found the values \[2.0\]"
    else:
        target[3, 1] = -2.0  # not ignore_index=-1
        message = r"`target` must contain only 0, 1 and ignore_index=-1, but found the values \[-2.0\]"
    metric = MultilabelLWLRAP(num_labels=6, ignore_index=-1)
    good_preds, good_target = torch.randn(8, 6), (torch.rand(8, 6) < 0.4).float()
    metric.update(good_preds, good_target)
    before = {name: getattr(metric, name).clone() for name in ("precision_sum", "label_count")}
    with pytest.raises(ValueError, match=message):
        if call == "function":
            multilabel_lwlrap(preds, target, ignore_index=-1)
        elif call == "update":
            metric.update(preds, target)
        else:
            metric(preds, target)
    for name, value in before.items():
        assert torch.equal(getattr(metric, name), value), name
    if call != "forward":  # forward's own gate refuses the batch before any update
        assert calls[1:] == [_numba_one_pass.ONE_PASS_NAN if bad == "nan" else _numba_one_pass.ONE_PASS_BAD_TARGET]
    assert metric.compute().item() == pytest.approx(naive_lwlrap(good_preds, good_target, ignore_index=-1), rel=1e-12)


def test_a_bad_value_in_a_later_chunk_changes_nothing(monkeypatch):
    calls = _spy(monkeypatch)
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 64 * 100)  # about 100 rows per chunk
    metric = MultilabelLRAP(num_labels=17)
    preds, target = make_case(12, 450, 17)
    metric.update(preds[:50], target[:50].bool())
    before = (metric.lrap_sum.clone(), metric.weight_sum.clone())
    bad = target.bool().clone()
    scores = preds.clone()
    scores[420, 3] = float("nan")
    with pytest.raises(ValueError, match=r"contains NaN \(first at index \(420, 3\)\)"):
        metric.update(scores, bad)
    assert calls[-1] == _numba_one_pass.ONE_PASS_NAN and calls[-2] == _numba_one_pass.ONE_PASS_OK
    assert (metric.lrap_sum, metric.weight_sum) == before
    assert metric.compute().item() == pytest.approx(naive_lrap(preds[:50], target[:50]), rel=1e-12)


def test_without_validation_the_pass_agrees_with_the_passes():
    # validate_args=False: nothing is checked; a value other than 0 and 1 is a negative, a NaN score ranks
    # nowhere, on either route (the engine setting forces the chunked passes).
    preds, target = make_case(5, 40, 12)
    target = target.float()
    target[3, 4] = 2.0
    preds[7, 1] = float("nan")
    fast = multilabel_lrap(preds, target, validate_args=False)
    with use_engine("numba", chunk_elements=10**6):
        slow = multilabel_lrap(preds, target, validate_args=False)
    assert fast.item() == slow.item() or (fast.isnan() and slow.isnan())
    target[2, 5] = -1.0  # ignored, beside a 2.0 that is a negative
    for ignore_index in (-1, None):
        fast = multilabel_lwlrap(preds[8:], target[8:], ignore_index=ignore_index, validate_args=False)
        with use_engine("numba", chunk_elements=10**6):
            slow = multilabel_lwlrap(preds[8:], target[8:], ignore_index=ignore_index, validate_args=False)
        assert fast.item() == slow.item()


@pytest.mark.parametrize("ties", ["max", "index"])
def test_metrics_fed_batch_by_batch_take_the_one_pass(monkeypatch, ties):
    calls = _spy(monkeypatch)
    lwlrap, lrap = MultilabelLWLRAP(num_labels=30, ties=ties), MultilabelLRAP(num_labels=30, ties=ties)
    batches = [make_case(seed, rows, 30) for seed, rows in enumerate([32, 1, 17, 64])]
    for preds, target in batches:
        lwlrap.update(preds, target.float())
        lrap.update(preds, target.bool())
    assert calls == [_numba_one_pass.ONE_PASS_OK] * 8
    preds, target = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    assert lwlrap.compute().item() == pytest.approx(naive_lwlrap(preds, target, ties=ties), rel=1e-12)
    assert lrap.compute().item() == pytest.approx(naive_lrap(preds, target, ties=ties), rel=1e-12)


def test_threads_and_blocks_give_the_same_bits(monkeypatch):
    from tests.concurrency_child import AlwaysParallel

    preds, target = make_case(9, 1000, 41, ignore_index=-1)
    target = target.float()
    serial = _one_call(preds, target, "max", -1)
    monkeypatch.setattr(_numba_runtime, "_choice", AlwaysParallel())
    monkeypatch.setattr(_numba_runtime, "PARALLEL_MIN_SCORES_PER_THREAD", 1)  # every thread torch allows
    threaded = _one_call(preds, target, "max", -1)
    passes = _passes(preds, target, "max", -1)
    for name, a, b, c in zip(RankingSums._fields, serial, threaded, passes):
        assert torch.equal(a, b) and torch.equal(a, c), name
    # Blocks of other sizes add the class sums in another order: equal up to rounding only.
    for block_rows in (1, 7, 1000):
        other = _one_call(preds, target, "max", -1, block_rows=block_rows)
        torch.testing.assert_close(other.class_precision_sum, serial.class_precision_sum, rtol=1e-14, atol=1e-12)
        assert torch.equal(other.sample_precision_sum, serial.sample_precision_sum)
    # A bad row stops its block whichever thread runs it; the status names the first failing check.
    target[777, 3] = 5.0
    assert _numba_one_pass.one_pass_sums(preds, target, -1, True, "max") == (_numba_one_pass.ONE_PASS_BAD_TARGET, None)
    preds[777, 0] = float("nan")
    assert _numba_one_pass.one_pass_sums(preds, target, -1, True, "max") == (_numba_one_pass.ONE_PASS_NAN, None)


def test_chunks_of_samples_bound_the_workspace(monkeypatch):
    # A batch larger than the input chunk budget is ranked a chunk of samples at a time, as the passes are.
    calls = _spy(monkeypatch)
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 64 * 100)  # 100 rows of a bool target per chunk
    preds, target = make_case(12, 450, 17)
    got = multilabel_lrap(preds, target.bool())
    assert calls == [_numba_one_pass.ONE_PASS_OK] * 5
    assert got.item() == pytest.approx(naive_lrap(preds, target), rel=1e-12)


def test_inputs_it_does_not_take_go_through_the_passes(monkeypatch):
    calls = _spy(monkeypatch)
    preds, target = make_case(4, 20, 9)
    want = naive_lwlrap(preds, target)
    for scores, labels in [
        (preds.t().contiguous().t(), target),  # strided scores
        (preds, target.t().contiguous().t()),  # strided target
        (preds.half(), target),  # float16 scores are widened by the passes
        (preds, target.half()),  # a float16 target
        (preds.unsqueeze(-1), target.unsqueeze(-1)),  # extra dimensions
    ]:
        assert multilabel_lwlrap(scores, labels).item() == pytest.approx(want, rel=1e-12)
    assert multilabel_lwlrap(preds, target, ties="expected").item() == pytest.approx(
        naive_lwlrap(preds, target, ties="expected"), rel=1e-12
    )
    with use_engine("numba", chunk_elements=50):  # a forced chunk size: the chunked passes
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, rel=1e-12)
    assert calls == []


def test_a_training_step_in_the_users_form(monkeypatch):
    """Logits that carry gradients, under inference mode, and a float 0/1 target as BCE takes it."""
    calls = _spy(monkeypatch)
    torch.manual_seed(0)
    net = torch.nn.Linear(16, 20)
    metric = MultilabelLWLRAP(num_labels=20)
    seen = []
    for step in range(5):
        features = torch.randn(32, 16)
        y = (torch.rand(32, 20) < 0.15).float()
        logits = net(features)
        assert logits.requires_grad
        value = metric(logits, y)  # forward, as `self.train_lwlrap(logits, y)` in a training_step
        torch.nn.functional.binary_cross_entropy_with_logits(logits, y).backward()
        assert value.item() == pytest.approx(naive_lwlrap(logits.detach(), y), rel=1e-12)
        seen.append((logits.detach(), y))
    with torch.inference_mode():
        features = torch.randn(32, 16)
        y = (torch.rand(32, 20) < 0.15).float()
        logits = net(features)
        metric.update(logits, y)
        seen.append((logits.clone(), y))
    assert calls == [_numba_one_pass.ONE_PASS_OK] * 6
    preds, target = torch.cat([s[0] for s in seen]), torch.cat([s[1] for s in seen])
    assert metric.compute().item() == pytest.approx(naive_lwlrap(preds, target), rel=1e-12)
