"""The per-positive counts pass of the numba path: for each positive label, the counts every tie rule and ranking
statistic is a function of (:class:`~torch_lwlrap._tie_rules.LabelCounts`).

:func:`label_counts_numba` is the CPU side of :func:`torch_lwlrap._ranking.label_counts_chunks` and of the reductions
over counts (``ties="expected"``, the tie report, the ranking metrics, the bootstrap). It works like the ranking pass
of :mod:`torch_lwlrap._numba_kernel`, whose helpers it shares (blocks of rows over numba's threads, positives found a
word at a time, rows with very many positives sorted), but writes counts out instead of summing precisions:

* for each positive, two vectorized passes over its row count the known labels above it and equal to it, and the
  same over the row's positives; the labels tied at a lower column are counted only for a positive that ties
  another label (a pass that stops at the positive's column vectorizes poorly);
* the counts of a block of rows are written compact, one entry per positive in row-major order, at offsets counted
  first; blocks hold at most ``max_positives`` positives, so memory is bounded whatever the batch size;
* with ``defer_untied``, a positive that ties no other label is not written out: every tie rule gives it the same
  precision, ``(A_p + 1) / (A + 1)``, which the pass sums in place per class and per row (:class:`UntiedSums`). On
  real scores most positives tie nothing, so a rule then reduces over a few entries only.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap._engine_config import chunk_elements
from torch_lwlrap._numba_kernel import BLOCK_ROWS, add_block_sums, aligned_words, sort_min_positives
from torch_lwlrap import _numba_kernel
from torch_lwlrap._numba_runtime import numba, parallel_and_serial, prange, run, serial_kernel
from torch_lwlrap._types import LabelCounts

if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports
    from torch_lwlrap._numba_kernel import _positive_columns


class UntiedSums(NamedTuple):
    """What :func:`label_counts_numba` with ``defer_untied`` sums in place for a block of rows: every rule gives a
    positive that ties no other label the same precision, ``(A_p + 1) / (A + 1)``."""

    start: int  #: first row of the block, in the input of :func:`label_counts_numba`
    class_precision_sum: Tensor  #: (C,) float64, the untied positives' precisions per class
    class_label_count: Tensor  #: (C,) int64, every positive (untied or not) per class
    sample_precision_sum: Tensor  #: (n,) float64, the untied positives' precisions per row of the block
    sample_label_count: Tensor  #: (n,) int64, every positive per row of the block


class CompactCounts(NamedTuple):
    """The counts of the positives of a block of rows, one entry per positive in row-major order (with
    ``defer_untied``: per positive that ties another label, or of a sorted row)."""

    rows: Tensor  #: (P,) int64, row of each positive in the input of :func:`label_counts_numba`
    cols: Tensor  #: (P,) int64, its column
    counts: LabelCounts  #: over (P,), int32, ``positive`` all True
    nan_found: bool  #: ``check_nan`` found a NaN in the block's rows
    start: int  #: the block's first row in the input of :func:`label_counts_numba`
    stop: int  #: and the row after its last
    untied: Optional[UntiedSums] = None  #: with ``defer_untied``: the sums of the positives left out of ``counts``


def unavailable_reason(device, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the compiled pass cannot count the labels of scores on ``device`` (of ``dtype``, when given; None: it
    can): the numba ranking kernel's reasons, whose conversions and row blocks it shares."""
    return _numba_kernel.unavailable_reason(device, dtype)


