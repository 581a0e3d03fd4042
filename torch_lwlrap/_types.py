"""The engine's result types, shared by every path and the kernels' callers: a leaf."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["LabelCounts", "RankingSums", "ScoresContainNaN"]


class RankingSums(NamedTuple):
    """Sums of label precisions ``L_ij / rank_ij`` over the positives of a batch."""

    class_precision_sum: Tensor  #: (C,) float64, summed over samples
    class_label_count: Tensor  #: (C,) int64, positives per class
    sample_precision_sum: Tensor  #: (N,) float64, summed over classes
    sample_label_count: Tensor  #: (N,) int64, positives per sample
    sample_known_count: Tensor  #: (N,) int64, labels per sample that are not ignored

    @classmethod
    def zeros(cls, num_samples: int, num_classes: int, device=None) -> "RankingSums":
        """The sums of a batch before any path ran, all zero: every path (the kernels, the torch paths, the
        reductions over label counts) adds to the class sums and adds to or overwrites the per-sample ones."""
        return cls(
            torch.zeros(num_classes, dtype=torch.float64, device=device),
            torch.zeros(num_classes, dtype=torch.int64, device=device),
            torch.zeros(num_samples, dtype=torch.float64, device=device),
            torch.zeros(num_samples, dtype=torch.int64, device=device),
            torch.zeros(num_samples, dtype=torch.int64, device=device),
        )


class LabelCounts(NamedTuple):
    """Counts for each positive label of a chunk of rows, ignored labels removed from the rows.

    :func:`torch_lwlrap._ranking.label_counts_chunks` gives dense ``(n, C)`` tensors, zero where ``positive`` is
    False; the engine's CPU path uses the same tuple over the ``(P,)`` positives of a chunk (``positive`` all True).
    Counts are int32.
    """

    positive: Tensor  #: bool: a positive label that is not ignored
    above: Tensor  #: ``A``: labels of the row scoring strictly higher
    above_positive: Tensor  #: ``A_p``: positives among them
    tied: Tensor  #: ``g``: labels with exactly the same score, itself included (>= 1)
    tied_positive: Tensor  #: ``p``: positives among them, itself included (>= 1)
    tied_before: Tensor  #: ``b``: tied labels at a lower column (what ``ties="index"`` puts ahead)
    tied_positive_before: Tensor  #: ``b_p``: positives among them


class ScoresContainNaN(ValueError):
    """Raised by :func:`ranking_sums` with ``check_nan=True`` when a score is NaN."""
