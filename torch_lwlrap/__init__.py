"""torch_lwlrap: exact, fast lwlrap and LRAP for PyTorch and torchmetrics."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch_lwlrap._dispatch import EngineFallbackWarning
    from torch_lwlrap._engine_config import get_engine, use_engine
    from torch_lwlrap.functional import (
        Comparison,
        Interval,
        TieReport,
        compare_lwlrap,
        multilabel_coverage_error,
        multilabel_kendall_distance_at_k,
        multilabel_lrap,
        multilabel_lrap_ci,
        multilabel_lwlrap,
        multilabel_lwlrap_ci,
        multilabel_lwlrap_per_class,
        multilabel_ndcg,
        multilabel_one_error,
        multilabel_rank_correlation,
        multilabel_ranking_loss,
        multilabel_retrieval_at_k,
        tie_report,
    )
    from torch_lwlrap.metrics import (
        MultilabelCoverageError,
        MultilabelKendallDistanceAtK,
        MultilabelLRAP,
        MultilabelLWLRAP,
        MultilabelNDCG,
        MultilabelOneError,
        MultilabelRankCorrelation,
        MultilabelRankingLoss,
        MultilabelRankingMetrics,
        MultilabelRetrievalAtK,
        MultilabelTieReport,
    )

__version__ = "0.1.0"


#: Where each public name lives: the functions, the metric classes and the engine setting.
_HOMES = {
    "torch_lwlrap._dispatch": ("EngineFallbackWarning",),
    "torch_lwlrap._engine_config": ("get_engine", "use_engine"),
    "torch_lwlrap.functional": (
        "Comparison", "Interval", "TieReport", "compare_lwlrap", "multilabel_coverage_error",
        "multilabel_kendall_distance_at_k", "multilabel_lrap", "multilabel_lrap_ci", "multilabel_lwlrap",
        "multilabel_lwlrap_ci", "multilabel_lwlrap_per_class", "multilabel_ndcg", "multilabel_one_error",
        "multilabel_rank_correlation", "multilabel_ranking_loss", "multilabel_retrieval_at_k", "tie_report",
    ),
    "torch_lwlrap.metrics": (
        "MultilabelCoverageError", "MultilabelKendallDistanceAtK", "MultilabelLRAP", "MultilabelLWLRAP",
        "MultilabelNDCG", "MultilabelOneError", "MultilabelRankCorrelation", "MultilabelRankingLoss",
        "MultilabelRankingMetrics", "MultilabelRetrievalAtK", "MultilabelTieReport",
    ),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted([*_HOME, "__version__"])


def __getattr__(name: str) -> Any:
    # Loaded on first use: the functions import torch, the metric classes torchmetrics (and through it scipy), so
    # the command line reads and checks its files (and answers --help) before paying for either.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'torch_lwlrap' has no attribute {name!r}")


def __dir__() -> list:
    # The public names are loaded on first use (above), so list them for dir() and tab completion.
    return sorted(set(globals()) | set(__all__))
