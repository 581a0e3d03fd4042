"""The ranking engine: the one place where ranks and precisions are computed.

For a sample ``i`` and a positive label ``j`` (ignored labels removed from the row):

* ``ties="max"`` (scikit-learn's rule): ``rank_ij = #{k : s_ik >= s_ij}`` and
  ``L_ij = #{k positive : s_ik >= s_ij}``;
* ``ties="index"`` (strict order, tied scores ordered by column, lower column first):
  ``rank_ij = #{k : s_ik > s_ij} + #{k : s_ik == s_ij, k <= j}`` and ``L_ij`` the same count over positives.

The precision of the label is ``L_ij / rank_ij``: two integer counts and one division in float64. Every public
path (functions, metrics, command line) reduces these precisions to per-class and per-sample sums through
:func:`ranking_sums`.

Four interchangeable paths compute the counts; every one gives the same sums up to float64 rounding:

* ``"sort"`` (torch): a batched sort of each row; each positive's counts are looked up in it. ``O(N C log C)``.
* ``"count"`` (torch): sort-free; for each positive, count the row's scores that are >= its score. ``O(P C)`` work
  for ``P`` positives, which wins when labels are sparse.
* ``"numba"`` (:mod:`torch_lwlrap._numba_kernel`, CPU): the counting of ``"count"``, compiled: one pass over the
  row per positive, no temporaries, and the label counts from the same pass.
* ``"triton"`` (:mod:`torch_lwlrap._triton_kernel`, CUDA): the same, as one fused GPU kernel.

``"auto"`` (the default) takes the compiled path for the tensors' device where its library is installed (numba for
the CPU, Triton for CUDA); otherwise it picks ``"sort"`` or ``"count"`` per batch on the CPU from the label density
(see :data:`COUNT_MAX_DENSITY`) and ``"sort"`` elsewhere (its choice needs no host-device sync). The torch paths
process rows in chunks of about :data:`~torch_lwlrap._engine_config.TORCH_PATH_CHUNK_ELEMENTS` scores, so the workspace
is bounded whatever the batch size.

The path is chosen when ranking: by :func:`use_engine` in the calling thread or context, else by the environment
variable ``TORCH_LWLRAP_ENGINE`` (one of :data:`ENGINES`), else ``"auto"``. If launching the Triton kernel raises
(a compile error, too few GPU resources, a Triton or driver mismatch), the batch is ranked again on the torch path,
an :class:`EngineFallbackWarning` says why (once per process), and CUDA batches take the torch path from then on.

Per-positive counts
-------------------
:func:`label_counts_chunks` hands back, for each positive label, the counts every tie rule and ranking statistic is
a function of (:class:`~torch_lwlrap._tie_rules.LabelCounts`: labels scored strictly higher, labels tied with it,
tied labels at a lower column, and the positives among each), as dense ``(n, C)`` tensors a chunk of rows at a time;
:func:`~torch_lwlrap._tie_rules.label_precision` turns them into each positive's precision under a tie rule. On the
CPU a compiled pass counts them (:func:`torch_lwlrap._numba_counts.label_counts_numba`: two passes over the row per
positive, or a sort for rows with very many positives); elsewhere, and without numba, a stable sort of each row
(:func:`dense_label_counts`, no host-device sync). The Triton kernel does not count them: CUDA tensors take the sort.

``"max"`` and ``"index"`` are applied by the kernels themselves (:func:`ranking_sums`). The other rules
(``"expected"``, and the best and worst orders of :func:`tie_sums`) are reductions over the counts: on the numba path
the pass sums in place the precision of every positive that ties no other label, the same under every rule, and hands
over the counts of the others only (most positives tie nothing; rows sorted for their many positives hand over all
of theirs), for :func:`label_precision`.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple, Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap import _dispatch, _numba_counts
from torch_lwlrap._checks import KERNEL_TIES, _ignore_value, chunk_samples, formatted_chunks
from torch_lwlrap._engine_config import (  # noqa: F401 - the engine setting, re-exported where it always was
    ENGINE_VARIABLE,
    ENGINES,
    chunk_elements,
    forced_chunk_elements,
    get_engine,
    use_engine,
)
from torch_lwlrap._dispatch import EngineFallbackWarning  # noqa: F401 - re-exported (the public name)
from torch_lwlrap._tie_rules import LabelCounts, label_precision
from torch_lwlrap._torch_paths import (  # noqa: F401 - the torch paths and their budgets, re-exported
    COUNT_MAX_DENSITY,
    _block_rows,
    _count_path,
    _label_counts,
    _masked_scores,
    _sort_path,
    _true_indices,
    choose_engine,
)
from torch_lwlrap._types import RankingSums, ScoresContainNaN  # noqa: F401 - re-exported

__all__ = ["LabelCounts", "label_counts_chunks", "label_precision", "one_pass_chunks", "ranking_sums", "use_engine"]

def takes_numba_path(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether scores of ``dtype`` on ``device`` are ranked by the numba path.

    Value checks then leave NaN to :func:`ranking_sums` (``check_nan=True``), which finds it in its own pass over
    the scores instead of reading them once more (that costs as much as the ranking itself on the CPU), and the
    target is checked and turned into masks by the path's compiled helpers.
    """
    return _dispatch.ranking_backend(device, dtype) == "numba"


