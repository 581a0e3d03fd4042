"""Compiled CPU kernels of the rank-agreement metrics (rank correlations, Kendall distance at k), with numba.

One pass per row, rows spread over numba's threads in blocks, each block with its own workspace; every kernel runs
through the one runner (:func:`torch_lwlrap._numba_runtime.run`).

* NaN: with ``check_nan`` each kernel tests every score of both rows for NaN on its bits (an integer test, so that
  the fastmath parts cannot drop it), marks a row that holds one with a NaN value and skips the rest of its work.
  The caller then raises the input gate's error (:func:`torch_lwlrap._checks.pair_nan_error`), and the gate need
  not read the scores first.
* A row is ranked by the sorts of :mod:`torch_lwlrap._ltr_sort`: the words ``key << 32 | payload`` of its
  scores' order-preserving keys, sorted stably.
* Spearman's rho: twice the average ranks, centered on ``(C + 1) / 2`` (integers: exact int64 sums up to
  2M labels): ``2 p + 1 - C`` at sorted position ``p`` without ties, else from each entry's tie group, branch-free (its
  end in a backward pass, its start in the forward one); ``sxy`` read in the order of ``y``; ``sxy / sqrt(sxx syy)``.
* Kendall's tau-b: the counts of scipy's ``kendalltau``. ``y`` is sorted first (its dense ranks and tied pairs);
  ``x`` is then sorted starting from ``y``'s order, so that the stable sort orders the labels by ``(x, y)`` and
  carries ``y``'s dense rank along: pairs tied in ``x`` are never inversions of that sequence, pairs tied in both
  are its runs of equal ranks within a group of equal ``x``, and the discordant pairs are its inversions, counted
  in one read through a 4-ary trie over the ranks' 2-bit digits, whose nodes are words of four 16-bit counters
  (``O(C log C)``, branch-free; a binary trie beyond 65535 labels). Sorted keys without ties (one vectorized read)
  skip the tie counts: the dense ranks are the positions, their inversions (up to 1023) a bitset's popcounts.
* Kendall distance at k: each row's top ``k`` come from one scan (``k`` up to :data:`SCAN_MAX_K`; a larger ``k``
  sorts the row): the maxima of chunks of :data:`SCAN_CHUNK` entries bound the k-th highest score from below (the
  k-th highest chunk maximum, found by branch-free max and min steps); the few entries at or above that bound are
  the candidates, gathered branch-free, and the lowest of them are dropped until k remain (a sorted buffer where
  ties make many). The union of the two top sets is marked, and its pairs are compared directly when the union is
  small (:data:`PAIRS_MAX`), else counted as for tau.

Both variants of a parallel kernel write per-row values only; torch sums them in row order, so results do not depend
on the thread count.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap._kernel_contract import SCORE_DTYPES
from torch_lwlrap._ltr_sort import DIGIT_BITS
from torch_lwlrap import _numba_runtime
from torch_lwlrap._numba_runtime import numba, parallel_and_serial, prange, run, serial_kernel

__all__ = ["unavailable_reason", "correlation_rows", "distance_rows"]

#: Rows per block: the unit of work of one thread, which allocates its workspace once.
BLOCK_ROWS = 64

INT_SUMS_MAX = 2_000_000  # the longest row whose Spearman sums (up to C**3 / 3) are exact int64; float64 beyond.

#: Largest rank whose distinct values are counted through a bitset (16 words) and a trie over its words.
BITSET_MAX_RANK = 1023

#: Largest k whose top set is found by a scan (and at most half the row's chunks); a larger k sorts the row.
SCAN_MAX_K = 48

#: Entries per chunk of a scan: each chunk's maximum bounds the k-th highest entry from below.
SCAN_CHUNK = 16

#: Most candidates beyond k that the scan drops one at a time (the lowest first); more (ties) go through a sorted
#: buffer.
DROP_MAX = 8

#: Largest union compared pair by pair; a larger one is counted as for tau.
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
    zero = np.int64(0) if num_classes <= INT_SUMS_MAX else np.float64(0)  # Spearman's sums: their type
    run(_correlation_kernel, n * num_classes, bits_a, bits_b, nbits, method == "kendall", check_nan, out,
        defined.numpy(), zero)
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
    from torch_lwlrap._ltr_sort import (
        _LOW, _count_key, _has_nan, _has_ties, _key, _sort, _sort_packed, _sorted_words,
    )

    from numba.core import types as _types
    from numba.extending import intrinsic as _intrinsic

    @_intrinsic
    def _popcount(typingctx, word):
        """The set bits of a uint64 (LLVM's ``ctpop``: one instruction where the processor has one)."""
        def codegen(context, builder, signature, args):
            return builder.call(builder.module.declare_intrinsic("llvm.ctpop", [args[0].type]), args)

        return _types.uint64(_types.uint64), codegen

    #: One in each 16-bit counter below ``x`` (:func:`_inversions_4ary`).
    _BELOW = np.array([0, 1, 0x10001, 0x100010001], np.uint64)

    @serial_kernel
    def _inversions(sequence, n, rank, work, distinct):
        """The pairs ``p < q`` with ``sequence[p] > sequence[q]`` of ``sequence[:n]`` (words' lower halves), values
        in ``[1, rank]``: a trie over the values' digits, highest first, read once, branch-free. ``distinct`` values
        up to :data:`BITSET_MAX_RANK`: :func:`_inversions_distinct`; else up to 65535 values a 4-ary trie
        (:func:`_inversions_4ary`); more, a binary trie whose node ``ones[node]`` counts the values read so far
        that went on to its upper half (a value that goes to the lower half is below all of them)."""
        if distinct and rank <= BITSET_MAX_RANK:
            return _inversions_distinct(sequence, n, rank, work[12])
        levels = 0
        while (1 << levels) <= rank:
            levels += 1
        if n <= 0xFFFF:
            return _inversions_4ary(sequence, n, (levels + 1) >> 1, work[11])
        ones = work[6]
        ones[: 2 << levels] = 0
        dis = 0
        for p in range(n):
            v = np.int64(sequence[p] & _LOW)
            node = 1
            for level in range(levels - 1, -1, -1):
                bit = (v >> level) & 1
                dis += ones[node] & (bit - 1)  # bit 0: every value read so far on the upper half is greater
                ones[node] += bit
                node = 2 * node + bit
        return dis

    @serial_kernel
    def _inversions_distinct(sequence, n, rank, work):
        """:func:`_inversions` of distinct values up to :data:`BITSET_MAX_RANK`: a bitset of the values read
        (``work[:16]``) counts those above a value in its word (shift, popcount), a 4-ary trie over the word index
        (``work[16:24]``) those in higher words: 3 loads and stores per value, not 5 (1.8 times as fast at 527)."""
        work[: ((rank >> 6) + 1)] = 0
        work[16:24] = 0
        dis = np.uint64(0)
        for p in range(n):
            v = sequence[p] & _LOW
            w = v >> np.uint64(6)
            bit = v & np.uint64(63)
            word = work[w]
            dis += _popcount(word >> bit)  # the values read in this word above v (v itself is not there yet)
            work[w] = word | (np.uint64(1) << bit)
            x, y = w >> np.uint64(2), w & np.uint64(3)  # the word's two digits
            node = work[17]
            dis += (node >> (x << np.uint64(4))) & np.uint64(0xFFFF)
            work[17] = node + _BELOW[x]
            node = work[np.uint64(20) + x]
            dis += (node >> (y << np.uint64(4))) & np.uint64(0xFFFF)
            work[np.uint64(20) + x] = node + _BELOW[y]
        return np.int64(dis)

    @serial_kernel
    def _inversions_4ary(sequence, n, digits, nodes):
        """:func:`_inversions` over ``digits`` 2-bit digits: a node is a word of four 16-bit counters, counter ``k``
        the values read so far whose digit there is above ``k``; digit ``x`` reads counter ``x`` (the fourth stays
        0) and adds ``_BELOW[x]``: one load and store per digit (about 1.8 times as fast as a binary trie)."""
        nodes[: 1 << (2 * digits - 1)] = 0
        dis = np.uint64(0)
        for p in range(n):
            v = sequence[p] & _LOW
            node = np.uint64(1)
            for level in range(digits - 1, -1, -1):
                x = (v >> np.uint64(2 * level)) & np.uint64(3)
                word = nodes[node]
                dis += (word >> (x << np.uint64(4))) & np.uint64(0xFFFF)
                nodes[node] = word + _BELOW[x]
                node = (node << np.uint64(2)) + x
        return np.int64(dis)

    @serial_kernel
    def _kendall_counts(keys_a, keys_b, n, nbits, work):
        """``(dis, xtie, ytie, ntie)`` of the keys ``[:n]`` of two rows (see the module's docstring)."""
        perm_keys, dense = work[10], work[5]
        # y: sorted, its dense ranks (from 1) in its order, its tied pairs.
        items, words = _sorted_words(keys_b, None, n, nbits, work)
        y_tied = _has_ties(items, n)
        ytie = rank = start = 0
        if nbits == 32:  # the words of x written here, in y's order (in the spare array), and their histograms
            count = work[9]
            count[:] = 0
        for p in range(n):
            if y_tied:
                new = p == 0 or (items[p] ^ items[p - 1]) >> np.uint64(32) != 0
                rank += new
                start = p if new else start
                ytie += p - start
            else:  # the dense rank is the position
                rank = p + 1
            key = keys_a[np.int64(items[p] & _LOW)]
            if nbits == 32:
                words[p] = (np.uint64(key) << np.uint64(32)) | np.uint64(rank)
                _count_key(count, np.uint32(key))
            else:
                dense[p] = rank
                perm_keys[p] = key
        # x: sorted from y's order (stable: by x, then y), carrying y's dense rank.
        if nbits == 32:
            items = _sort_packed(words, n, items, count)[0]
        else:
            items = _sorted_words(perm_keys, dense, n, nbits, work)[0]
        xtie = ntie = group = run_start = 0
        if _has_ties(items, n):
            for p in range(n):
                changed = items[p] ^ items[p - 1] if p else ~np.uint64(0)
                group = p if changed >> np.uint64(32) != 0 else group
                run_start = p if changed != 0 else run_start
                xtie += p - group
                ntie += p - run_start
        return _inversions(items, n, rank, work, not y_tied), xtie, ytie, ntie

    @serial_kernel
    def _workspace(num_classes, bits):
        """Keys, columns and counts of :func:`_sort`, the tries of :func:`_inversions`, words and counts of
        :func:`_sort_packed`, the keys of ``x`` in ``y``'s order."""
        n = num_classes
        return (np.empty(n, bits.dtype), np.empty(n, np.int32), np.empty(n, bits.dtype), np.empty(n, np.int32),
                np.empty((64 // DIGIT_BITS) << DIGIT_BITS, np.int32), np.empty(n, np.int32),
                np.zeros(4 * (n + 1), np.int32), np.empty(n, np.uint64), np.empty(n, np.uint64),
                np.empty((4, 1 << DIGIT_BITS), np.uint32), np.empty(n, bits.dtype), np.empty(2 * (n + 1), np.uint64),
                np.empty(32, np.uint64))

    @serial_kernel
    def _rank_sums(items, n, ends, ranks, first, zero):
        """Over sorted words (:func:`_sorted_words`), twice the centered average rank ``r`` of each entry (group
        ``[start, end)`` of equal keys: ``start + end - n``): ``(sum of r * r, sum of products)`` in ``zero``'s type.
        With ``first``, ``ranks[column] = r`` (the products are 0); else the products with ``ranks``. Branch-free:
        without ties (:func:`_has_ties`) ``r = 2 p + 1 - n`` at ``p``; else ``ends`` holds each group's end."""
        tied = _has_ties(items, n)
        end = n
        for p in range(n - 1 if tied else -1, -1, -1):
            ends[p] = end
            end = p if p and (items[p] ^ items[p - 1]) >> np.uint64(32) != 0 else end
        squares = products = zero
        start = 0
        for p in range(n):
            if tied:
                start = p if p and (items[p] ^ items[p - 1]) >> np.uint64(32) != 0 else start
                r = start + np.int64(ends[p]) - n
            else:
                r = 2 * p + 1 - n
            squares += r * r
            col = np.int64(items[p] & _LOW)
            if first:
                ranks[col] = r
            else:
                products += r * ranks[col]
        return squares, products

    @parallel_and_serial
    def _correlation_kernel(bits_a, bits_b, nbits, kendall, check_nan, value, defined, zero):
        num_rows, num_classes = bits_a.shape
        num_blocks = (num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        total = num_classes * (num_classes - 1) // 2
        for block in prange(num_blocks):
            work = _workspace(num_classes, bits_a)
            keys_a = np.empty(num_classes, bits_a.dtype)
            keys_b = np.empty(num_classes, bits_a.dtype)
            ranks_a = np.empty(num_classes, np.int64)
            ends = np.empty(num_classes, np.int64)
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
                # Four times the sums of squares and products of the centered average ranks (integer terms).
                sxx = _rank_sums(_sorted_words(keys_a, None, num_classes, nbits, work)[0], num_classes, ends,
                                 ranks_a, True, zero)[0]
                syy, sxy = _rank_sums(_sorted_words(keys_b, None, num_classes, nbits, work)[0], num_classes, ends,
                                      ranks_a, False, zero)
                if sxx > 0 and syy > 0:
                    value[row] = min(1.0, max(-1.0, sxy / np.sqrt(np.float64(sxx) * np.float64(syy))))
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
        pair tied in one row only. Branch-free, from the four comparisons' booleans (no product of two signs) and
        with unsigned indices: 5 times as fast as the signs' products. ``p``, ``n``: unsigned."""
        twice = 0
        x, y = pair_a[p], pair_b[p]
        for q in range(p + np.uint64(1), n):
            above_a, below_a, above_b, below_b = x > pair_a[q], x < pair_a[q], y > pair_b[q], y < pair_b[q]
            opposite = (above_a & below_b) | (below_a & above_b)
            twice += 2 * np.int64(opposite) + np.int64((above_a | below_a) != (above_b | below_b))
        return twice

    @serial_kernel
    def _add(col, mark, union, n):
        """Add column ``col`` to ``union[:n]`` unless ``mark``ed; returns the new size. Unsigned indices (``n`` too)
        spare numba's check for a negative one."""
        col = np.uint64(col)
        if mark[col]:
            return n
        mark[col] = True
        union[n] = col
        return n + np.uint64(1)

    @serial_kernel
    def _kth_highest(values, m, k, top):
        """The ``k``-th highest of ``values[:m]`` (``k <= m``), through ``top[:k]``: a buffer of the ``k`` highest
        so far, descending, that starts at -inf, and down which each value is passed by branch-free max and min
        steps (about 2.5 times as fast as an insertion that branches). Every value stays one of the inputs, so that
        an unchecked NaN gives some value, and the caller falls back to a sort when fewer than ``k`` entries reach
        it."""
        for p in range(k):
            top[p] = -np.inf
        for c in range(m):
            v = values[c]
            for p in range(k):
                t = top[p]
                top[p] = max(t, v)
                v = min(t, v)
        return top[k - 1]

    @serial_kernel
    def _add_top(values, bits, nbits, k, mark, union, n, top_values, top_cols, cand_values, cand_cols, work):
        """Add the ``k`` highest entries of a row (tied: lower column first) to ``union[:n]`` unless ``mark``ed;
        returns the new size (``n`` unsigned, as in :func:`_add`)."""
        num_classes = values.shape[0]
        num_chunks = (num_classes + SCAN_CHUNK - 1) // SCAN_CHUNK
        if k <= min(SCAN_MAX_K, num_chunks // 2):
            # The k highest chunk maxima are k entries, so the k-th highest entry is at least the lowest of them:
            # only the entries at or above it, in the chunks that hold one, are candidates.
            chunk_max = top_values[k:]
            full = num_classes // SCAN_CHUNK
            for c in range(full):
                chunk_max[c] = _chunk_max(values, c * SCAN_CHUNK)
            if full < num_chunks:
                best = values[full * SCAN_CHUNK]
                for i in range(full * SCAN_CHUNK + 1, num_classes):
                    best = max(best, values[i])
                chunk_max[full] = best
            floor = _kth_highest(chunk_max, num_chunks, k, top_values)
            # The candidates, in column order (branch-free; an unsigned count spares each store numba's check for a
            # negative index: 2.6 times as fast).
            found = np.uint64(0)
            for c in range(num_chunks):
                if chunk_max[c] < floor:
                    continue
                for j in range(c * SCAN_CHUNK, min((c + 1) * SCAN_CHUNK, num_classes)):
                    v = values[j]
                    cand_values[found] = v
                    cand_cols[found] = j
                    found += np.uint64(v >= floor)
            m = np.int64(found)
            if k <= m <= k + DROP_MAX:
                # A few too many: drop the lowest, the last (highest column) of equal ones, one at a time.
                one, top = np.uint64(1), np.uint64(k)
                while found > top:
                    at = np.uint64(0)
                    low = cand_values[0]
                    for i in range(one, found):
                        if cand_values[i] <= low:
                            low = cand_values[i]
                            at = i
                    for i in range(at, found - one):
                        cand_values[i] = cand_values[i + one]
                        cand_cols[i] = cand_cols[i + one]
                    found -= one
                for i in range(k):
                    n = _add(cand_cols[i], mark, union, n)
                return n
            if m > k:
                return _add_many(cand_values, cand_cols, m, k, mark, union, n, top_values, top_cols)
            # Fewer than k candidates: only NaN scores, which no check took out, do that. The sort takes any bits.
        return _add_sorted(bits, nbits, k, mark, union, n, work)

    # The two rare ways of _add_top, as functions of their own so that its common way reads on its own (side by
    # side, the split made no measurable difference to its speed).

    @serial_kernel
    def _add_many(cand_values, cand_cols, m, k, mark, union, n, top_values, top_cols):
        """Many candidates (ties): a buffer sorted by (value descending, column ascending), read in column order, so
        that a later column displaces an entry only with a strictly higher value."""
        for i in range(m):
            v = cand_values[i]
            if i >= k:
                if not v > top_values[k - 1]:
                    continue
                p = k - 2
            else:
                p = i - 1
            while p >= 0 and top_values[p] < v:
                top_values[p + 1] = top_values[p]
                top_cols[p + 1] = top_cols[p]
                p -= 1
            top_values[p + 1] = v
            top_cols[p + 1] = cand_cols[i]
        for i in range(k):
            n = _add(top_cols[i], mark, union, n)
        return n

    @serial_kernel
    def _add_sorted(bits, nbits, k, mark, union, n, work):
        """The top ``k`` of a sorted row: the entries from position C - k on, except that the group of equal keys
        across that position contributes its lowest columns (its first entries)."""
        num_classes = bits.shape[0]
        keys, cols, tmp_keys, tmp_cols, count = work[0], work[1], work[2], work[3], work[4]
        for j in range(num_classes):
            keys[j] = _key(bits[j], nbits)
            cols[j] = j
        _sort(keys, cols, num_classes, nbits, tmp_keys, tmp_cols, count)
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
            work = _workspace(num_classes, bits_a)
            mark = np.zeros(num_classes, np.bool_)
            union = np.empty(num_classes, np.uint64)  # unsigned: no check for a negative index where it is read
            top_values = np.empty(num_classes + 1, values_a.dtype)  # the buffer, then the chunk maxima
            top_cols = np.empty(num_classes, np.int64)
            cand_values = np.empty(num_classes, values_a.dtype)  # the candidates of the scan, and their columns
            cand_cols = np.empty(num_classes, np.uint64)
            keys_a = np.empty(num_classes, bits_a.dtype)
            keys_b = np.empty(num_classes, bits_a.dtype)
            pair_a = np.empty(PAIRS_MAX, values_a.dtype)
            pair_b = np.empty(PAIRS_MAX, values_a.dtype)
            for row in range(block * BLOCK_ROWS, min(num_rows, (block + 1) * BLOCK_ROWS)):
                if check_nan and (_has_nan(bits_a[row], 0, num_classes, nbits)
                                  or _has_nan(bits_b[row], 0, num_classes, nbits)):
                    out[row] = np.nan
                    continue
                a, b = values_a[row], values_b[row]
                size = _add_top(a, bits_a[row], nbits, k, mark, union, np.uint64(0), top_values, top_cols,
                                cand_values, cand_cols, work)
                size = _add_top(b, bits_b[row], nbits, k, mark, union, size, top_values, top_cols, cand_values,
                                cand_cols, work)
                for p in range(size):
                    mark[union[p]] = False
                n = np.int64(size)
                if n < 2:
                    out[row] = 0.0
                    continue
                twice = 0  # twice the distance's numerator: 2 per opposite pair, 1 per pair tied in one row only
                if n <= PAIRS_MAX:
                    for p in range(size):
                        pair_a[p] = a[union[p]]
                        pair_b[p] = b[union[p]]
                    for p in range(size):
                        twice += _pairs_with(pair_a, pair_b, p, size)
                else:
                    for p in range(n):
                        keys_a[p] = _key(bits_a[row, union[p]], nbits)
                        keys_b[p] = _key(bits_b[row, union[p]], nbits)
                    dis, xtie, ytie, ntie = _kendall_counts(keys_a, keys_b, n, nbits, work)
                    twice = 2 * dis + xtie + ytie - 2 * ntie
                out[row] = twice / (n * (n - 1))
