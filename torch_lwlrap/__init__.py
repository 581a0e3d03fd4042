"""torch_lwlrap: exact, fast lwlrap and LRAP for PyTorch and torchmetrics."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch_lwlrap._ranking import EngineFallbackWarning, get_engine, use_engine
    from torch_lwlrap._tie_report import TieReport, tie_report
    from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class
    from torch_lwlrap.intervals import Comparison, Interval, compare_lwlrap, multilabel_lrap_ci, multilabel_lwlrap_ci
    from torch_lwlrap.ltr_functional import multilabel_kendall_distance_at_k, multilabel_ndcg, multilabel_rank_correlation
    from torch_lwlrap.ltr_metrics import MultilabelKendallDistanceAtK, MultilabelNDCG, MultilabelRankCorrelation
    from torch_lwlrap.ranking_functional import (
        multilabel_coverage_error,
        multilabel_one_error,
        multilabel_ranking_loss,
        multilabel_retrieval_at_k,
    )

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "Interval",
    "EngineFallbackWarning",
    "MultilabelCoverageError",
    "MultilabelKendallDistanceAtK",
    "MultilabelLRAP",
    "MultilabelLWLRAP",
    "MultilabelNDCG",
    "MultilabelOneError",
    "MultilabelRankCorrelation",
    "MultilabelRankingLoss",
    "MultilabelRankingMetrics",
    "MultilabelRetrievalAtK",
    "MultilabelTieReport",
    "TieReport",
    "__version__",
    "compare_lwlrap",
    "get_engine",
    "multilabel_coverage_error",
    "multilabel_kendall_distance_at_k",
    "multilabel_lrap",
    "multilabel_lrap_ci",
    "multilabel_lwlrap",
    "multilabel_lwlrap_ci",
    "multilabel_lwlrap_per_class",
    "multilabel_ndcg",
    "multilabel_one_error",
    "multilabel_rank_correlation",
    "multilabel_ranking_loss",
    "multilabel_retrieval_at_k",
    "tie_report",
    "use_engine",
]

_RANKING_FUNCTIONS = (
    "multilabel_coverage_error",
    "multilabel_one_error",
    "multilabel_ranking_loss",
    "multilabel_retrieval_at_k",
)
_RANKING_CLASSES = (
    "MultilabelCoverageError",
    "MultilabelOneError",
    "MultilabelRankingLoss",
    "MultilabelRankingMetrics",
    "MultilabelRetrievalAtK",
)

_LTR_FUNCTIONS = ("multilabel_kendall_distance_at_k", "multilabel_ndcg", "multilabel_rank_correlation")
_LTR_CLASSES = ("MultilabelKendallDistanceAtK", "MultilabelNDCG", "MultilabelRankCorrelation")


def __getattr__(name: str) -> Any:
    # Loaded on first use: the functions import torch, the metric classes torchmetrics (and through it scipy), so
    # the command line reads and checks its files (and answers --help) before paying for either.
    if name in ("multilabel_lrap", "multilabel_lwlrap", "multilabel_lwlrap_per_class"):
        from torch_lwlrap import functional

        return getattr(functional, name)
    if name in ("Comparison", "Interval", "compare_lwlrap", "multilabel_lrap_ci", "multilabel_lwlrap_ci"):
        from torch_lwlrap import intervals

        return getattr(intervals, name)
    if name in ("EngineFallbackWarning", "get_engine", "use_engine"):
        from torch_lwlrap import _ranking

        return getattr(_ranking, name)
    if name in _RANKING_FUNCTIONS:
        from torch_lwlrap import ranking_functional

        return getattr(ranking_functional, name)
    if name in ("TieReport", "tie_report"):
        from torch_lwlrap import _tie_report

        return getattr(_tie_report, name)
    if name in ("MultilabelLWLRAP", "MultilabelLRAP", "MultilabelTieReport"):
        from torch_lwlrap import metrics

        return getattr(metrics, name)
    if name in _RANKING_CLASSES:
        from torch_lwlrap import ranking_metrics

        return getattr(ranking_metrics, name)
    if name in _LTR_FUNCTIONS:
        from torch_lwlrap import ltr_functional

        return getattr(ltr_functional, name)
    if name in _LTR_CLASSES:
        from torch_lwlrap import ltr_metrics

        return getattr(ltr_metrics, name)
    raise AttributeError(f"module 'torch_lwlrap' has no attribute {name!r}")


def __dir__() -> list:
    # The public names are loaded on first use (above), so list them for dir() and tab completion.
    return sorted(set(globals()) | set(__all__))
