"""Where the user's code meets the package on the stack: which frames are the library's, and warnings issued at the
user's line. Pure Python, the lowest layer: any module may warn the user, the compiled kernels' runner included.
"""

from __future__ import annotations

import sys
import warnings

__all__ = ["LIBRARY_MODULES", "in_library", "warn"]

#: Modules whose frames sit between a user's call and the package's checks and warnings: the package, torchmetrics
#: and torch (a metric's ``forward`` and ``update`` are called through them, a compiled step through dynamo).
LIBRARY_MODULES = ("torch_lwlrap", "torchmetrics", "torch", "contextlib", "functools")


def in_library(frame) -> bool:
    """Whether ``frame`` runs code of :data:`LIBRARY_MODULES`."""
    return frame.f_globals.get("__name__", "").split(".")[0] in LIBRARY_MODULES


def warn(message: str, category: type = UserWarning) -> None:
    """``warnings.warn`` at the user's line: the first frame outside :data:`LIBRARY_MODULES`, however many of the
    package's frames (the wrapper that runs a call eagerly under ``torch.compile``, a metric's method through
    torchmetrics') are between."""
    frame, level = sys._getframe(1), 2
    while frame.f_back is not None and in_library(frame):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
