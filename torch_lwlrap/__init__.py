"""torch_lwlrap: exact, fast lwlrap and LRAP for PyTorch and torchmetrics."""

from typing import Any

from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class
from torch_lwlrap.ranking_functional import (
    multilabel_coverage_error,
    multilabel_one_error,
    multilabel_ranking_loss,
    multilabel_retrieval_at_k,
)

__version__ = "0.1.0"

__all__ = [
    "MultilabelCoverageError",
    "MultilabelLRAP",
    "MultilabelLWLRAP",
    "MultilabelOneError",
    "MultilabelRankingLoss",
    "MultilabelRankingMetrics",
    "MultilabelRetrievalAtK",
    "__version__",
    "multilabel_coverage_error",
    "multilabel_lrap",
    "multilabel_lwlrap",
    "multilabel_lwlrap_per_class",
    "multilabel_one_error",
    "multilabel_ranking_loss",
    "multilabel_retrieval_at_k",
]

_RANKING_CLASSES = (
    "MultilabelCoverageError",
    "MultilabelOneError",
    "MultilabelRankingLoss",
    "MultilabelRankingMetrics",
    "MultilabelRetrievalAtK",
)


def __getattr__(name: str) -> Any:
    # The metric classes import torchmetrics (and through it scipy): load them on first use only, so the
    # functions and the command line start fast.
    if name in ("MultilabelLWLRAP", "MultilabelLRAP"):
        from torch_lwlrap import metrics

        return getattr(metrics, name)
    if name in _RANKING_CLASSES:
        from torch_lwlrap import ranking_metrics

        return getattr(ranking_metrics, name)
    raise AttributeError(f"module 'torch_lwlrap' has no attribute {name!r}")