def label_counts_numba(
    preds: Tensor,
    positive: Tensor,
    known: Optional[Tensor],
    *,
    block_rows: int = BLOCK_ROWS,
    sort_above: Optional[int] = None,
    check_nan: bool = False,
    max_positives: Optional[int] = None,
    defer_untied: bool = False,
):
    """The counts of every positive of a chunk of rows, compact: ``(known labels per row, blocks)``.

    The counting pass of :func:`torch_lwlrap._ranking.label_counts_chunks` on the CPU: for each positive ``j`` with
    score ``s``, two passes over its row count the known labels scoring above ``s`` and equal to ``s``, and the same
    two over the row's positives; the labels equal at a lower column are counted only for a positive that ties
    another label (a pass that stops at the column vectorizes poorly). Rows with more than ``sort_above`` positives
    are sorted instead, as in :func:`torch_lwlrap._numba_kernel.ranking_sums_numba`.

    With ``defer_untied``, a positive that ties no other label (``g = 1``) is not written out: every tie rule gives
    it the same precision, ``(A_p + 1) / (A + 1)``, which the pass sums in place per class and per row
    (:class:`UntiedSums`; on data without ties, in the order of
    :func:`torch_lwlrap._numba_kernel.ranking_sums_numba`, so that every rule gives its sums to the bit). Only the
    other positives' counts are written out, for a tie rule to reduce
    (:func:`torch_lwlrap._tie_rules.label_precision`); the positives of sorted rows are all written out. The labels
    tied at a lower column (``tied_before``, which only the column-order rule ``"index"`` needs: the ranking kernel
    applies it itself) are then not counted, and written as -1: a pass over the start of the row per tied positive
    would cost more than the whole rest of the work on saturated scores.

    Args:
        preds, positive, known: as for :func:`torch_lwlrap._numba_kernel.ranking_sums_numba`.
        block_rows, sort_above: tuning and tests only, as for :func:`torch_lwlrap._numba_kernel.ranking_sums_numba`.
        check_nan: also look for NaN scores, in the same pass over the rows.
        max_positives: positives counted per block of rows (each takes 40 bytes; default
            :data:`~torch_lwlrap._engine_config.COMPACT_COUNTS_BLOCK_POSITIVES`); tests and tuning only.
        defer_untied: sum the positives that tie no other label in place (see above).

    Returns:
        ``(sample_known_count, blocks)``: the int64 ``(N,)`` known labels of each row, counted first, and an
        iterator of :class:`CompactCounts` over consecutive blocks of rows, each computed as it is reached.
    """
    if numba is None:
        raise RuntimeError("The numba engine needs numba: `pip install numba` (the package's `cpu` extra).")
    if block_rows < 1:
        raise ValueError(f"Argument `block_rows` must be positive, but got {block_rows!r}.")
    num_samples, num_classes = preds.shape
    positives = positive.contiguous()
    knowns = np.ones((1, 1), dtype=np.uint8) if known is None else known.contiguous().numpy().view(np.uint8)
    positive_bytes = positives.numpy().view(np.uint8).reshape(-1)
    per_row = np.zeros(num_samples, dtype=np.int64)
    known_count = torch.empty(num_samples, dtype=torch.int64, device="cpu")
    # One serial pass: a parallel region costs more than summing the bytes when other processes hold the cores.
    _count_positives(positive_bytes, knowns, known is not None, num_classes, per_row, known_count.numpy())
    offsets = np.zeros(num_samples + 1, dtype=np.int64)
    np.cumsum(per_row, out=offsets[1:])
    return known_count, _count_blocks(
        preds, positives, positive_bytes, knowns, known is not None, offsets, block_rows, sort_above, check_nan,
        max_positives, defer_untied,
    )


