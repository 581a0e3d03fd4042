"""torch_lwlrap: exact, fast lwlrap and LRAP for PyTorch and torchmetrics."""

from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class
from torch_lwlrap.metrics import MultilabelLRAP, MultilabelLWLRAP

__version__ = "0.1.0"

__all__ = [
    "MultilabelLRAP",
    "MultilabelLWLRAP",
    "__version__",
    "multilabel_lrap",
    "multilabel_lwlrap",
    "multilabel_lwlrap_per_class",
]
