"""The input gate's messages for values it refuses (:mod:`torch_lwlrap._checks` decides, this module words):
what was wrong, in which argument, with the offending values, and the fix they point to, naming the call the user
made (:func:`user_call`)."""

from __future__ import annotations

import functools
import math
import sys
from typing import Optional

import torch
from torch import Tensor

from torch_lwlrap import _engine_config, _user_frames

__all__ = [
    "MAX_EXPONENTIAL_RELEVANCE", "bad_relevance_error", "bad_target_error", "bad_weights_error", "float_holds",
    "nan_scores_error", "user_call",
]

#: Relevance grades of ``gain="exponential"`` must stay below this: ``2**1024`` is not a float64.
MAX_EXPONENTIAL_RELEVANCE = 1024


@functools.lru_cache(maxsize=64)
def _stored_as(dtype: torch.dtype, value: int) -> float:
    """The integer ``value`` as the float ``dtype`` stores it (rounded), as torch rounds it in a comparison."""
    return torch.tensor(value, dtype=dtype).item()


def float_holds(dtype: torch.dtype, value: int) -> bool:
    """Whether the float ``dtype`` holds the integer ``value`` exactly: torch rounds a Python number to a tensor's
    dtype when it compares the two, so a value it cannot hold would equal its rounding.

    >>> float_holds(torch.float32, 16777216), float_holds(torch.float32, 16777217), float_holds(torch.float16, -1)
    (True, False, True)
    """
    return _stored_as(dtype, value) == value


def unheld_mark(values: Tensor, ignore_index: Optional[int]) -> Optional[float]:
    """``ignore_index`` as the float dtype of ``values`` stores it, where that dtype cannot hold it exactly (a value
    equal to it is then neither the mark nor a label); None otherwise.

    >>> unheld_mark(torch.zeros(1), 16777217), unheld_mark(torch.zeros(1), -1), unheld_mark(torch.zeros(1), None)
    (16777216.0, None, None)
    """
    if ignore_index is None or not values.is_floating_point() or float_holds(values.dtype, ignore_index):
        return None
    return _stored_as(values.dtype, ignore_index)


def user_call(second: str = "target=labels") -> str:
    """How the user called into the package, for an error that tells them how to call it: the outermost call of a
    :mod:`torch_lwlrap` function or method below the first frame outside the library, written as a call with the
    scores first, in backticks (```multilabel_ranking_loss(preds=scores, target=labels)```, or
    ```metric.update(preds=scores, target=labels)` on your MultilabelLWLRAP`` for a metric's ``update``,
    ```metric(...)``` for its ``forward``). Read on the error path only.
    """
    frame, outermost = sys._getframe(1), None
    while frame is not None and _user_frames.in_library(frame):
        in_package = frame.f_globals.get("__name__", "").startswith("torch_lwlrap")
        if in_package and not _engine_config.is_eager_wrapper(frame):
            outermost = frame
        frame = frame.f_back
    if outermost is None:
        return f"`multilabel_lwlrap(preds=scores, {second})`"
    name, owner = outermost.f_code.co_name, outermost.f_locals.get("self")
    if owner is not None:
        call = "metric" if name == "forward" else f"metric.{name}"
        return f"`{call}(preds=scores, {second})` on your {type(owner).__name__}"
    if "preds_a" in outermost.f_code.co_varnames[: outermost.f_code.co_argcount + outermost.f_code.co_kwonlyargcount]:
        return f"`{name}(preds_a=scores_a, preds_b=scores_b, target=labels)`"
    return f"`{name}(preds=scores, {second})`"


def nan_scores_error(preds: Tensor) -> ValueError:
    """The error for scores with a NaN, naming the index of the first one."""
    where = torch.isnan(preds).nonzero()[0].tolist()
    return ValueError(f"Argument `preds` contains NaN (first at index {tuple(where)}); NaN scores cannot be ranked.")