def _count_blocks(preds, positives, positive_bytes, knowns, has_known, offsets, block_rows, sort_above, check_nan,
                  max_positives, defer_untied):
    num_samples, num_classes = preds.shape
    if max_positives is None:
        max_positives = chunk_elements("COMPACT_COUNTS_BLOCK_POSITIVES")
    sort_above = sort_min_positives(num_classes) if sort_above is None else sort_above
    head, positive_words = aligned_words(positive_bytes)
    native = preds.dtype in (torch.float32, torch.float64)
    rows_per_chunk = max(1, chunk_elements("NUMBA_CONVERSION_CHUNK_ELEMENTS") // max(num_classes, 1))
    start = 0
    while start < num_samples:
        # As many rows as fit max_positives (at least one), and as fit a chunk when the scores must be converted.
        stop = int(np.searchsorted(offsets, offsets[start] + max_positives, side="right")) - 1
        stop = min(max(stop, start + 1), num_samples if native else start + rows_per_chunk, num_samples)
        scores = preds[start:stop]
        scores = (scores if native else scores.to(torch.float32)).contiguous()
        block_offsets = offsets[start : stop + 1] - offsets[start]
        total = int(block_offsets[-1])
        rows = torch.empty(total, dtype=torch.int64, device="cpu")
        cols = torch.empty(total, dtype=torch.int64, device="cpu")
        fields = [torch.empty(total, dtype=torch.int32, device="cpu") for _ in range(6)]
        num_blocks = max(1, -(-(stop - start) // block_rows))
        nan_flags = np.zeros(num_blocks, dtype=np.uint8)
        # Per-block class sums (summed in block order by torch: the result does not depend on the threads) and
        # per-row sums of the untied positives, and how many positives of each row were written out.
        sums_shape = (num_blocks, num_classes if defer_untied else 1)
        class_sums = np.zeros(sums_shape, dtype=np.float64)
        class_counts = np.zeros(sums_shape, dtype=np.int64)
        sample_sums = np.zeros(stop - start if defer_untied else 1, dtype=np.float64)
        written = np.zeros(stop - start if defer_untied else 1, dtype=np.int64)
        if num_classes:
            run(
                _count_rows, (stop - start) * num_classes, scores.numpy(), positive_bytes, positive_words, head,
                knowns, has_known, num_classes, block_rows, sort_above, start, block_offsets, rows.numpy(),
                cols.numpy(), *[f.numpy() for f in fields], defer_untied, class_sums, class_counts, sample_sums,
                written, check_nan, nan_flags,
            )
        untied = None
        if defer_untied:
            total = _compact_written(block_offsets, written, rows.numpy(), cols.numpy(), *[f.numpy() for f in fields])
            rows, cols, fields = rows[:total], cols[:total], [f[:total] for f in fields]
            class_total = torch.zeros(num_classes, dtype=torch.float64, device="cpu")
            count_total = torch.zeros(num_classes, dtype=torch.int64, device="cpu")
            add_block_sums(class_sums, class_counts, class_total.numpy(), count_total.numpy())
            untied = UntiedSums(
                start,
                class_total,
                count_total,
                torch.from_numpy(sample_sums),
                torch.from_numpy(np.diff(block_offsets)),
            )
        yield CompactCounts(rows, cols, LabelCounts(torch.ones(total, dtype=torch.bool, device="cpu"), *fields),
                            bool(nan_flags.any()), start, stop, untied)
        start = stop


if numba is not None:

    @serial_kernel
    def _known_positive_columns(flags, words, head, krow, has_known, row_start, num_classes, columns):
        """The columns of a row's positives that are known, in order, into ``columns``; returns how many."""
        found = _positive_columns(flags, words, head, row_start, num_classes, columns)
        if not has_known:
            return found
        kept = 0
        for q in range(found):
            if krow[columns[q]]:
                columns[kept] = columns[q]
                kept += 1
        return kept

    @serial_kernel
    def _count_positives(flags, known, has_known, num_classes, per_row, known_count):
        """Known positives and known labels of each row: vectorized sums of the 0/1 bytes."""
        for i in range(per_row.shape[0]):
            row = flags[i * num_classes : (i + 1) * num_classes]
            found = np.int32(0)
            num_known = np.int32(num_classes)
            if has_known:
                krow = known[i]
                num_known = np.int32(0)
                for k in range(num_classes):
                    found = np.int32(found + np.int32(row[k] & krow[k]))
                    num_known = np.int32(num_known + np.int32(krow[k]))
            else:
                for k in range(num_classes):
                    found = np.int32(found + np.int32(row[k]))
            per_row[i] = found
            known_count[i] = num_known

    @serial_kernel
    def _above_and_tied(row, krow, has_known, j):
        """``(above, tied)`` of the label in column ``j``: two vectorized passes over the whole row, one count per
        loop (LLVM vectorizes single reductions over whole rows best: splitting a pass at ``j`` costs twice as much).
        """
        score = row[j]
        num_classes = row.shape[0]
        above = np.int32(0)
        tied = np.int32(0)
        if has_known:
            for k in range(num_classes):
                above = np.int32(above + (np.int32(row[k] > score) & np.int32(krow[k])))
            for k in range(num_classes):
                tied = np.int32(tied + (np.int32(row[k] == score) & np.int32(krow[k])))
        else:
            for k in range(num_classes):
                above = np.int32(above + np.int32(row[k] > score))
            for k in range(num_classes):
                tied = np.int32(tied + np.int32(row[k] == score))
        return above, tied

    @serial_kernel
    def _tied_before(row, krow, has_known, j):
        """Labels before column ``j`` with the same score: counted only for a label that ties another."""
        score = row[j]
        before = np.int32(0)
        if has_known:
            for k in range(j):
                before = np.int32(before + (np.int32(row[k] == score) & np.int32(krow[k])))
        else:
            for k in range(j):
                before = np.int32(before + np.int32(row[k] == score))
        return before

    @serial_kernel
    def _sorted_counts(values, count, column_of, at, above, tied, before):
        """Counts of the first ``count`` entries of ``values`` among themselves, by a stable sort (ties keep their
        order, which is column order); entry ``e``'s counts go to index ``column_of[e]`` of the outputs, plus
        ``at``."""
        order = np.argsort(values[:count], kind="mergesort")
        ordered = values[:count][order]
        for position in range(count):
            e = order[position]
            score = ordered[position]
            low = np.searchsorted(ordered, score, side="left")
            high = np.searchsorted(ordered, score, side="right")
            out = at + column_of[e]
            above[out] = count - high
            tied[out] = high - low
            before[out] = position - low

    @serial_kernel
    def _sort_row_counts(row, krow, has_known, columns, num_positives, at, counts_out, slot_of_column):
        """Counts of a row with many positives, by sorting its known scores and its positives' scores once."""
        above, above_positive, tied, tied_positive, before, positive_before = counts_out
        num_classes = row.shape[0]
        # Known labels: their counts land in a row-sized scratch indexed by column, then the positives' are copied.
        values = np.empty(num_classes, dtype=row.dtype)
        column_of = np.empty(num_classes, dtype=np.int64)
        num_known = 0
        for k in range(num_classes):
            if not has_known or krow[k]:
                values[num_known] = row[k]
                column_of[num_known] = k
                num_known += 1
        scratch_above = np.empty(num_classes, dtype=np.int32)
        scratch_tied = np.empty(num_classes, dtype=np.int32)
        scratch_before = np.empty(num_classes, dtype=np.int32)
        _sorted_counts(values, num_known, column_of, 0, scratch_above, scratch_tied, scratch_before)
        for q in range(num_positives):
            j = columns[q]
            above[at + q] = scratch_above[j]
            tied[at + q] = scratch_tied[j]
            before[at + q] = scratch_before[j]
            values[q] = row[j]
            slot_of_column[q] = q
        _sorted_counts(values, num_positives, slot_of_column, at, above_positive, tied_positive, positive_before)

    @parallel_and_serial
    def _count_rows(
        scores,
        flags,
        words,
        head,
        known,
        has_known,
        num_classes,
        block_rows,
        sort_above,
        first_row,
        offsets,
        rows,
        cols,
        above,
        above_positive,
        tied,
        tied_positive,
        before,
        positive_before,
        defer_untied,
        class_sums,
        class_counts,
        sample_sums,
        written,
        check_nan,
        nan_flags,
    ):
        """Counts of the positives of rows ``first_row + i``, written from ``offsets[i]`` on; with ``defer_untied``,
        those that tie no other label summed instead (and ``written[i]`` of the row's positives written)."""
        num_samples = scores.shape[0]
        counts_out = (above, above_positive, tied, tied_positive, before, positive_before)
        for block in prange(-(-num_samples // block_rows)):
            columns = np.empty(num_classes, dtype=np.int64)
            values = np.empty(num_classes, dtype=scores.dtype)
            slots = np.empty(num_classes, dtype=np.int64)
            acc = class_sums[block]
            counted = class_counts[block]
            for i in range(block * block_rows, min(num_samples, (block + 1) * block_rows)):
                row = scores[i]
                if check_nan:
                    nan = np.int32(0)
                    for k in range(num_classes):
                        nan = np.int32(nan | np.int32(row[k] != row[k]))
                    if nan:
                        nan_flags[block] = 1
                krow = known[first_row + i] if has_known else known[0]
                at = offsets[i]
                num_positives = offsets[i + 1] - at
                if num_positives == 0:
                    continue
                row_start = (first_row + i) * num_classes
                _known_positive_columns(flags, words, head, krow, has_known, row_start, num_classes, columns)
                if defer_untied:
                    for q in range(num_positives):
                        counted[columns[q]] += 1
                if num_positives > sort_above:
                    for q in range(num_positives):
                        rows[at + q] = first_row + i
                        cols[at + q] = columns[q]
                    _sort_row_counts(row, krow, has_known, columns, num_positives, at, counts_out, slots)
                    if defer_untied:
                        written[i] = num_positives
                        before[at : at + num_positives] = -1  # not counted with defer_untied (see below)
                    continue
                for q in range(num_positives):
                    values[q] = row[columns[q]]
                positive_values = values[:num_positives]
                total = 0.0
                out = at
                for q in range(num_positives):
                    j = columns[q]
                    a, t = _above_and_tied(row, krow, has_known, j)
                    a_p, t_p = _above_and_tied(positive_values, krow, False, q)
                    if defer_untied and t == 1:
                        precision = (a_p + 1) / (a + 1)
                        acc[j] += precision
                        total += precision
                        continue
                    rows[out] = first_row + i
                    cols[out] = j
                    above[out] = a
                    above_positive[out] = a_p
                    tied[out] = t
                    tied_positive[out] = t_p
                    if defer_untied:  # no rule reduced over deferred counts needs it: the column-order rule
                        before[out] = -1  # ("index") is the fused kernel's (:func:`ranking_sums_numba`)
                    else:
                        before[out] = _tied_before(row, krow, has_known, j) if t > 1 else 0
                    positive_before[out] = _tied_before(positive_values, krow, False, q) if t_p > 1 else 0
                    out += 1
                if defer_untied:
                    sample_sums[i] = total
                    written[i] = out - at

    @serial_kernel
    def _compact_written(offsets, written, rows, cols, above, above_positive, tied, tied_positive, before,
                         positive_before):
        """Move the ``written[i]`` entries of each row ``i`` (from ``offsets[i]`` on) of the outputs of
        :func:`_count_rows` to the front; returns how many. Entries only move down, so the moves are done in place.
        """
        total = 0
        for i in range(written.shape[0]):
            count = written[i]
            at = offsets[i]
            if count and at != total:
                for e in range(count):
                    rows[total + e] = rows[at + e]
                    cols[total + e] = cols[at + e]
                    above[total + e] = above[at + e]
                    above_positive[total + e] = above_positive[at + e]
                    tied[total + e] = tied[at + e]
                    tied_positive[total + e] = tied_positive[at + e]
                    before[total + e] = before[at + e]
                    positive_before[total + e] = positive_before[at + e]
            total += count
        return total
