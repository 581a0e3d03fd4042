"""Edge shapes and code paths the other suites do not reach, each against an independent reference.

* Zero classes: the functions reject ``C = 0`` on every engine path, as the metric classes do (``num_labels >= 1``).
* ``_sort_path_dense``, the torch path a GPU without Triton takes, run on CPU tensors against the exact fractions
  of the naive loops (elsewhere it runs only on ``meta`` tensors, which have no values).
* ``_true_indices`` on masks whose storage does not start at an 8-byte boundary (its unaligned head).
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ENGINE_PATHS
from tests.reference import check_special_row_sums, exact_sums, make_case, special_rows_case
from torch_lwlrap import (
    MultilabelLRAP,
    MultilabelLWLRAP,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_lwlrap_per_class,
)
from torch_lwlrap._ranking import RankingSums, _label_counts, _true_indices, use_engine
from torch_lwlrap._torch_paths import _sort_path_dense

TOL = dict(rtol=1e-12, atol=1e-12)
FUNCTIONS = [multilabel_lwlrap, multilabel_lrap, multilabel_lwlrap_per_class]


# ----------------------------------------------------------------------------------------------------------------
# Zero classes


@pytest.mark.parametrize("shape", [(1000, 0), (0, 0), (5, 0, 3)])
@pytest.mark.parametrize("function", FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("engine", ["auto"] + ENGINE_PATHS)
def test_functions_reject_zero_classes(engine, function, shape):
    with use_engine(engine), pytest.raises(ValueError) as raised:
        function(torch.empty(shape), torch.empty(shape))
    message = str(raised.value)
    assert "`preds`" in message and "at least one class" in message and str(shape) in message


@pytest.mark.parametrize("metric_class", [MultilabelLWLRAP, MultilabelLRAP])
def test_metrics_reject_zero_classes(metric_class):
    with pytest.raises(ValueError, match="num_labels"):
        metric_class(num_labels=0)


@pytest.mark.parametrize("engine", ENGINE_PATHS)
def test_one_class_is_still_accepted(engine):
    # The smallest valid C: each positive ranks among itself only, precision 1.
    with use_engine(engine):
        assert multilabel_lwlrap(torch.randn(7, 1), torch.tensor([[1], [0], [1], [1], [0], [0], [1]])).item() == 1.0
        assert multilabel_lrap(torch.randn(3, 1), torch.tensor([[1], [0], [1]])).item() == 1.0


# ----------------------------------------------------------------------------------------------------------------
# The dense sort path, on the CPU


def _dense_sums(preds, target, ties, ignore_index=None, block_scores=None):
    """(class sums, sample sums) of ``_sort_path_dense`` run on CPU tensors, prepared as ``ranking_sums`` does."""
    positive = target == 1
    known = None if ignore_index is None else target != ignore_index
    if known is not None:
        positive = positive & known
    sums = RankingSums.zeros(*preds.shape)
    _label_counts(positive, known, sums)
    sums.sample_precision_sum.fill_(float("nan"))  # every row must be written
    with use_engine("sort", chunk_elements=block_scores):  # small blocks: several blocks of rows
        _sort_path_dense(preds, positive, known, ties, sums)
    return sums.class_precision_sum, sums.sample_precision_sum


@pytest.mark.parametrize("block_scores", [None, 40])
@pytest.mark.parametrize("ignore_index", [None, -1])
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_sort_path_dense_against_the_naive_loops(dtype, ties, ignore_index, block_scores):
    for seed, (n, c) in enumerate([(23, 7), (9, 1), (16, 2), (30, 33)]):
        preds, target = make_case(seed, n, c, dtype=dtype, ignore_index=ignore_index)
        got_class, got_sample = _dense_sums(preds, target, ties, ignore_index, block_scores)
        want_class, want_sample = exact_sums(preds, target, ties, ignore_index)
        torch.testing.assert_close(got_class, want_class, **TOL)
        torch.testing.assert_close(got_sample, want_sample, **TOL)


@pytest.mark.parametrize("ties", ["max", "index"])
def test_sort_path_dense_special_rows(ties):
    preds, target = special_rows_case()
    _, sample_sums = _dense_sums(preds, target, ties)
    check_special_row_sums(sample_sums, ties)


def test_sort_path_dense_non_contiguous_scores():
    preds, target = make_case(5, 20, 9)
    wide = torch.zeros(9, 40, dtype=preds.dtype)
    wide[:, ::2] = preds.T
    view = wide[:, ::2].T  # (20, 9), neither dimension contiguous
    for ties in ("max", "index"):
        got_class, got_sample = _dense_sums(view, target, ties)
        want_class, want_sample = exact_sums(preds, target, ties)
        torch.testing.assert_close(got_class, want_class, **TOL)
        torch.testing.assert_close(got_sample, want_sample, **TOL)


# ----------------------------------------------------------------------------------------------------------------
# _true_indices: masks that start inside an 8-byte word


@pytest.mark.parametrize("offset", range(9))
@pytest.mark.parametrize("size", [1024, 1031, 4099])
def test_true_indices_at_every_alignment(offset, size):
    generator = torch.Generator().manual_seed(offset * 10_000 + size)
    storage = torch.rand(offset + size + 8, generator=generator) < 0.1
    storage[offset : offset + 8] = True  # True entries in the head, whatever its length
    storage[offset + size - 9 : offset + size] = True  # and in the tail
    mask = storage[offset : offset + size]
    assert mask.storage_offset() == offset
    want = [i for i, flag in enumerate(mask.tolist()) if flag]
    assert _true_indices(mask).tolist() == want


def test_true_indices_of_a_row_block_inside_a_batch():
    # A block of rows of a (N, C) mask starts at row * C bytes: unaligned for an odd C, as in the count path.
    generator = torch.Generator().manual_seed(7)
    positive = torch.rand(60, 527, generator=generator) < 0.01
    for start in (1, 3, 5, 8):
        block = positive[start : start + 20]
        assert block.storage_offset() % 8 != 0 or start == 8
        want = [r * 527 + c for r, row in enumerate(block.tolist()) for c, flag in enumerate(row) if flag]
        assert _true_indices(block).tolist() == want
