"""Boundary cases of the numba kernels that the other tests leave out, through the public functions.

Each case puts the one thing that matters in the last column of a row (a NaN score, a target value other than 0
and 1): a check that stops a column short must still see it. The paths are picked by the inputs a user passes, as
the engine picks them: a contiguous float32 batch with a bool target takes the one compiled pass, float16 scores
or a non-contiguous target take the passes (the gate's compiled target check, then the ranking kernel).
"""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch

from tests.reference import make_case, naive_lwlrap
from torch_lwlrap import MultilabelLWLRAP, multilabel_lrap, multilabel_lwlrap
from torch_lwlrap._ranking import use_engine

HAS_NUMBA = importlib.util.find_spec("numba") is not None
pytestmark = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (pip install numba: the cpu extra)")

NAN_ERROR = r"`preds` contains NaN \(first at index \({}, 5\)\)"
BAD_TARGET = r"`target` must contain only 0.* but found the values \[2"


def _case():
    """9 x 6 tied scores without infinities; the last column is positive in the odd rows, negative in the others."""
    preds, target = make_case(5, 9, 6, infinite=False)
    target[:, 5] = torch.arange(9) % 2
    return preds, target


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("target_kind", ["bool", "long", "float"])
@pytest.mark.parametrize("row", [3, 8])  # under a positive; under a negative, in the last row
@pytest.mark.parametrize("ties", ["max", "expected"])  # the ranking kernels; the counts pass
def test_a_nan_score_in_the_last_column_is_reported(dtype, target_kind, row, ties):
    preds, target = _case()
    target = {"bool": target.bool(), "long": target, "float": target.float()}[target_kind]
    preds = preds.to(dtype)
    preds[row, 5] = math.nan
    message = NAN_ERROR.format(row)
    with use_engine("numba"):
        with pytest.raises(ValueError, match=message):
            multilabel_lwlrap(preds, target, ties=ties)
        with pytest.raises(ValueError, match=message):
            multilabel_lrap(preds, target, ties=ties)
        metric = MultilabelLWLRAP(num_labels=6, ties=ties)
        with pytest.raises(ValueError, match=message):
            metric.update(preds, target)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.int64, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("ignore_index", [None, -1])
def test_a_bad_target_value_in_the_last_column_of_a_strided_target_is_reported(dtype, ignore_index):
    # A target that is not contiguous (a transposed one, or a column slice) is checked by the gate's compiled pass.
    preds, target = _case()
    if ignore_index is not None and dtype != torch.uint8:
        target[::3, 1] = ignore_index
    strided = target.to(dtype).T.contiguous().T
    assert not strided.is_contiguous()
    strided[4, 5] = 2
    with use_engine("numba"):
        with pytest.raises(ValueError, match=BAD_TARGET):
            multilabel_lwlrap(preds, strided, ignore_index=ignore_index)
        with pytest.raises(ValueError, match=BAD_TARGET):
            multilabel_lrap(preds, strided, ignore_index=ignore_index)
    # The same target with its value fixed is ranked as the naive loop ranks it.
    strided[4, 5] = 1
    with use_engine("numba"):
        got = multilabel_lwlrap(preds, strided, ignore_index=ignore_index).item()
    want = naive_lwlrap(preds, strided.long(), ignore_index=ignore_index)
    assert got == pytest.approx(want, rel=1e-12)
