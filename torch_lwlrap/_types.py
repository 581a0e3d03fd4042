"""The engine's result types, shared by every path and the kernels' callers: a leaf."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["RankingSums", "ScoresContainNaN"]


class RankingSums(NamedTuple):
    """Sums of label precisions ``L_ij / rank_ij`` over the positives of a batch."""

    class_precision_sum: Tensor  #: (C,) float64, summed over samples
    class_label_count: Tensor  #: (C,) int64, positives per class
    sample_precision_sum: Tensor  #: (N,) float64, summed over classes
    sample_label_count: Tensor  #: (N,) int64, positives per sample
    sample_known_count: Tensor  #: (N,) int64, labels per sample that are not ignored

    @classmethod
    def for_kernel(cls, num_samples: int, num_classes: int, device=None) -> "RankingSums":
        """Outputs for a compiled kernel: class sums zeroed (kernels add to them), per-sample ones uninitialized
        (kernels overwrite them)."""
        return cls(
            torch.zeros(num_classes, dtype=torch.float64, device=device),
            torch.zeros(num_classes, dtype=torch.int64, device=device),
            torch.empty(num_samples, dtype=torch.float64, device=device),
            torch.empty(num_samples, dtype=torch.int64, device=device),
            torch.empty(num_samples, dtype=torch.int64, device=device),
        )


class ScoresContainNaN(ValueError):
    """Raised by :func:`ranking_sums` with ``check_nan=True`` when a score is NaN."""
