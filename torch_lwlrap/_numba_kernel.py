"""Compiled CPU path of the ranking engine: label precisions counted in one pass over each row, with numba.

This is the ``"numba"`` path of :func:`torch_lwlrap._ranking.ranking_sums`; ``"auto"`` takes it for CPU tensors
when numba is importable (``pip install numba``, the ``cpu`` extra). It computes the same integer counts as the torch
paths, row by row, with no ``(N, C)`` temporary:

* Rows are split into blocks of :data:`BLOCK_ROWS`; numba's ``prange`` spreads the blocks over the threads.
* For each row, the positive labels are found by scanning its target bytes four 8-byte words at a time, and the
  non-zero bytes of a word by its trailing zero bits. A row without a positive costs one read of its target bytes.
* A row with few positives is *counted*: for each positive ``j`` with score ``s``, one vectorized pass over the row
  counts ``rank = #{k known : s_k >= s}`` (for ``ties="index"``: ``s_k > s``, or ``s_k == s`` and ``k <= j``), and
  ``hits``, the same count over positives, compares ``s`` with the row's ``K`` positive scores only. ``O(K C)`` for
  ``K`` positives, and the row is in L1 cache.
* A row with very many positives (more than :data:`SORT_POSITIVES_PER_LOG2` ``* log2(C)``) is *sorted*: its known
  scores and its positives' scores are sorted once, and each positive's counts are two binary searches
  (``O(C log C)``). Under ``ties="index"`` the sorts are stable, and a positive's place among its equals comes
  with them.
  Counting is so cheap (vectorized compares, a few hundredths of a nanosecond per score) that sorting only wins on
  dense rows of wide label spaces: more than about 2,100 positives out of 10,000 (``benchmarks/crossover.py``).
* The per-positive counts that the other tie rules and the ranking statistics reduce over come from a second pass,
  :func:`torch_lwlrap._numba_counts.label_counts_numba`.
* The precision ``hits / rank`` is one float64 division of two integers, as on every path. Per-sample sums are
  stored by the thread that owns the row; per-class sums are added per block to a ``(blocks, C)`` float64
  workspace, then summed block after block by a serial compiled loop (:func:`add_block_sums`): the result does not
  depend on the number of threads.

This module holds the row helpers and the chunked passes. A 2-D contiguous batch is checked and ranked by the one
pass of :mod:`torch_lwlrap._numba_one_pass`, with the same helpers; other batches (extra dimensions, strided or
float16 inputs, a forced chunk size) have their integer and float targets checked for values other than 0, 1 and
``ignore_index`` and turned into the masks of positive and known labels by two small compiled passes
(:func:`target_is_bad`, :func:`target_masks`) before :func:`ranking_sums_numba` ranks them.

Scores are compared in their own precision: float16 and bfloat16 rows are widened to float32 (exact, so order and
ties are kept) a chunk at a time, float32 and float64 are read in place. The first call compiles the kernel (a few
seconds; cached on disk by numba afterwards).

Threads, processes and forks: every parallel kernel here runs through the one runner,
:func:`torch_lwlrap._numba_runtime.run` (fork, thread and thread-count guards; see that module).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap._kernel_contract import SCORE_DTYPES, check_kernel_args
from torch_lwlrap import _engine_config, _numba_runtime
from torch_lwlrap._numba_runtime import numba, parallel_and_serial, prange, run, serial_kernel

#: Rows per block: the unit of work of one thread, and of one row of the class-sum workspace.
BLOCK_ROWS = 128

#: A row is sorted rather than counted when it has more than this many positives per ``log2(C)``: the crossover
#: measured on the CPU with ``benchmarks/crossover.py``.
SORT_POSITIVES_PER_LOG2 = 160

def unavailable_reason(device, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the compiled path cannot rank scores on ``device`` (of ``dtype``, when given); None: it can.

    Example:
        >>> import torch
        >>> unavailable_reason("cpu", torch.int32) or ""
        'the numba kernels rank float16, bfloat16, float32 and float64 scores, not int32 ones'
    """
    reason = _numba_runtime.unavailable_reason(device)
    if reason is None and dtype is not None and dtype not in SCORE_DTYPES:
        names = [str(d).replace("torch.", "") for d in SCORE_DTYPES]
        return (
            f"the numba kernels rank {', '.join(names[:-1])} and {names[-1]} scores, not "
            f"{str(dtype).replace('torch.', '')} ones"
        )
    return reason