def one_pass_chunks(
    preds: Tensor, target: Tensor, ignore_index: Optional[int], ties: str, validate_args: bool, numba_path: bool
) -> Optional[Iterator[Optional[RankingSums]]]:
    """The sums of a batch a chunk of samples at a time (the chunks of
    :func:`~torch_lwlrap._checks.formatted_chunks`), each ranked in one compiled pass over its rows where the numba
    backend takes the batch (:func:`torch_lwlrap._dispatch.one_pass_kernel`): its target's values, NaN scores,
    positives and ranks together, with no mask of the target made. None where the backend does not take it.

    ``preds`` and ``target`` passed the gate's shape checks (:func:`torch_lwlrap._checks.check_batch_structure`),
    which tells ``numba_path``; with ``validate_args`` the pass checks the target's values and looks for NaN scores
    itself. A chunk where a check failed yields None and ends the chunks: the caller's value checks
    (:func:`torch_lwlrap._checks.check_batch_values`) then raise the error.

    Example:
        >>> import torch
        >>> chunks = one_pass_chunks(torch.tensor([[0.1, 0.7, 0.2]]), torch.tensor([[1, 0, 1]]), None, "max", True,
        ...                          True)
        >>> chunks is None or [s.class_precision_sum.tolist() for s in chunks] == [[2 / 3, 0.0, 0.5]]
        True
    """
    kernel = _dispatch.one_pass_kernel(preds, target, ties, "numba" if numba_path else None)
    if kernel is None:
        return None
    return _one_pass_chunks(kernel, preds, target, _ignore_value(target, ignore_index), ties, validate_args)


def _one_pass_chunks(kernel, preds, target, ignore, ties, validate_args) -> Iterator[Optional[RankingSums]]:
    num_samples = preds.shape[0]
    step = chunk_samples(preds, target, ignore)
    for start in range(0, max(num_samples, 1), step):  # a batch without samples is one empty chunk
        if step < num_samples:  # (a batch in one chunk is passed as it is: slicing costs a training step's update)
            scores, labels = preds[start : start + step], target[start : start + step]
        else:
            scores, labels = preds, target
        status, sums = kernel(scores, labels, ignore, validate_args, ties)
        yield None if sums is None else RankingSums(*sums)
        if sums is None:
            return


