"""torch_lwlrap: exact, fast lwlrap and LRAP for PyTorch and torchmetrics."""

from typing import Any

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
    # The metric classes import torchmetrics (and through it scipy): load them on first use only, so the
    # functions and the command line start fast.
    if name in ("MultilabelLWLRAP", "MultilabelLRAP"):
        from torch_lwlrap import metrics

        return getattr(metrics, name)
    raise AttributeError(f"module 'torch_lwlrap' has no attribute {name!r}")
