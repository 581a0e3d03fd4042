"""The tie report: how much tied scores can move lwlrap, from the engine's label counts.

Each tie group of a row contributes to the sum of precisions independently of the others, so the extreme orders are
found group by group: the best order puts the group's positives first (its ``q``-th positive scores
``(A_p + q) / (A + q)``), the worst puts them last (``(A_p + q) / (A + g - p + q)``); see
:mod:`torch_lwlrap._tie_rules`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from torch import Tensor

from torch_lwlrap._checks import check_batch, check_ignore_index, formatted_chunks
from torch_lwlrap._engine_config import eager_only
from torch_lwlrap._gate_messages import nan_scores_error
from torch_lwlrap._ranking import TIE_SUM_RULES, ScoresContainNaN, TieSums, forced_chunk_elements, tie_sums


@dataclass(frozen=True)
class TieReport:
    """How tied scores move the (weighted) lwlrap of a set of predictions.

    ``lwlrap_best`` and ``lwlrap_worst`` are the exact extremes of lwlrap over every order of tied scores;
    ``lwlrap_expected`` is its mean over uniformly random orders (``ties="expected"``) and ``lwlrap_max``
    scikit-learn's rule (``ties="max"``, the default), which is not the value of any one order: it is never below
    ``lwlrap_worst`` (a positive tied with negatives counts them all above it, as the worst order does) but can lie
    above ``lwlrap_best`` (positives tied with each other each count all of them as hits: scores ``[0.9, 0.5, 0.5]``
    with the last two positive give ``2/3`` under ``"max"``, ``7/12`` in either order).
    """

    label_count: int  #: positive labels (ignored ones excluded)
    tied_label_count: int  #: positive labels whose score equals another (known) label's score in their sample
    tied_share: float  #: ``tied_label_count / label_count`` (NaN without positive)
    lwlrap_max: float
    lwlrap_expected: float
    lwlrap_best: float
    lwlrap_worst: float

    @property
    def has_ties(self) -> bool:
        """Whether any positive label is tied, so that the tie rule can change the score."""
        return self.tied_label_count > 0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_sums(cls, sums: TieSums) -> "TieReport":
        count = int(sums.label_count)
        tied = int(sums.tied_label_count)
        values = (sums.precision_sum / count).tolist() if count else [float("nan")] * len(TIE_SUM_RULES)
        by_rule = dict(zip(TIE_SUM_RULES, values))
        return cls(
            label_count=count,
            tied_label_count=tied,
            tied_share=tied / count if count else float("nan"),
            lwlrap_max=by_rule["max"],
            lwlrap_expected=by_rule["expected"],
            lwlrap_best=by_rule["best"],
            lwlrap_worst=by_rule["worst"],
        )


def tie_sums_update(
    preds: Tensor, target: Tensor, num_labels: Optional[int], ignore_index: Optional[int], validate_args: bool
) -> TieSums:
    """The :class:`TieSums` of a checked batch, summed over its chunks (sum-only statistics)."""
    numba_path, preds, target, _ = check_batch(preds, target, num_labels, ignore_index, validate_args, nan_later=True)
    total = None
    for scores, positive, known, _ in formatted_chunks(
        preds, target, ignore_index, None, forced_chunk_elements(), numba_path
    ):
        try:
            sums = tie_sums(scores, positive, known, check_nan=validate_args and numba_path)
        except ScoresContainNaN:
            raise nan_scores_error(preds) from None
        total = sums if total is None else TieSums(*(a + b for a, b in zip(total, sums)))
    return total


@eager_only
def tie_report(
    preds: Tensor,
    target: Tensor,
    num_labels: Optional[int] = None,
    *,
    ignore_index: Optional[int] = None,
    validate_args: bool = True,
) -> TieReport:
    """How much tied scores can move lwlrap: the share of tied positive labels and lwlrap's exact range over tie
    orders, beside its value under ``ties="max"`` and ``ties="expected"``.

    Scores tie more often than one expects: float32 sigmoid outputs saturate at exactly 1.0 from logits of about 17,
    and rounded or low-precision scores collide. Sort-based implementations (the challenge's own code among them)
    then score an arbitrary order of the tied labels. Without a tied positive, every rule and both bounds agree.

    Arguments as in :func:`torch_lwlrap.multilabel_lwlrap`.

    Example:
        >>> import torch
        >>> from torch_lwlrap import tie_report
        >>> preds = torch.tensor([[1.0, 1.0, 1.0, 0.2], [0.9, 0.1, 0.4, 0.4]])
        >>> target = torch.tensor([[1, 0, 1, 0], [0, 0, 1, 0]])
        >>> report = tie_report(preds, target)
        >>> report.tied_label_count, report.label_count
        (3, 3)
        >>> round(report.lwlrap_worst, 4), round(report.lwlrap_max, 4), round(report.lwlrap_expected, 4)
        (0.5, 0.5556, 0.6759)
        >>> round(report.lwlrap_best, 4)
        0.8333
    """
    ignore_index = check_ignore_index(ignore_index)
    return TieReport.from_sums(tie_sums_update(preds, target, num_labels, ignore_index, validate_args))
