"""TEMPORARY stand-in for the per-positive counts primitive of ``torch_lwlrap._ranking`` (branch ``ties``).

Same interface as planned there (:class:`LabelCounts`, :func:`label_counts_chunks`, :func:`label_precision`); a
plain torch implementation, gathered row by row. Deleted once the primitive is on main.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Tuple

import torch
from torch import Tensor

from torch_lwlrap._checks import formatted_chunks


class LabelCounts(NamedTuple):
    positive: Tensor
    above: Tensor
    above_positive: Tensor
    tied: Tensor
    tied_positive: Tensor
    tied_before: Tensor
    tied_positive_before: Tensor


def _chunk_counts(scores: Tensor, positive: Tensor, known: Optional[Tensor]) -> LabelCounts:
    n, c = scores.shape
    if known is None:
        known = torch.ones_like(positive)
    positive = positive & known
    out = [torch.zeros((n, c), dtype=torch.int64, device=scores.device) for _ in range(6)]
    flat = positive.reshape(-1).nonzero().squeeze(1)
    rows, cols = flat // max(c, 1), flat % max(c, 1)
    column = torch.arange(c, device=scores.device)
    step = max(1, (1 << 20) // max(c, 1))
    for start in range(0, flat.numel(), step):
        r, j = rows[start : start + step], cols[start : start + step]
        row = scores.index_select(0, r)
        value = row.gather(1, j.unsqueeze(1))
        k, p = known.index_select(0, r), positive.index_select(0, r)
        above = (row > value) & k
        tied = (row == value) & k
        before = tied & (column < j.unsqueeze(1))
        for tensor, mask in zip(out, (above, above & p, tied, tied & p, before, before & p)):
            tensor.view(-1)[flat[start : start + step]] = mask.sum(1)
    return LabelCounts(positive, *out)


def label_counts_chunks(
    preds: Tensor, target: Tensor, ignore_index: Optional[int] = None
) -> Iterator[Tuple[int, LabelCounts]]:
    first = 0
    for scores, positive, known, _ in formatted_chunks(preds, target, ignore_index):
        yield first, _chunk_counts(scores, positive, known)
        first += scores.shape[0]


def label_precision(counts: LabelCounts, ties: str) -> Tensor:
    if ties == "max":
        hits, rank = counts.above_positive + counts.tied_positive, counts.above + counts.tied
    else:
        hits = counts.above_positive + counts.tied_positive_before + 1
        rank = counts.above + counts.tied_before + 1
    return torch.where(counts.positive, hits.double() / rank.clamp(min=1).double(), 0.0)