def ranking_sums(
    preds: Tensor, positive: Tensor, known: Optional[Tensor] = None, *, ties: str = "max", check_nan: bool = False
) -> RankingSums:
    """Per-class and per-sample sums of label precisions for a batch, and its label counts.

    Args:
        preds: ``(N, C)`` floating scores, ranked as given (ties in the given dtype are real ties).
        positive: ``(N, C)`` bool, the positive labels; a label where ``known`` is False is not positive.
        known: ``(N, C)`` bool or None; labels that are False are removed from their row's ranking.
        ties: ``"max"``, ``"index"`` or ``"expected"`` (:mod:`torch_lwlrap._tie_rules`). The compiled kernels
            apply the first two themselves; ``"expected"`` is :func:`label_precision` over :func:`label_counts`.
        check_nan: raise :class:`ScoresContainNaN` if a score is NaN (in the same pass on the numba path; with one
            more read of the scores, and a host-device sync, elsewhere).
    """
    num_samples, num_classes = preds.shape
    device = preds.device
    engine = get_engine()
    name = _dispatch.ranking_backend(device, preds.dtype, engine)
    if name is None:
        _dispatch.warn_if_unserved(engine, device, preds.dtype)
    if ties not in KERNEL_TIES:
        # A reduction over label counts: counted by the numba pass on the CPU, by a sort elsewhere.
        return _sums_from_counts(preds, positive, known, ties, check_nan)
    if check_nan and name != "numba" and preds.numel() and torch.isnan(torch.aminmax(preds)[0]):
        raise ScoresContainNaN("`preds` contains NaN.")
    if name is not None:
        # A compiled path counts the labels in the same pass as the ranks, and writes every per-sample output.
        kernel = _dispatch.ranking_kernel(name)
        sums = RankingSums.zeros(num_samples, num_classes, device)
        if name == "numba":
            if kernel(preds, positive, known, *sums, ties=ties, check_nan=check_nan):
                raise ScoresContainNaN("`preds` contains NaN.")
            return sums
        if not num_samples:
            return sums
        try:
            kernel(preds, positive, known, *sums, ties=ties)
            return sums
        except Exception as error:  # any failure to compile or launch: rank on the torch path (new sums)
            _dispatch.triton_failed(error, device)
    if known is not None:
        positive = positive & known
    sums = RankingSums.zeros(num_samples, num_classes, device)
    _label_counts(positive, known, sums)
    if num_samples == 0:
        return sums
    if _dispatch.torch_path(engine, device, num_samples, num_classes, sums.class_label_count) == "sort":
        _sort_path(preds, positive, known, ties, sums)
    else:
        _count_path(preds, positive, known, ties, sums)
    return sums


def label_counts_chunks(
    preds: Tensor, target: Tensor, ignore_index: Optional[int] = None
) -> Iterator[Tuple[int, LabelCounts]]:
    """``(first row, counts)`` for each chunk of rows of a checked batch: dense ``(n, C)`` :class:`LabelCounts`.

    ``preds`` and ``target`` are ``(N, C)`` or ``(N, C, ...)`` tensors that passed
    :func:`torch_lwlrap._checks.check_inputs` (extra dimensions become rows, as everywhere: ``first row`` counts
    rows of the flattened ``(N * prod(...), C)`` batch). Each chunk holds about
    :data:`~torch_lwlrap._engine_config.LABEL_COUNTS_CHUNK_ELEMENTS`
    scores (or the chunk size forced by :func:`use_engine`), so the workspace is bounded whatever the batch size.

    Example:
        >>> import torch
        >>> preds = torch.tensor([[0.9, 0.5, 0.5, 0.5, 0.1]])
        >>> target = torch.tensor([[0, 1, 0, 1, 1]])
        >>> [(start, counts)] = list(label_counts_chunks(preds, target))
        >>> counts.above.tolist(), counts.tied.tolist(), counts.tied_positive_before.tolist()
        ([[0, 1, 0, 1, 4]], [[0, 3, 0, 3, 1]], [[0, 0, 0, 1, 0]])
        >>> label_precision(counts, "max").tolist()  # (A_p + p) / (A + g)
        [[0.0, 0.5, 0.0, 0.5, 0.6]]
    """
    budget = chunk_elements("LABEL_COUNTS_CHUNK_ELEMENTS")
    compiled = _dispatch.compiled_cpu_pass("counts", preds.device, preds.dtype)
    first_row = 0
    for scores, positive, known, _ in formatted_chunks(preds, target, ignore_index, None, budget, compiled):
        yield first_row, label_counts(scores, positive, known)
        first_row += scores.shape[0]


def label_counts(preds: Tensor, positive: Tensor, known: Optional[Tensor] = None) -> LabelCounts:
    """Dense ``(n, C)`` :class:`LabelCounts` of one chunk of ranking inputs (as :func:`ranking_sums` takes them)."""
    if known is not None:
        positive = positive & known
    if not _dispatch.compiled_cpu_pass("counts", preds.device, preds.dtype):
        return dense_label_counts(preds, positive, known)
    num_samples, num_classes = preds.shape
    dense = [torch.zeros(num_samples * num_classes, dtype=torch.int32, device="cpu") for _ in LabelCounts._fields[1:]]
    for block in _numba_counts.label_counts_numba(preds, positive, known)[1]:
        cells = block.rows * num_classes + block.cols
        for out, field in zip(dense, block.counts[1:]):
            out.index_copy_(0, cells, field)
    dense = [positive] + [out.view(num_samples, num_classes) for out in dense]
    return LabelCounts(*dense)