def is_available(device, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the compiled path can rank scores on ``device`` (and of ``dtype``, when given).

    Example:
        >>> import torch
        >>> is_available("cuda")
        False
        >>> is_available("cpu", torch.int32)
        False
    """
    return unavailable_reason(device, dtype) is None


def sort_min_positives(num_classes: int) -> int:
    """The number of positives above which a row of ``num_classes`` scores is sorted instead of counted.

    Example:
        >>> sort_min_positives(527), sort_min_positives(10_000)
        (1446, 2126)
    """
    return int(SORT_POSITIVES_PER_LOG2 * math.log2(max(num_classes, 2)))


#: Target dtypes whose value check and masks :func:`target_is_bad` and :func:`target_masks` compute (a bool target
#: needs neither; numba cannot read float16 or bfloat16, which torch handles).
TARGET_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float32, torch.float64)


def handles_target(target: Tensor) -> bool:
    """Whether :func:`target_is_bad` and :func:`target_masks` take this target: a 2-D CPU tensor of
    :data:`TARGET_DTYPES`, when numba is installed."""
    return numba is not None and target.device.type == "cpu" and target.ndim == 2 and target.dtype in TARGET_DTYPES


def _target_array(target: Tensor, ignore_index: Optional[int]):
    """The target as a numpy array (any strides, no copy) and ``ignore_index`` in its dtype (0 for None)."""
    array = target.numpy()
    return array, array.dtype.type(0 if ignore_index is None else ignore_index)


def target_is_bad(target: Tensor, ignore_index: Optional[int]) -> bool:
    """Whether ``target`` holds a value other than 0, 1 and ``ignore_index`` (NaN included), in one parallel pass.

    ``ignore_index`` must be None or a value ``target``'s dtype holds.

    Example:
        >>> import torch
        >>> target_is_bad(torch.tensor([[0.0, 1.0], [1.0, -1.0]]), ignore_index=-1)
        False
        >>> target_is_bad(torch.tensor([[0.0, 1.0], [1.0, -1.0]]), ignore_index=None)
        True
    """
    array, ignore = _target_array(target, ignore_index)
    return bool(run(_count_bad_rows, array.size, array, ignore, ignore_index is not None))


def target_masks(target: Tensor, ignore_index: Optional[int]):
    """``(positive, known)``: the bool masks ``target == 1`` and ``target != ignore_index`` (None without
    ``ignore_index``), in one parallel pass over a checked target.

    Example:
        >>> import torch
        >>> positive, known = target_masks(torch.tensor([[0, 1], [1, -1]]), ignore_index=-1)
        >>> positive.tolist(), known.tolist()
        ([[False, True], [True, False]], [[True, True], [True, False]])
    """
    array, ignore = _target_array(target, ignore_index)
    positive = torch.empty(target.shape, dtype=torch.bool, device="cpu")
    has_known = ignore_index is not None
    known = torch.empty(target.shape if has_known else (1, 1), dtype=torch.bool, device="cpu")
    run(_fill_masks, array.size, array, ignore, has_known, positive.numpy(), known.numpy())
    return positive, (known if has_known else None)


def ranking_sums_numba(
    preds: Tensor,
    positive: Tensor,
    known: Optional[Tensor],
    class_precision_sum: Tensor,
    class_label_count: Tensor,
    sample_precision_sum: Tensor,
    sample_label_count: Tensor,
    sample_known_count: Tensor,
    *,
    ties: str = "max",
    block_rows: int = BLOCK_ROWS,
    sort_above: Optional[int] = None,
    chunk_elements: Optional[int] = None,
    check_nan: bool = False,
) -> bool:
    """Add a batch's per-class sums to the ``class_*`` tensors and store its per-sample sums in the ``sample_*`` ones.

    The label counts come from the same pass over the targets as the precisions.

    Args:
        preds: ``(N, C)`` floating scores (float16, bfloat16, float32 or float64) on the CPU, any strides.
        positive: ``(N, C)`` bool positive labels; a label that is not ``known`` is not positive.
        known: ``(N, C)`` bool or None; labels that are False are removed from their row's ranking.
        class_precision_sum: ``(C,)`` float64, added to: the precisions of each class's positives.
        class_label_count: ``(C,)`` int64, added to: the positives of each class.
        sample_precision_sum: ``(N,)`` float64, overwritten: the precisions of each sample's positives.
        sample_label_count: ``(N,)`` int64, overwritten: the positives of each sample.
        sample_known_count: ``(N,)`` int64, overwritten: the labels of each sample that are known.
        ties: ``"max"`` or ``"index"``.
        block_rows: rows per block of work; tuning and tests only.
        sort_above: rows with more positives than this are sorted, the others counted (default:
            :func:`sort_min_positives`); tuning and tests only (0 sorts every row, ``C`` counts every row).
        chunk_elements: scores converted per chunk when the input must be widened or copied; tests only.
        check_nan: also look for NaN scores, in the same pass over the rows (then every row is read).

    Returns:
        True when ``check_nan`` is set and a score is NaN (the sums are then meaningless), else False.

    Example:
        The engine's ``"numba"`` path calls this function where numba is installed, and ranks with the torch
        ``"sort"`` path elsewhere; the sums are the same:

        >>> import torch
        >>> from torch_lwlrap._ranking import ranking_sums, use_engine
        >>> scores = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]])
        >>> positive = torch.tensor([[True, False, True], [False, True, True]])
        >>> with use_engine("numba"):
        ...     sums = ranking_sums(scores, positive)
        >>> sums.class_precision_sum.tolist()  # column 0: 2/3 in row 0; column 1: 1/1 in row 1; column 2: 1/2 + 2/2
        [0.6666666666666666, 1.0, 1.5]
        >>> sums.sample_precision_sum.tolist()  # row 0: 2/3 + 1/2; row 1: 1/1 + 2/2
        [1.1666666666666665, 2.0]
    """
    if numba is None:
        raise RuntimeError("The numba engine needs numba: `pip install numba` (the package's `cpu` extra).")
    sums = (class_precision_sum, class_label_count, sample_precision_sum, sample_label_count, sample_known_count)
    check_kernel_args("numba", preds, positive, known, sums, ties, cpu_only=True)
    if block_rows < 1:
        raise ValueError(f"Argument `block_rows` must be positive, but got {block_rows!r}.")
    num_samples, num_classes = preds.shape
    if num_samples == 0 or num_classes == 0:
        return False
    sort_above = sort_min_positives(num_classes) if sort_above is None else sort_above

    native = preds.dtype in (torch.float32, torch.float64)
    in_place = native and known is None and preds.is_contiguous() and positive.is_contiguous()
    if not in_place:
        chunk_elements = chunk_elements or _engine_config.chunk_elements("NUMBA_CONVERSION_CHUNK_ELEMENTS")
    rows_per_chunk = num_samples if in_place else max(1, chunk_elements // num_classes)
    dummy_known = np.ones((1, 1), dtype=np.uint8)
    nan_found = False
    for start in range(0, num_samples, rows_per_chunk):
        stop = min(start + rows_per_chunk, num_samples)
        scores = preds[start:stop]
        scores = (scores if native else scores.to(torch.float32)).contiguous()
        # A positive flag under an unknown label is dropped by the kernel itself: no pass to combine the masks.
        positives = positive[start:stop].contiguous()
        knowns = dummy_known if known is None else known[start:stop].contiguous().numpy().view(np.uint8)
        # The targets as bytes, and the 8-byte words inside them: rows are scanned a word at a time.
        positive_bytes = positives.numpy().view(np.uint8).reshape(-1)
        head, positive_words = aligned_words(positive_bytes)
        blocks = -(-(stop - start) // block_rows)
        class_sums = np.zeros((blocks, num_classes), dtype=np.float64)
        class_counts = np.zeros((blocks, num_classes), dtype=np.int64)
        nan_flags = np.zeros(blocks, dtype=np.uint8)
        run(
            _rank_rows,
            (stop - start) * num_classes,
            scores.numpy(),
            positive_bytes,
            positive_words,
            head,
            knowns,
            known is not None,
            ties == "index",
            block_rows,
            sort_above,
            class_sums,
            class_counts,
            sample_precision_sum[start:stop].numpy(),  # per-sample outputs: written in place
            sample_label_count[start:stop].numpy(),
            sample_known_count[start:stop].numpy(),
            check_nan,
            nan_flags,
        )
        nan_found = nan_found or bool(nan_flags.any())
        add_block_sums(class_sums, class_counts, class_precision_sum.numpy(), class_label_count.numpy())
    return nan_found



def aligned_words(array: np.ndarray):
    """``(head, words)``: the 8-byte words inside a C-contiguous array's buffer, from its first 8-byte aligned byte
    ``head`` on (the compiled passes scan sparse labels a word at a time)."""
    flat = array.reshape(-1).view(np.uint8)
    head = min(-flat.ctypes.data % 8, flat.size)
    return head, flat[head : head + (flat.size - head) // 8 * 8].view(np.uint64)


def add_block_sums(block_sums, block_counts, class_sums, class_counts) -> None:
    """Add the per-block workspaces ``(blocks, C)`` of a pass to the ``(C,)`` arrays ``class_sums`` and
    ``class_counts``: each class's blocks summed in block order, then added (the result does not depend on the
    number of threads). Compiled and serial: a torch reduction right after a parallel region would wait for cores
    that numba's threads still spin on (3 ms instead of 0.01 at 20,000 x 527 on 2 cores)."""
    _add_block_sums(block_sums, block_counts, class_sums, class_counts)


