"""The contract of the compiled kernels: the score dtypes they rank, the tie rules they apply themselves, and the
check of their arguments before any launch. A leaf: the kernels and the engine above them import it.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

#: Tie rules the compiled kernels apply themselves; the others are reductions over label counts.
KERNEL_TIES = ("max", "index")

#: Score dtypes the compiled paths rank.
SCORE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_kernel_args(
    engine: str,
    preds: Tensor,
    positive: Tensor,
    known: Optional[Tensor],
    sums: Tuple[Tensor, Tensor, Tensor, Tensor, Tensor],
    ties: str,
    cpu_only: bool = False,
) -> None:
    """Arguments of a compiled path's kernel (``_numba_kernel``, ``_triton_kernel``), checked before any launch.

    ``sums`` are the five outputs in the order of :class:`torch_lwlrap._ranking.RankingSums`.
    """
    if ties not in KERNEL_TIES:
        raise ValueError(
            f"The {engine} kernel ranks with `ties` in {KERNEL_TIES}, but got {ties!r}: "
            "ranking_sums computes the other rules from label counts."
        )
    where = " on the CPU" if cpu_only else ""
    if preds.dtype not in SCORE_DTYPES or (cpu_only and preds.device.type != "cpu"):
        raise TypeError(
            f"The {engine} engine ranks float16, bfloat16, float32 or float64 scores{where}, but got dtype "
            f"{preds.dtype}" + (f" on {preds.device}." if cpu_only else ".")
        )
    for name, value in (("positive", positive), ("known", known)):
        if value is not None and (value.dtype != torch.bool or value.shape != preds.shape):
            raise ValueError(
                f"Argument `{name}` must be a bool tensor of the shape of `preds` {tuple(preds.shape)}, but got "
                f"dtype {value.dtype} and shape {tuple(value.shape)}."
            )
    num_samples, num_classes = preds.shape
    names = ("class_precision_sum", "class_label_count", "sample_precision_sum", "sample_label_count",
             "sample_known_count")
    sizes = (num_classes, num_classes, num_samples, num_samples, num_samples)
    dtypes = (torch.float64, torch.int64, torch.float64, torch.int64, torch.int64)
    for name, value, size, dtype in zip(names, sums, sizes, dtypes):
        if value.dtype != dtype or value.shape != (size,) or not value.is_contiguous():
            raise ValueError(
                f"Argument `{name}` must be a contiguous {str(dtype)[6:]} tensor of shape ({size},), but got dtype "
                f"{value.dtype}, shape {tuple(value.shape)} and strides {value.stride()}."
            )