def dense_label_counts(preds: Tensor, positive: Tensor, known: Optional[Tensor]) -> LabelCounts:
    """:class:`LabelCounts` from a stable sort of each row, on any device and without host-device sync.

    ``positive`` must already exclude unknown labels. In the descending stable order, a label's tie group runs from
    the first to the last position holding its score, and the labels ahead of it in the group are the tied ones at a
    lower column; unknown labels stay in the order but weigh nothing in the counts.
    """
    num_samples, num_classes = preds.shape
    position = torch.arange(num_classes, device=preds.device)
    sorted_scores, order = torch.sort(preds, dim=1, descending=True, stable=True)
    first_of_group = torch.ones(sorted_scores.shape, dtype=torch.bool, device=preds.device)
    first_of_group[:, 1:] = sorted_scores[:, 1:] != sorted_scores[:, :-1]
    last_of_group = torch.ones_like(first_of_group)
    last_of_group[:, :-1] = first_of_group[:, 1:]
    del sorted_scores
    group_start = torch.where(first_of_group, position, 0).cummax(1).values
    group_end = torch.where(last_of_group, position, num_classes - 1).flip(1).cummin(1).values.flip(1)
    del first_of_group, last_of_group
    positive_sorted = positive.gather(1, order)

    def counts(weight: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        # (above, tied, tied_before) in sorted order, counting the labels where `weight` is 1.
        through = weight.cumsum(1, dtype=torch.int32)
        before = through - weight
        above = before.gather(1, group_start)
        return above, through.gather(1, group_end) - above, before - above

    if known is None:
        label = position.to(torch.int32).expand(num_samples, num_classes)
        above, tied, tied_before = group_start.to(torch.int32), (group_end - group_start + 1).to(torch.int32), None
        tied_before = (label - above).contiguous()
    else:
        above, tied, tied_before = counts(known.gather(1, order).to(torch.int32))
    sorted_counts = (above, *counts(positive_sorted.to(torch.int32)), tied, tied_before)
    # Back to column order, zero where not positive: (above, above_positive, tied_positive, positive_before, ...).
    above, above_positive, tied_positive, positive_before, tied, tied_before = (
        torch.empty_like(value).scatter_(1, order, torch.where(positive_sorted, value, 0)) for value in sorted_counts
    )
    return LabelCounts(positive, above, above_positive, tied, tied_positive, tied_before, positive_before)


class TieSums(NamedTuple):
    """Sums over the positives of a batch for a tie report (:func:`tie_sums`)."""

    label_count: Tensor  #: () int64, positive labels
    tied_label_count: Tensor  #: () int64, positives whose score ties another known label of their row
    precision_sum: Tensor  #: (4,) float64, sums of precisions under :data:`TIE_SUM_RULES`


#: The rules whose precision sums :func:`tie_sums` gives, in order.
TIE_SUM_RULES = ("max", "expected", "best", "worst")


def tie_sums(preds: Tensor, positive: Tensor, known: Optional[Tensor] = None, *, check_nan: bool = False) -> TieSums:
    """The sums of a tie report over a batch of ranking inputs (as :func:`ranking_sums` takes them)."""
    device = preds.device
    label_count = torch.zeros((), dtype=torch.int64, device=device)
    tied_label_count = torch.zeros((), dtype=torch.int64, device=device)
    precision_sum = torch.zeros(len(TIE_SUM_RULES), dtype=torch.float64, device=device)
    for _, _, _, counts, untied in _counts_blocks(preds, positive, known, check_nan)[1]:
        if untied is None:
            label_count += counts.positive.sum()
        else:  # every positive counted; those that tie no other label have the same precision under every rule
            label_count += untied.class_label_count.sum()
            precision_sum += _sum_in_order(untied.class_precision_sum)
        tied_label_count += (counts.tied > 1).sum()
        precision_sum += torch.stack([_sum_in_order(label_precision(counts, rule)) for rule in TIE_SUM_RULES])
    return TieSums(label_count, tied_label_count, precision_sum)


def _sum_in_order(values: Tensor) -> Tensor:
    """The sum of ``values``, the same whatever the number of threads: torch splits a long CPU sum between its
    threads, numpy's pairwise sum does not."""
    if values.device.type != "cpu":
        return values.sum()
    return torch.from_numpy(np.asarray(values.reshape(-1).numpy().sum()))


def _counts_blocks(preds: Tensor, positive: Tensor, known: Optional[Tensor], check_nan: bool):
    """``(known labels per row or None, blocks)``; ``blocks`` iterates ``(start, rows, cols, counts, untied)`` over
    blocks of rows.

    * On the numba path: compact counts of the positives that tie another label, and of every positive of a row
      with so many that it is sorted (``rows`` and ``cols`` of each); in ``untied``
      (:class:`~torch_lwlrap._numba_counts.UntiedSums`) the sums of the others' precisions, which no tie rule
      changes, and the label counts. ``tied_before`` is not counted there (-1): every rule but ``"index"`` (which
      :func:`ranking_sums` leaves to the kernels) can be reduced over these counts.
    * Elsewhere: dense ``(n, C)`` counts of rows ``start:start+n`` from the sort (``rows``, ``cols`` and ``untied``
      None; known labels per row not counted).

    With ``check_nan``, a NaN score raises :class:`ScoresContainNaN` (found in the numba pass; elsewhere with one
    more read of the scores and a host-device sync)."""
    num_samples, num_classes = preds.shape
    device = preds.device
    if _dispatch.compiled_cpu_pass("counts", device, preds.dtype):
        known_count, compact = _numba_counts.label_counts_numba(
            preds, positive, known, check_nan=check_nan, defer_untied=True
        )

        def compact_blocks():
            for block in compact:
                if block.nan_found:
                    raise ScoresContainNaN("`preds` contains NaN.")
                yield 0, block.rows, block.cols, block.counts, block.untied

        return known_count, compact_blocks()
    if check_nan and preds.numel() and torch.isnan(torch.aminmax(preds)[0]):
        raise ScoresContainNaN("`preds` contains NaN.")
    if known is not None:
        positive = positive & known
    rows = _block_rows(num_classes, device)
    rows = max(1, min(rows, chunk_elements("LABEL_COUNTS_CHUNK_ELEMENTS") // max(num_classes, 1)))

    def dense_blocks():
        for start in range(0, num_samples, rows):
            stop = min(start + rows, num_samples)
            block_known = None if known is None else known[start:stop]
            yield start, None, None, dense_label_counts(preds[start:stop], positive[start:stop], block_known), None

    return None, dense_blocks()


def _sums_from_counts(preds: Tensor, positive: Tensor, known: Optional[Tensor], ties: str, check_nan: bool):
    """:class:`RankingSums` as the sums of :func:`label_precision` over the label counts (:func:`_counts_blocks`)."""
    if ties == "index":  # its counts (tied_before) are not counted on the numba path: the kernels apply it
        raise ValueError('ties="index" is applied by the ranking kernels, not reduced over label counts.')
    num_samples, num_classes = preds.shape
    device = preds.device
    known_count, blocks = _counts_blocks(preds, positive, known, check_nan)
    sums = RankingSums.zeros(num_samples, num_classes, device)
    if known_count is not None:  # compact counts: the label counts come with them
        sums.sample_known_count.copy_(known_count)
    else:
        _label_counts(positive if known is None else positive & known, known, sums)
    for start, rows, cols, counts, untied in blocks:
        if rows is not None and not rows.numel():  # no tied positive: the pass summed every precision
            precision = None
        else:
            precision = label_precision(counts, ties)
        if rows is None:
            sums.class_precision_sum.add_(precision.sum(0))
            torch.sum(precision, 1, out=sums.sample_precision_sum[start : start + precision.shape[0]])
            continue
        # The positives that tie no other label, summed by the pass; then the others, added in order (index_add_ on
        # the CPU adds in order: the sums do not depend on the number of threads).
        stop = untied.start + untied.sample_precision_sum.shape[0]
        sums.class_precision_sum.add_(untied.class_precision_sum)
        sums.class_label_count.add_(untied.class_label_count)
        sums.sample_precision_sum[untied.start : stop] = untied.sample_precision_sum
        sums.sample_label_count[untied.start : stop] = untied.sample_label_count
        if precision is not None:
            sums.class_precision_sum.index_add_(0, cols, precision)
            sums.sample_precision_sum.index_add_(0, rows, precision)
    return sums
