"""torch_lwlrap: exact, fast lwlrap and LRAP for PyTorch and torchmetrics."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class
    from torch_lwlrap.intervals import Comparison, Interval, compare_lwlrap, multilabel_lrap_ci, multilabel_lwlrap_ci

__version__ = "0.1.0"

__all__ = [
    "Comparison",
    "Interval",
    "MultilabelLRAP",
    "MultilabelLWLRAP",
    "__version__",
    "compare_lwlrap",
    "multilabel_lrap",
    "multilabel_lrap_ci",
    "multilabel_lwlrap",
    "multilabel_lwlrap_ci",
    "multilabel_lwlrap_per_class",
]


def __getattr__(name: str) -> Any:
    # Loaded on first use: the functions import torch, the metric classes torchmetrics (and through it scipy), so
    # the command line reads and checks its files (and answers --help) before paying for either.
    if name in ("multilabel_lrap", "multilabel_lwlrap", "multilabel_lwlrap_per_class"):
        from torch_lwlrap import functional

        return getattr(functional, name)
    if name in ("Comparison", "Interval", "compare_lwlrap", "multilabel_lrap_ci", "multilabel_lwlrap_ci"):
        from torch_lwlrap import intervals

        return getattr(intervals, name)
    if name in ("MultilabelLWLRAP", "MultilabelLRAP"):
        from torch_lwlrap import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'torch_lwlrap' has no attribute {name!r}")
