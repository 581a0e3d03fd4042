"""Compiled CPU kernels of the rank-agreement metrics (rank correlations, Kendall distance at k), with numba.

One pass per row, rows spread over numba's threads in blocks, each block with its own workspace; every kernel runs
through the one runner (:func:`torch_lwlrap._numba_runtime.run`).

* NaN: with ``check_nan`` each kernel tests every score of both rows for NaN on its bits (an integer test, so that
  the fastmath parts cannot drop it), marks a row that holds one with a NaN value and skips the rest of its work.
  The caller then raises the input gate's error (:func:`torch_lwlrap._checks.pair_nan_error`), and the gate need
  not read the scores first.
* A row is ranked by a stable least-significant-digit radix sort of its scores' bits, made order-preserving
  (``-0.0`` read as ``0.0``): four passes of 8 bits for float32 (float16 and bfloat16 rows are widened to
  float32, exactly), eight for float64, a pass skipped when all of the row's keys share its digit. Tied scores keep
  their column order. No comparison sort and no index array: about ten times faster than ``torch.argsort`` here.
* Spearman's rho: the average ranks of both rows, centered on ``(C + 1) / 2`` (half-integers: their sums of
  products are exact in float64), and ``sxy / sqrt(sxx syy)``.
* Kendall's tau-b: the counts of scipy's ``kendalltau``. Pairs tied in ``y`` come from ``y``'s sorted groups; the
  row is then read in the order of ``x``, a group of equal ``x`` at a time, and a Fenwick tree over the dense ranks
  of ``y`` counts, for each label, the labels before its group with a larger ``y`` (discordant pairs, ``O(C log C)``);
  pairs tied in both are counted within each group of ``x`` with a table indexed by the dense rank of ``y``.
* Kendall distance at k: each row's top ``k`` come from one scan (``k`` up to :data:`SCAN_MAX_K`; a larger ``k``
  sorts the row): the maxima of chunks of :data:`SCAN_CHUNK` entries bound the k-th highest score from below, and
  only the few entries above that bound enter a sorted buffer, the union of the two top sets is marked, and its pairs are
  compared directly when the union is small (:data:`PAIRS_MAX`), else counted as for tau.

Both variants of a parallel kernel write per-row values only; torch sums them in row order, so results do not depend
on the thread count.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap._kernel_contract import SCORE_DTYPES
from torch_lwlrap import _numba_runtime
from torch_lwlrap._numba_runtime import numba, parallel_and_serial, prange, run, serial_kernel

__all__ = ["unavailable_reason", "correlation_rows", "distance_rows"]

#: Rows per block: the unit of work of one thread, which allocates its workspace once.
BLOCK_ROWS = 64

#: Bits per radix digit (256 buckets): float32 keys take 4 passes, float64 keys 8 (the histograms are unrolled for
#: this width).
DIGIT_BITS = 8

#: Rows of up to this many entries are sorted by insertion instead.
INSERTION_MAX = 24

#: Largest k whose top set is found by a scan (and at most half the row's chunks); a larger k sorts the row.
SCAN_MAX_K = 48

#: Entries per chunk of a scan: each chunk's maximum bounds the k-th highest entry from below.
SCAN_CHUNK = 16

#: Largest union compared pair by pair; a larger one is counted through sorts and a Fenwick tree.
PAIRS_MAX = 48


def unavailable_reason(device, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why these kernels cannot serve scores of ``dtype`` on ``device`` (None: they can)."""
    reason = _numba_runtime.unavailable_reason(device)
    if reason is None and dtype is not None and dtype not in SCORE_DTYPES:
        return f"the numba kernels take floating scores, not {str(dtype).replace('torch.', '')} ones"
    return reason


def _bits(rows: Tensor) -> Tuple[np.ndarray, np.ndarray, int]:
    """``(values, bits, nbits)``: C-contiguous numpy rows (float32 or float64) and their unsigned-integer view."""
    if rows.dtype in (torch.float16, torch.bfloat16):
        rows = rows.to(torch.float32)
    values = rows.contiguous().numpy()
    if values.dtype == np.float32:
        return values, values.view(np.uint32), 32
    return values, values.view(np.uint64), 64


def _common(a: Tensor, b: Tensor) -> Tuple[Tensor, Tensor]:
    if a.dtype != b.dtype:
        common = torch.promote_types(a.dtype, b.dtype)
        a, b = a.to(common), b.to(common)
    return a, b