if numba is not None:
    from numba.cpython.unsafe.numbers import trailing_zeros

    @parallel_and_serial
    def _count_bad_rows(target, ignore, has_ignore):
        """Rows of ``target`` with a value other than 0, 1 and (with ``has_ignore``) ``ignore``."""
        bad_rows = 0
        for i in prange(target.shape[0]):
            bad = np.int32(0)
            for k in range(target.shape[1]):
                value = target[i, k]
                allowed = (value == 0) | (value == 1)
                if has_ignore:
                    allowed = allowed | (value == ignore)
                bad = np.int32(bad | np.int32(not allowed))
            bad_rows += bad
        return bad_rows

    @parallel_and_serial
    def _fill_masks(target, ignore, has_known, positive, known):
        """``positive = target == 1`` and, with ``has_known``, ``known = target != ignore``."""
        for i in prange(target.shape[0]):
            for k in range(target.shape[1]):
                value = target[i, k]
                positive[i, k] = value == 1
                if has_known:
                    known[i, k] = value != ignore

    # The helpers a row calls are inlined into the pass (numba's IR inlining): a compiled call passes each array as
    # a struct and counts references to it, about 50 ns per row at 20,000 x 80 (4.3 -> 3.3 ms; 20,000 x 527: 11.5
    # -> 10.4 ms, one thread).
    @serial_kernel(inline="always")
    def _rank_in_row(row, krow, has_known, index_ties, j):
        """``rank`` of the label in column ``j``: one vectorized pass over the row.

        Counts are kept in int32 explicitly at each step: numba widens integer sums to int64, which halves the
        lanes of each vector instruction.
        """
        score = row[j]
        num_classes = row.shape[0]
        rank = np.int32(0)
        # "index": columns up to j count when >= (ties rank first), columns after j only when >.
        split = j + 1 if index_ties else num_classes
        if has_known:
            for k in range(split):
                rank = np.int32(rank + (np.int32(row[k] >= score) & np.int32(krow[k])))
            for k in range(split, num_classes):
                rank = np.int32(rank + (np.int32(row[k] > score) & np.int32(krow[k])))
        else:
            for k in range(split):
                rank = np.int32(rank + np.int32(row[k] >= score))
            for k in range(split, num_classes):
                rank = np.int32(rank + np.int32(row[k] > score))
        return rank

    @serial_kernel(inline="always")
    def _hits_among_positives(values, num_positives, index_ties, q):
        """``hits`` of the row's ``q``-th positive: compared with the other positives' scores only.

        ``values`` holds the scores of the row's positives in column order, so "lower column first" among tied
        scores is "lower position first".
        """
        score = values[q]
        hits = np.int32(0)
        if index_ties:
            for r in range(q + 1):
                hits = np.int32(hits + np.int32(values[r] >= score))
            for r in range(q + 1, num_positives):
                hits = np.int32(hits + np.int32(values[r] > score))
        else:
            for r in range(num_positives):
                hits = np.int32(hits + np.int32(values[r] >= score))
        return hits

    @serial_kernel
    def _stable_sorted(values):
        """``values`` sorted, and for each entry (by its place in ``values``) how many equal to it come before it
        there: a stable sort's places within each run of equal values. (The counts pass's ``_sorted_counts`` takes
        the same places from its own stable sort while it walks it in order: taking them from here made that pass
        1.5x slower.)"""
        order = np.argsort(values, kind="mergesort")  # stable: equal values keep their order
        ordered = values[order]
        before = np.empty(values.shape[0], dtype=np.int64)
        start = 0
        for i in range(values.shape[0]):
            if i > 0 and ordered[i] != ordered[i - 1]:
                start = i
            before[order[i]] = i - start
        return ordered, before

    @serial_kernel
    def _sort_row(row, krow, has_known, index_ties, columns, num_positives, acc):
        """Sum of the precisions of a row with many positives, by sorting; adds each to ``acc``.

        Under ``ties="index"`` the sorts are stable, so that a positive's place among the scores equal to its own
        (those in columns before it) comes with the sort: ``O(C log C)`` whatever the ties."""
        num_classes = row.shape[0]
        if has_known:
            num_known = 0
            for k in range(num_classes):
                num_known += krow[k] != 0
            values = np.empty(num_known, dtype=row.dtype)
            # a known column's place among the known, which ties="index" looks up
            known_place = np.empty(num_classes if index_ties else 0, dtype=np.int64)
            at = 0
            for k in range(num_classes):
                if krow[k]:
                    values[at] = row[k]
                    if index_ties:
                        known_place[k] = at
                    at += 1
        else:
            num_known = num_classes
            values = row.copy()
            known_place = np.empty(0, dtype=np.int64)
        positive_values = np.empty(num_positives, dtype=row.dtype)
        for q in range(num_positives):
            positive_values[q] = row[columns[q]]  # in column order
        if index_ties:
            values, tied_before = _stable_sorted(values)
            positive_sorted, positive_tied_before = _stable_sorted(positive_values)
        else:
            values.sort()
            positive_sorted = np.sort(positive_values)
            tied_before = positive_tied_before = np.empty(0, dtype=np.int64)
        total = 0.0
        for q in range(num_positives):
            j = columns[q]
            score = row[j]
            if index_ties:  # the scores above, and those equal in the columns up to j (j itself included)
                place = known_place[j] if has_known else j
                rank = num_known - np.searchsorted(values, score, side="right") + tied_before[place] + 1
                hits = num_positives - np.searchsorted(positive_sorted, score, side="right")
                hits += positive_tied_before[q] + 1
            else:
                rank = num_known - np.searchsorted(values, score, side="left")
                hits = num_positives - np.searchsorted(positive_sorted, score, side="left")
            precision = hits / rank
            acc[j] += precision
            total += precision
        return total

    @serial_kernel(inline="always")
    def _nonzero_columns(flags, words, head, row_start, num_classes, columns):
        """The columns of the non-zero bytes of a row, in order, into ``columns``; returns how many.

        ``flags`` holds the flag bytes of all rows (a bool target or mask: a positive is any byte that is not 0, as
        torch reads a bool) and ``words`` its aligned 8-byte words from byte ``head`` on; the row starts at byte
        ``row_start``. Labels are sparse: the row is read a word at a time (four at once first), and the bytes of
        a word that is not 0 are found by its trailing zero bits. Bytes outside the words (the buffer's first and
        last few) are read one at a time.
        """
        row_stop = row_start + num_classes
        found = 0
        first = min(max(row_start, head), row_stop)  # the row's bytes inside the words: [first, last)
        last = max(first, min(row_stop, head + 8 * words.shape[0]))
        for byte in range(row_start, first):
            if flags[byte]:
                columns[found] = byte - row_start
                found += 1
        word = (first - head) >> 3
        word_stop = (last - head + 7) >> 3
        while word < word_stop:
            if word + 4 <= word_stop and (words[word] | words[word + 1] | words[word + 2] | words[word + 3]) == 0:
                word += 4
                continue
            bits = words[word]
            base = head + 8 * word
            while bits:
                byte = base + (np.int64(trailing_zeros(bits)) >> 3)
                if byte >= first and byte < last:
                    columns[found] = byte - row_start
                    found += 1
                bits &= ~(np.uint64(0xFF) << np.uint64((byte - base) << 3))
            word += 1
        for byte in range(last, row_stop):
            if flags[byte]:
                columns[found] = byte - row_start
                found += 1
        return found

    @serial_kernel(inline="always")
    def _positive_columns(flags, words, head, row_start, num_classes, columns):
        """The columns of a row's positives, in order, into ``columns`` (:func:`_nonzero_columns`)."""
        return _nonzero_columns(flags, words, head, row_start, num_classes, columns)

    @serial_kernel(inline="always")
    def _row_sum(row, krow, has_known, index_ties, columns, num_positives, sort_above, values, acc, counts):
        """The sum of the precisions of a row's positives (the columns ``columns[:num_positives]``), each added to
        ``acc`` at its column and counted in ``counts``: counted, or sorted for a row with many positives.
        ``values`` is a workspace of the row's length."""
        if num_positives == 0:
            return 0.0
        for q in range(num_positives):
            counts[columns[q]] += 1
        if num_positives > sort_above:
            return _sort_row(row, krow, has_known, index_ties, columns, num_positives, acc)
        for q in range(num_positives):
            values[q] = row[columns[q]]
        total = 0.0
        for q in range(num_positives):
            j = columns[q]
            rank = _rank_in_row(row, krow, has_known, index_ties, j)
            hits = _hits_among_positives(values, num_positives, index_ties, q)
            precision = hits / rank
            acc[j] += precision
            total += precision
        return total

    @parallel_and_serial
    def _rank_rows(
        scores,
        positive_bytes,
        positive_words,
        head,
        known,
        has_known,
        index_ties,
        block_rows,
        sort_above,
        class_sums,
        class_counts,
        sample_sums,
        sample_label_counts,
        sample_known_counts,
        check_nan,
        nan_flags,
    ):
        num_samples, num_classes = scores.shape
        num_blocks = class_sums.shape[0]
        for block in prange(num_blocks):
            acc = class_sums[block]
            counts = class_counts[block]
            columns = np.empty(num_classes, dtype=np.int64)
            values = np.empty(num_classes, dtype=scores.dtype)
            for i in range(block * block_rows, min(num_samples, (block + 1) * block_rows)):
                row = scores[i]
                if check_nan:  # the first read of the row: the passes below find it in the cache
                    nan = np.int32(0)
                    for k in range(num_classes):
                        nan = np.int32(nan | np.int32(row[k] != row[k]))
                    if nan:
                        nan_flags[block] = 1
                row_start = i * num_classes
                krow = known[i] if has_known else known[0]
                num_positives = _positive_columns(
                    positive_bytes, positive_words, head, row_start, num_classes, columns
                )
                num_known = np.int32(num_classes)
                if has_known:
                    num_known = np.int32(0)
                    for k in range(num_classes):
                        num_known = np.int32(num_known + np.int32(krow[k]))
                    kept = 0  # a positive flag under an unknown label does not count
                    for q in range(num_positives):
                        if krow[columns[q]]:
                            columns[kept] = columns[q]
                            kept += 1
                    num_positives = kept
                sample_label_counts[i] = num_positives
                sample_known_counts[i] = num_known
                sample_sums[i] = _row_sum(
                    row, krow, has_known, index_ties, columns, num_positives, sort_above, values, acc, counts
                )

    @serial_kernel
    def _add_block_sums(block_sums, block_counts, class_sums, class_counts):
        num_blocks, num_classes = block_sums.shape
        for c in range(num_classes):
            total = 0.0
            count = 0
            for b in range(num_blocks):
                total += block_sums[b, c]
                count += block_counts[b, c]
            class_sums[c] += total
            class_counts[c] += count