def bad_target_error(preds: Tensor, target: Tensor, bad: Tensor, ignore_index: Optional[int]) -> ValueError:
    """The error for a target with values other than 0, 1 and ``ignore_index`` (``bad``: where), with the fix its
    values point to: swapped arguments, soft labels, marks of unknown labels."""
    found = _distinct(target[bad])
    digits = {torch.float16: 4, torch.bfloat16: 3, torch.float32: 7}.get(target.dtype)
    shown = [  # the dtype's own digits, whole numbers in full (16777216.0, not 16777220.0)
        repr(float(f"{value:.{digits}g}")) if digits and not float(value).is_integer() else repr(value)
        for value in found[:10].tolist()
    ]
    allowed = "0 and 1" if ignore_index is None else f"0, 1 and ignore_index={ignore_index}"
    message = f"Argument `target` must contain only {allowed}, but found the values [{', '.join(shown)}]"
    nan = bool(torch.isnan(found).any()) if found.is_floating_point() else False
    finite = found[~torch.isnan(found)] if nan else found
    known = preds if preds.dtype == torch.bool else ((preds == 0) | (preds == 1))
    fractional = finite.is_floating_point() and bool((finite != finite.round()).any())
    bits = torch.iinfo(target.dtype).bits if not (target.is_floating_point() or target.dtype.is_signed) else 0
    # the usual marks of unknown labels (ignore_index's, or -1 and torch's -100) wrapped by an unsigned dtype
    marks = (-1, -100) if ignore_index is None or ignore_index >= 0 else (ignore_index,)
    stored = int(finite[0]) if bits and finite.numel() == 1 else None
    rounded_mark = unheld_mark(target, ignore_index)
    if stored is not None and stored - 2**bits in marks:
        fix = (
            f"`target` is {str(target.dtype).replace('torch.', '')}, which holds no negative value: "
            f"{stored - 2 ** bits} written into it is stored as {stored}. If these values mark unknown labels, pass "
            f"`ignore_index={stored}`, or keep the labels in a signed dtype and pass "
            f"`ignore_index={stored - 2 ** bits}`: `target.to(torch.int64).masked_fill(target == {stored}, "
            f"{stored - 2 ** bits})` (or convert before marking)"
        )
    elif rounded_mark is not None and bool((found == rounded_mark).any()):
        kind = str(target.dtype).replace("torch.", "")
        fix = (
            f"`target` is {kind}, which cannot hold ignore_index={ignore_index} exactly (it is stored as "
            f"{rounded_mark!r}), so none of its values is that mark: mark unknown labels with a value {kind} holds "
            "(-1, say, and pass `ignore_index=-1`), or keep the labels in an integer dtype"
        )
    elif fractional and bool(known.all()) and preds.numel():  # scores in target, labels in preds
        fix = f"`preds` holds only 0 and 1: the arguments look swapped, pass the scores first, {user_call()}"
    elif nan or (finite.numel() and bool((finite < 0).all())):
        mark = "-1" if nan else shown[0]
        fix = (
            f"if {'NaN marks' if nan else 'they mark'} unknown labels, pass `ignore_index={mark}`"
            + (" after `target.nan_to_num(-1)`" if nan else "")
            + ": they are then neither positive nor ranked"
        )
    elif finite.numel() and bool(((finite > 0) & (finite < 1)).all()):
        fix = (
            "soft labels (0 < value < 1) are not positives or negatives: threshold them (`target > 0.5`), or score "
            "graded relevance with `multilabel_ndcg`"
        )
    else:
        fix = "pass 0/1 (or bool) labels, one per class"
    return ValueError(f"{message}: {fix}.")


def bad_relevance_error(relevance: Tensor, bad: Tensor, ignore_index: Optional[int], gain: str) -> ValueError:
    """The error for grades that :func:`_bad_relevance` refuses (``bad``: where): the rules they break, their
    distinct values, and the fix they point to (marks of unknown labels, grades too large for exponential gains)."""
    found = _distinct(relevance[bad])
    nan = found.is_floating_point() and bool(torch.isnan(found).any())
    finite = found[torch.isfinite(found)] if found.is_floating_point() else found
    invalid = nan or bool((found < 0).any()) or bool((found == math.inf).any())
    large = gain == "exponential" and bool((finite >= MAX_EXPONENTIAL_RELEVANCE).any())
    rules = []
    if invalid:
        rules.append("non-negative and finite" + ("" if ignore_index is None else f" (or {ignore_index})"))
    if large:
        rules.append(f'below {MAX_EXPONENTIAL_RELEVANCE} with gain="exponential" (2**rel - 1 must be a float64)')
    shown = ", ".join(repr(value) for value in found[:5].tolist()) + (", ..." if found.numel() > 5 else "")
    where = tuple(bad.nonzero()[0].tolist())
    fixes = []
    marks = found[found < 0]
    whole_mark = marks.numel() == 1 and float(marks[0]) == round(float(marks[0])) and float(marks[0]) >= -(2**63)
    if nan or (whole_mark and not bool((found == math.inf).any())):
        mark = "-1" if nan else str(int(marks[0].item()))
        fixes.append(
            f"if {'NaN marks' if nan else 'they mark'} unknown labels, pass `ignore_index={mark}`"
            + (" after `relevance.nan_to_num(-1)`" if nan else "")
            + ": they are then left out of the ranking"
        )
    if large:
        fixes.append('for grades this large pass `gain="linear"`, which takes each grade as its gain')
    fix = (" Fix: " + "; ".join(fixes) + ".") if fixes else ""
    return ValueError(
        f"Argument `relevance` must be {' and '.join(rules)}, but found the values [{shown}] (first at index "
        f"{where}). Relevance grades are the graded targets: 0 for irrelevant labels, larger for more relevant "
        f"ones.{fix}"
    )


def bad_weights_error(sample_weight: Tensor) -> ValueError:
    """The error for sample weights with a negative, infinite or NaN value: the distinct values, where the first is."""
    bad = torch.isnan(sample_weight) | (sample_weight < 0) | torch.isinf(sample_weight)
    found = _distinct(sample_weight[bad])[:10].tolist()
    return ValueError(
        f"Argument `sample_weight` must be non-negative and finite, but found the values {found} (first at index "
        f"{tuple(bad.nonzero()[0].tolist())}): give each sample a weight of 0 or more (0 leaves it out)."
    )


def _distinct(values: Tensor) -> Tensor:
    """The distinct values of ``values``, sorted, a NaN among them once (``torch.unique`` keeps each NaN apart)."""
    found = torch.unique(values)
    if found.is_floating_point() and bool(torch.isnan(found).any()):
        found = torch.cat([found[~torch.isnan(found)], found[torch.isnan(found)][:1]])
    return found