def correlation_rows(a: Tensor, b: Tensor, method: str, check_nan: bool = False) -> Tuple[Tensor, Tensor, bool]:
    """``(value, defined, nan_found)``: per pair of CPU rows as :func:`torch_lwlrap._ltr_torch.correlation_rows`,
    and with ``check_nan`` whether a score of either is NaN (then the values are not to be used)."""
    a, b = _common(a, b)
    n, num_classes = a.shape
    value = torch.zeros(n, dtype=torch.float64)
    defined = torch.zeros(n, dtype=torch.bool)
    if not n:
        return value, defined, False
    _, bits_a, nbits = _bits(a)
    _, bits_b, _ = _bits(b)
    out = value.numpy()
    run(_correlation_kernel, n * num_classes, bits_a, bits_b, nbits, method == "kendall", check_nan, out,
        defined.numpy())
    return value, defined, bool(check_nan and np.isnan(out).any())


def distance_rows(a: Tensor, b: Tensor, k: int, check_nan: bool = False) -> Tuple[Tensor, bool]:
    """``(distance, nan_found)``: float64 ``(n,)``, the Kendall distance at ``k`` of each pair of CPU rows, as
    :func:`torch_lwlrap._ltr_torch.distance_rows`, and with ``check_nan`` whether a score of either is NaN (then the
    distances are not to be used)."""
    a, b = _common(a, b)
    n, num_classes = a.shape
    out = torch.zeros(n, dtype=torch.float64)
    if not n:
        return out, False
    values_a, bits_a, nbits = _bits(a)
    values_b, bits_b, _ = _bits(b)
    rows = out.numpy()
    run(_distance_kernel, n * num_classes, values_a, values_b, bits_a, bits_b, nbits, min(k, num_classes), check_nan,
        rows)
    return out, bool(check_nan and np.isnan(rows).any())


if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports

    _DIGIT_MASK = np.uint64((1 << DIGIT_BITS) - 1)

    @serial_kernel
    def _key(bits, nbits):
        """The order-preserving unsigned key of a float's bits (``-0.0`` as ``0.0``)."""
        sign = np.uint64(1) << np.uint64(nbits - 1)
        mask = np.uint64(0xFFFFFFFFFFFFFFFF) >> np.uint64(64 - nbits)
        value = np.uint64(bits)
        if value == sign:
            value = np.uint64(0)
        if value & sign:
            return (~value) & mask
        return value | sign

    @serial_kernel
    def _has_nan(bits, start, stop, nbits):
        """Whether a float of ``bits[start:stop]`` is a NaN: its bits without the sign above those of infinity (an
        integer test, which no fastmath flag can drop)."""
        if nbits == 32:
            magnitude, infinity = np.int64(0x7FFFFFFF), np.int64(0x7F800000)
        else:
            magnitude, infinity = np.int64(0x7FFFFFFFFFFFFFFF), np.int64(0x7FF0000000000000)
        found = False
        for j in range(start, stop):
            found |= (np.int64(bits[j]) & magnitude) > infinity
        return found

    @serial_kernel
    def _sort(keys, cols, n, nbits, tmp_keys, tmp_cols, count):
        """Sort ``keys[:n]`` ascending, stably, moving ``cols[:n]`` along. ``count``: ``8 * 256`` int64."""
        if n <= INSERTION_MAX:
            for i in range(1, n):
                key, col = keys[i], cols[i]
                j = i - 1
                while j >= 0 and keys[j] > key:
                    keys[j + 1] = keys[j]
                    cols[j + 1] = cols[j]
                    j -= 1
                keys[j + 1] = key
                cols[j + 1] = col
            return
        passes = nbits // DIGIT_BITS
        radix = 1 << DIGIT_BITS
        count[: passes * radix] = 0
        for j in range(n):  # every pass's histogram in one read, unrolled
            key = np.uint64(keys[j])
            count[np.int64(key & _DIGIT_MASK)] += 1
            count[256 + np.int64((key >> np.uint64(8)) & _DIGIT_MASK)] += 1
            count[512 + np.int64((key >> np.uint64(16)) & _DIGIT_MASK)] += 1
            count[768 + np.int64((key >> np.uint64(24)) & _DIGIT_MASK)] += 1
            if passes == 8:
                count[1024 + np.int64((key >> np.uint64(32)) & _DIGIT_MASK)] += 1
                count[1280 + np.int64((key >> np.uint64(40)) & _DIGIT_MASK)] += 1
                count[1536 + np.int64((key >> np.uint64(48)) & _DIGIT_MASK)] += 1
                count[1792 + np.int64(key >> np.uint64(56))] += 1
        src_keys, src_cols, dst_keys, dst_cols = keys, cols, tmp_keys, tmp_cols
        moved = False
        for p in range(passes):
            s = np.uint64(DIGIT_BITS * p)
            base = p * radix
            if count[base + np.int64((keys[0] >> s) & _DIGIT_MASK)] == n:  # one digit for all: nothing to move
                continue
            total = 0
            for d in range(base, base + radix):
                c = count[d]
                count[d] = total
                total += c
            for j in range(n):
                key = src_keys[j]
                d = base + np.int64((key >> s) & _DIGIT_MASK)
                at = count[d]
                dst_keys[at] = key
                dst_cols[at] = src_cols[j]
                count[d] = at + 1
            src_keys, dst_keys = dst_keys, src_keys
            src_cols, dst_cols = dst_cols, src_cols
            moved = not moved
        if moved:
            keys[:n] = src_keys[:n]
            cols[:n] = src_cols[:n]

    @serial_kernel
    def _centered_ranks(keys, cols, n, ranks):
        """``ranks[col]``: the average rank of each sorted entry minus ``(n + 1) / 2``."""
        center = (n + 1) / 2
        start = 0
        while start < n:
            end = start + 1
            while end < n and keys[end] == keys[start]:
                end += 1
            value = (start + 1 + end) / 2 - center
            for p in range(start, end):
                ranks[cols[p]] = value
            start = end

    @serial_kernel
    def _kendall_counts(keys_a, keys_b, n, nbits, work):
        """``(dis, xtie, ytie, ntie)`` of the keys ``[:n]`` of two rows (see the module's docstring)."""
        keys, cols, tmp_keys, tmp_cols, count, dense, tree, seen = work
        # y: dense ranks (from 1) and tied pairs.
        for j in range(n):
            keys[j] = keys_b[j]
            cols[j] = j
        _sort(keys, cols, n, nbits, tmp_keys, tmp_cols, count)
        ytie = 0
        rank = 0
        start = 0
        for p in range(n):
            if p == 0 or keys[p] != keys[p - 1]:
                rank += 1
                start = p
            ytie += p - start
            dense[cols[p]] = rank
        tree[: rank + 1] = 0
        # x: read in order, a group of equal keys at a time.
        for j in range(n):
            keys[j] = keys_a[j]
            cols[j] = j
        _sort(keys, cols, n, nbits, tmp_keys, tmp_cols, count)
        dis = 0
        xtie = 0
        ntie = 0
        start = 0
        while start < n:
            end = start + 1
            while end < n and keys[end] == keys[start]:
                end += 1
            size = end - start
            xtie += size * (size - 1) // 2
            for p in range(start, end):
                at_or_below = 0
                i = dense[cols[p]]
                while i > 0:
                    at_or_below += tree[i]
                    i &= i - 1
                dis += start - at_or_below
            if size > 1:
                for p in range(start, end):
                    d = dense[cols[p]]
                    ntie += seen[d]
                    seen[d] += 1
                for p in range(start, end):
                    seen[dense[cols[p]]] = 0
            for p in range(start, end):
                i = dense[cols[p]]
                while i <= rank:
                    tree[i] += 1
                    i += i & (-i)
            start = end
        return dis, xtie, ytie, ntie

    @serial_kernel
    def _workspace(num_classes):
        return (
            np.empty(num_classes, np.uint64),
            np.empty(num_classes, np.int64),
            np.empty(num_classes, np.uint64),
            np.empty(num_classes, np.int64),
            np.empty((64 // DIGIT_BITS) << DIGIT_BITS, np.int64),
            np.empty(num_classes, np.int64),
            np.zeros(num_classes + 1, np.int64),
            np.zeros(num_classes + 1, np.int64),
        )

    @parallel_and_serial
    def _correlation_kernel(bits_a, bits_b, nbits, kendall, check_nan, value, defined):
        num_rows, num_classes = bits_a.shape
        num_blocks = (num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        total = num_classes * (num_classes - 1) // 2
        for block in prange(num_blocks):
            work = _workspace(num_classes)
            keys_a = np.empty(num_classes, np.uint64)
            keys_b = np.empty(num_classes, np.uint64)
            ranks_a = np.empty(num_classes, np.float64)
            ranks_b = np.empty(num_classes, np.float64)
            keys, cols, tmp_keys, tmp_cols, count = work[0], work[1], work[2], work[3], work[4]
            for row in range(block * BLOCK_ROWS, min(num_rows, (block + 1) * BLOCK_ROWS)):
                if check_nan and (_has_nan(bits_a[row], 0, num_classes, nbits)
                                  or _has_nan(bits_b[row], 0, num_classes, nbits)):
                    value[row] = np.nan
                    continue
                for j in range(num_classes):
                    keys_a[j] = _key(bits_a[row, j], nbits)
                    keys_b[j] = _key(bits_b[row, j], nbits)
                if kendall:
                    dis, xtie, ytie, ntie = _kendall_counts(keys_a, keys_b, num_classes, nbits, work)
                    if xtie < total and ytie < total:
                        tau = (total - xtie - ytie + ntie - 2 * dis) / np.sqrt(total - xtie) / np.sqrt(total - ytie)
                        value[row] = min(1.0, max(-1.0, tau))
                        defined[row] = True
                    continue
                for j in range(num_classes):
                    keys[j] = keys_a[j]
                    cols[j] = j
                _sort(keys, cols, num_classes, nbits, tmp_keys, tmp_cols, count)
                _centered_ranks(keys, cols, num_classes, ranks_a)
                for j in range(num_classes):
                    keys[j] = keys_b[j]
                    cols[j] = j
                _sort(keys, cols, num_classes, nbits, tmp_keys, tmp_cols, count)
                _centered_ranks(keys, cols, num_classes, ranks_b)
                sxx = 0.0
                syy = 0.0
                sxy = 0.0
                for j in range(num_classes):
                    sxx += ranks_a[j] * ranks_a[j]
                    syy += ranks_b[j] * ranks_b[j]
                    sxy += ranks_a[j] * ranks_b[j]
                if sxx > 0 and syy > 0:
                    value[row] = min(1.0, max(-1.0, sxy / np.sqrt(sxx * syy)))
                    defined[row] = True

    @serial_kernel(fastmath=True)
    def _chunk_max(values, start):
        # A fixed trip count and fastmath let the reduction be vectorized; the row holds no NaN (checked first, or
        # the caller takes no check: then any value will do).
        best = values[start]
        for i in range(1, SCAN_CHUNK):
            best = max(best, values[start + i])
        return best

    @serial_kernel
    def _pairs_with(pair_a, pair_b, p, n):
        """Twice the distance's numerator over the pairs ``(p, q > p)``: 2 for a pair ordered oppositely, 1 for a
        pair tied in one row only (branch-free, so that the loop is vectorized)."""
        twice = 0
        x, y = pair_a[p], pair_b[p]
        for q in range(p + 1, n):
            da = np.int64(x > pair_a[q]) - np.int64(x < pair_a[q])
            db = np.int64(y > pair_b[q]) - np.int64(y < pair_b[q])
            twice += np.int64(da * db < 0) * 2 + np.int64((da == 0) != (db == 0))
        return twice

    @serial_kernel
    def _add(col, mark, union, n):
        if mark[col]:
            return n
        mark[col] = True
        union[n] = col
        return n + 1

    @serial_kernel
    def _add_top(values, bits, nbits, k, mark, union, n, top_values, top_cols, work):
        """Add the ``k`` highest entries of a row (tied: lower column first) to ``union[:n]`` unless ``mark``ed;
        returns the new size."""
        num_classes = values.shape[0]
        num_chunks = (num_classes + SCAN_CHUNK - 1) // SCAN_CHUNK
        if k <= min(SCAN_MAX_K, num_chunks // 2):
            # The k highest chunk maxima are k entries, so the k-th highest entry is at least the lowest of them:
            # only the entries at or above it, in the chunks that hold one, are candidates. They are kept in a
            # buffer sorted by (value descending, column ascending), read in column order, so that a later column
            # displaces an entry only with a strictly higher value.
            chunk_max = top_values[k:]
            full = num_classes // SCAN_CHUNK
            for c in range(full):
                chunk_max[c] = _chunk_max(values, c * SCAN_CHUNK)
            if full < num_chunks:
                best = values[full * SCAN_CHUNK]
                for i in range(full * SCAN_CHUNK + 1, num_classes):
                    best = max(best, values[i])
                chunk_max[full] = best
            # The k-th highest chunk maximum: a buffer of the k highest (descending) in top_values[:k].
            for c in range(num_chunks):
                m = chunk_max[c]
                if c >= k:
                    if not m > top_values[k - 1]:
                        continue
                    p = k - 2
                else:
                    p = c - 1
                while p >= 0 and top_values[p] < m:
                    top_values[p + 1] = top_values[p]
                    p -= 1
                top_values[p + 1] = m
            floor = top_values[k - 1]
            filled = 0
            for c in range(num_chunks):
                if chunk_max[c] < floor:
                    continue
                for j in range(c * SCAN_CHUNK, min((c + 1) * SCAN_CHUNK, num_classes)):
                    v = values[j]
                    if v < floor:
                        continue
                    if filled == k:
                        if not v > top_values[k - 1]:
                            continue
                        p = k - 2
                    else:
                        p = filled - 1
                        filled += 1
                    while p >= 0 and top_values[p] < v:
                        top_values[p + 1] = top_values[p]
                        top_cols[p + 1] = top_cols[p]
                        p -= 1
                    top_values[p + 1] = v
                    top_cols[p + 1] = j
            for i in range(k):
                n = _add(top_cols[i], mark, union, n)
            return n
        keys, cols, tmp_keys, tmp_cols, count = work[0], work[1], work[2], work[3], work[4]
        for j in range(num_classes):
            keys[j] = _key(bits[j], nbits)
            cols[j] = j
        _sort(keys, cols, num_classes, nbits, tmp_keys, tmp_cols, count)
        # Ascending: the top k are the entries from position C - k on, except that the group of equal keys across
        # that position contributes its lowest columns (its first entries).
        cut = num_classes - k
        start = cut
        while start > 0 and keys[start - 1] == keys[cut]:
            start -= 1
        end = cut
        while end < num_classes and keys[end] == keys[cut]:
            end += 1
        for p in range(end, num_classes):
            n = _add(cols[p], mark, union, n)
        for p in range(start, start + (end - cut)):
            n = _add(cols[p], mark, union, n)
        return n

    @parallel_and_serial
    def _distance_kernel(values_a, values_b, bits_a, bits_b, nbits, k, check_nan, out):
        num_rows, num_classes = values_a.shape
        num_blocks = (num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        for block in prange(num_blocks):
            work = _workspace(num_classes)
            mark = np.zeros(num_classes, np.bool_)
            union = np.empty(num_classes, np.int64)
            top_values = np.empty(num_classes + 1, values_a.dtype)  # the buffer, then the chunk maxima
            top_cols = np.empty(num_classes, np.int64)
            keys_a = np.empty(num_classes, np.uint64)
            keys_b = np.empty(num_classes, np.uint64)
            pair_a = np.empty(PAIRS_MAX, values_a.dtype)
            pair_b = np.empty(PAIRS_MAX, values_a.dtype)
            for row in range(block * BLOCK_ROWS, min(num_rows, (block + 1) * BLOCK_ROWS)):
                if check_nan and (_has_nan(bits_a[row], 0, num_classes, nbits)
                                  or _has_nan(bits_b[row], 0, num_classes, nbits)):
                    out[row] = np.nan
                    continue
                a, b = values_a[row], values_b[row]
                n = _add_top(a, bits_a[row], nbits, k, mark, union, 0, top_values, top_cols, work)
                n = _add_top(b, bits_b[row], nbits, k, mark, union, n, top_values, top_cols, work)
                for p in range(n):
                    mark[union[p]] = False
                if n < 2:
                    out[row] = 0.0
                    continue
                twice = 0  # twice the distance's numerator: 2 per opposite pair, 1 per pair tied in one row only
                if n <= PAIRS_MAX:
                    for p in range(n):
                        pair_a[p] = a[union[p]]
                        pair_b[p] = b[union[p]]
                    for p in range(n):
                        twice += _pairs_with(pair_a, pair_b, p, n)
                else:
                    for p in range(n):
                        keys_a[p] = _key(bits_a[row, union[p]], nbits)
                        keys_b[p] = _key(bits_b[row, union[p]], nbits)
                    dis, xtie, ytie, ntie = _kendall_counts(keys_a, keys_b, n, nbits, work)
                    twice = 2 * dis + xtie + ytie - 2 * ntie
                out[row] = twice / (n * (n - 1))
