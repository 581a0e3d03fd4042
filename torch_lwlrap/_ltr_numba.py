"""Compiled CPU kernels of the rank-agreement metrics (rank correlations, Kendall distance at k), with numba.

One pass per row, rows spread over numba's threads in blocks, each block with its own workspace; every kernel runs
through the one runner (:func:`torch_lwlrap._numba_runtime.run`). Each row asks for the next pair of rows from memory
while it is ranked (:func:`torch_lwlrap._numba_vector.prefetch_row`): the correlations before they start (a few
percent faster); the distance, whose work per row is short and which spent much of its time waiting for its rows,
in halves spread over its work (:func:`torch_lwlrap._numba_vector.prefetch_part`): half of the next row of the first
input first, the rest of it and half of the second's after the two floors, the rest after the first top k.
Asking for both rows at once filled the processor's line-fill buffers, and the next instructions waited (1.15 to 1.2
times as fast spread; 1.2 times as fast at once as without prefetching).

* NaN: with ``check_nan`` each kernel tests every score of both rows for NaN on its bits (an integer test, which no
  compiler flag can drop; the correlations in the read that makes the rows' keys), marks a row that holds one with
  a NaN value and skips the rest of its work. The distance's scan for the top k instead finds NaN in the read it
  makes of every score anyway (unordered vector comparisons, which carry no fast-math flag): 1.05 to 1.1 times as
  fast as a pass of its own.
  The caller then raises the input gate's error (:func:`torch_lwlrap._checks.pair_nan_error`), and the gate need
  not read the scores first.
* A row is ranked by the sorts of :mod:`torch_lwlrap._ltr_sort`: the words ``key << 32 | payload`` of its
  scores' order-preserving keys, sorted stably.
* Spearman's rho: twice the average ranks, centered on ``(C + 1) / 2`` (integers: exact int64 sums up to
  2M labels): ``2 p + 1 - C`` at sorted position ``p`` without ties, else from each entry's tie group, branch-free (its
  end in a backward pass, its start in the forward one); ``sxy`` read in the order of ``y``; ``sxy / sqrt(sxx syy)``.
* Kendall's tau-b: the counts of scipy's ``kendalltau`` (:mod:`torch_lwlrap._ltr_counts`), of two rows at a time
  where their keys are 32-bit: a row waits for the next one (NaN rows in between are marked as they come), and a
  row still waiting at its block's end is counted alone.
* The functions a row's work calls are compiled without numba's reference counts
  (:func:`torch_lwlrap._numba_runtime.borrowing_kernel`).
* Kendall distance at k: each row's top ``k`` come from one scan (``k`` up to :data:`SCAN_MAX_K` and a row of at
  least ``2 G`` labels; otherwise the row is sorted), in the vectors of :mod:`torch_lwlrap._numba_vector`: the row's
  columns fall into ``G`` groups by column modulo ``G`` (``G``: ``2 k`` rounded up to whole vectors), whose maxima
  are a running vector maximum over the row (both rows' in one read); the k-th highest group maximum, from a
  sorting network on one vector of 16 to 128 entries, bounds the k-th highest score from below (both rows' networks
  one after the other, work the processor overlaps); the entries at or above that bound are the
  candidates, taken from the set bits of vector comparisons, and each candidate's place among them (those above
  it, the equal ones in lower columns) decides whether it is one of the top ``k``.
  Ties that leave many candidates go through a sorted buffer. The union of the two top sets is marked, and its
  pairs are compared directly, an entry against a vector of the later ones, when the union is small
  (:data:`PAIRS_MAX`), else counted as for tau.

Both variants of a parallel kernel write per-row values only, which do not depend on the thread count; torch's sum
of them may differ in its last bits with the thread count.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap._kernel_contract import SCORE_DTYPES
from torch_lwlrap._ltr_sort import DIGIT_BITS
from torch_lwlrap._numba_vector import LANES, NETWORK_WIDTHS
from torch_lwlrap import _numba_runtime
from torch_lwlrap._numba_runtime import borrowing_kernel, numba, parallel_and_serial, prange, run, serial_kernel

__all__ = ["unavailable_reason", "correlation_rows", "distance_rows"]

#: Rows per block: the unit of work of one thread, which allocates its workspace once.
BLOCK_ROWS = 64

INT_SUMS_MAX = 2_000_000  # the longest row whose Spearman sums (up to C**3 / 3) are exact int64; float64 beyond.

#: Largest k whose top set is found by a scan; a larger k sorts the row.
SCAN_MAX_K = 48

#: Most candidates that the scan places by vector comparisons; more (ties) go through a sorted buffer.
RANKED_MAX = 4 * LANES

#: Group maxima of a scan at most: a scan for the top k takes 2 k groups rounded up to whole vectors (about k and a
#: few more entries then reach the k-th highest group maximum on scores without ties), and rows of at least twice as
#: many labels.
SCAN_MAX_GROUPS = (2 * SCAN_MAX_K + LANES - 1) // LANES * LANES

#: Largest union compared pair by pair (in vectors of :data:`LANES` entries); a larger one is counted as for tau.
PAIRS_MAX = 3 * LANES

assert PAIRS_MAX % LANES == 0 and SCAN_MAX_GROUPS % LANES == 0  # whole vectors: the scan's loads stay inside
assert SCAN_MAX_GROUPS <= NETWORK_WIDTHS[-1]


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
    value = torch.zeros(n, dtype=torch.float64, device="cpu")
    defined = torch.zeros(n, dtype=torch.bool, device="cpu")
    if not n:
        return value, defined, False
    _, bits_a, nbits = _bits(a)
    _, bits_b, _ = _bits(b)
    out = value.numpy()
    zero = np.int64(0) if num_classes <= INT_SUMS_MAX else np.float64(0)  # Spearman's sums: their type
    run(_correlation_kernel, n * num_classes, bits_a, bits_b, nbits, method == "kendall", check_nan, out,
        defined.numpy(), zero, workload=method)
    return value, defined, bool(check_nan and np.isnan(out).any())


def distance_rows(a: Tensor, b: Tensor, k: int, check_nan: bool = False) -> Tuple[Tensor, bool]:
    """``(distance, nan_found)``: float64 ``(n,)``, the Kendall distance at ``k`` of each pair of CPU rows, as
    :func:`torch_lwlrap._ltr_torch.distance_rows`, and with ``check_nan`` whether a score of either is NaN (then the
    distances are not to be used)."""
    a, b = _common(a, b)
    n, num_classes = a.shape
    out = torch.zeros(n, dtype=torch.float64, device="cpu")
    if not n:
        return out, False
    values_a, bits_a, nbits = _bits(a)
    values_b, bits_b, _ = _bits(b)
    rows = out.numpy()
    k = min(k, num_classes)
    run(_distance_kernel, n * num_classes, values_a, values_b, bits_a, bits_b, nbits, k, check_nan, rows,
        workload=k.bit_length())  # k's size class: a sweep over k starts a handful of timings, not one per k
    return out, bool(check_nan and np.isnan(rows).any())


if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports
    from torch_lwlrap._ltr_counts import _kendall_counts, _kendall_counts_pair
    from torch_lwlrap._ltr_sort import _LOW, _has_nan, _has_ties, _is_nan, _key, _sort, _sorted_words_pair

    from torch_lwlrap._numba_vector import (
        lanes_eq, lanes_ge, lanes_gt, lanes_lt, lanes_sort16, lanes_sort32, lanes_sort64, lanes_sort128,
        lanes_store_max, lowest_bit, popcount, prefetch_part, prefetch_row,
    )

    @serial_kernel
    def _workspace(num_classes, bits):
        """A block's arrays, grouped as their functions take them: ``(wide, items, spare, count, perm_keys, dense,
        tries)``. ``wide``: the keys, columns, their spares and the counts of :func:`_sort` (a 64-bit key's sort);
        ``items``, ``spare``, ``count``: the words and histograms of :func:`_sort_packed`; ``perm_keys``,
        ``dense``: ``x``'s keys in ``y``'s order and ``y``'s dense ranks (:func:`_kendall_counts`, 64-bit keys);
        ``tries``: the bitset, 4-ary and binary tries of :func:`_inversions`. Functions take the groups they use,
        not the whole workspace."""
        n = num_classes
        wide = (np.empty(n, bits.dtype), np.empty(n, np.int32), np.empty(n, bits.dtype), np.empty(n, np.int32),
                np.empty((64 // DIGIT_BITS) << DIGIT_BITS, np.uint32))
        tries = (np.empty(64, np.uint64), np.empty(2 * (n + 1), np.uint64), np.zeros(4 * (n + 1), np.int32))
        return (wide, np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty((4, 1 << DIGIT_BITS), np.uint32),
                np.empty(n, bits.dtype), np.empty(n, np.int32), tries)

    @borrowing_kernel
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

    @borrowing_kernel
    def _spearman_sums(keys_a, keys_b, n, nbits, pair_a, pair_b, wide, ends, ranks, zero):
        """Four times the sums of squares and products of the centered average ranks of the keys ``[:n]`` of two
        rows, ``(sxx, syy, sxy)`` in ``zero``'s type (integer terms): both rows sorted side by side
        (:func:`_sorted_words_pair`; ``pair_a``, ``pair_b``: each row's words, spare and histograms), then
        :func:`_rank_sums`."""
        in_spare_a, in_spare_b = _sorted_words_pair(keys_a, keys_b, n, nbits, pair_a, pair_b, wide)
        items, spare, _ = pair_a
        sxx = _rank_sums(spare if in_spare_a else items, n, ends, ranks, True, zero)[0]
        items, spare, _ = pair_b
        syy, sxy = _rank_sums(spare if in_spare_b else items, n, ends, ranks, False, zero)
        return sxx, syy, sxy

    @borrowing_kernel
    def _row_keys(bits_a, bits_b, row, nbits, keys_a, keys_b):
        """The keys (:func:`_key`) of a pair of rows of bits into ``keys_a``, ``keys_b``: whether a score of either
        is NaN (tested in the same read: a few percent faster than a read of its own)."""
        nan = False
        for j in range(bits_a.shape[1]):
            x, y = bits_a[row, j], bits_b[row, j]
            nan |= _is_nan(x, nbits) | _is_nan(y, nbits)
            keys_a[j] = _key(x, nbits)
            keys_b[j] = _key(y, nbits)
        return nan

    @borrowing_kernel
    def _store_tau(value, defined, row, counts, total):
        """Kendall's tau-b of a row from :func:`_kendall_counts`'s counts (none where either row is constant)."""
        dis, xtie, ytie, ntie = counts
        if xtie < total and ytie < total:
            tau = (total - xtie - ytie + ntie - 2 * dis) / np.sqrt(total - xtie) / np.sqrt(total - ytie)
            value[row] = min(1.0, max(-1.0, tau))
            defined[row] = True

    @parallel_and_serial
    def _correlation_kernel(bits_a, bits_b, nbits, kendall, check_nan, value, defined, zero):
        num_rows, num_classes = bits_a.shape
        num_blocks = (num_rows + BLOCK_ROWS - 1) // BLOCK_ROWS
        total = num_classes * (num_classes - 1) // 2
        for block in prange(num_blocks):
            wide, items, spare, count, perm_keys, dense, tries = _workspace(num_classes, bits_a)
            keys_a = np.empty(num_classes, bits_a.dtype)
            keys_b = np.empty(num_classes, bits_a.dtype)
            keys_c = np.empty(num_classes, bits_a.dtype)  # Kendall's rows wait in pairs: the first one's keys
            keys_d = np.empty(num_classes, bits_a.dtype)
            ranks_a = np.empty(num_classes, np.int64)
            ends = np.empty(num_classes, np.int64)
            pair_b = (np.empty(num_classes, np.uint64), np.empty(num_classes, np.uint64), np.empty_like(count))
            waiting = -1  # a Kendall row (32-bit keys) whose keys wait in keys_c, keys_d for a second one
            for row in range(block * BLOCK_ROWS, min(num_rows, (block + 1) * BLOCK_ROWS)):
                if row + 1 < num_rows:  # the next pair of rows on its way from memory while this one is ranked
                    prefetch_row(bits_a, row + 1)
                    prefetch_row(bits_b, row + 1)
                pairs = kendall and nbits == 32 and waiting < 0
                if pairs:
                    nan = _row_keys(bits_a, bits_b, row, nbits, keys_c, keys_d)
                else:
                    nan = _row_keys(bits_a, bits_b, row, nbits, keys_a, keys_b)
                if check_nan and nan:
                    value[row] = np.nan
                elif pairs:
                    waiting = row
                elif kendall and nbits == 32:  # two rows side by side (1.2 times as fast as one at a time)
                    first, second = _kendall_counts_pair(keys_c, keys_d, keys_a, keys_b, num_classes,
                                                         (items, spare, count), pair_b, wide, perm_keys, dense,
                                                         tries)
                    _store_tau(value, defined, waiting, first, total)
                    _store_tau(value, defined, row, second, total)
                    waiting = -1
                elif kendall:
                    _store_tau(value, defined, row, _kendall_counts(keys_a, keys_b, num_classes, nbits, items, spare,
                                                                    count, wide, perm_keys, dense, tries), total)
                else:
                    # Four times the sums of squares and products of the centered average ranks (integer terms).
                    sxx, syy, sxy = _spearman_sums(keys_a, keys_b, num_classes, nbits, (items, spare, count), pair_b,
                                                   wide, ends, ranks_a, zero)
                    if sxx > 0 and syy > 0:
                        value[row] = min(1.0, max(-1.0, sxy / np.sqrt(np.float64(sxx) * np.float64(syy))))
                        defined[row] = True
            if waiting >= 0:  # a Kendall row still waiting at the block's end, alone
                _store_tau(value, defined, waiting, _kendall_counts(keys_c, keys_d, num_classes, nbits, items, spare,
                                                                    count, wide, perm_keys, dense, tries), total)

    @serial_kernel
    def _twice_discordant(pair_a, pair_b, n):
        """Twice the distance's numerator over the pairs of ``pair_a[:n]``, ``pair_b[:n]`` (``n`` up to
        :data:`PAIRS_MAX`, the arrays that long): 2 for a pair ordered oppositely, 1 for a pair tied in one row only.
        Each entry ``p`` against the vectors of the later ones, as bit masks of the four comparisons."""
        twice = np.uint64(0)
        n = np.uint64(n)
        one, lanes = np.uint64(1), np.uint64(LANES)
        for p in range(n):
            x, y = pair_a[p], pair_b[p]
            for start in range((p + one) // lanes * lanes, n, lanes):
                low = p + one - start if p + one > start else np.uint64(0)
                high = n - start if n - start < lanes else lanes
                later = ((one << high) - one) & ~((one << low) - one)  # the entries q with p < q < n
                above_a, below_a = lanes_lt(pair_a, start, x), lanes_gt(pair_a, start, x)
                above_b, below_b = lanes_lt(pair_b, start, y), lanes_gt(pair_b, start, y)
                opposite = ((above_a & below_b) | (below_a & above_b)) & later
                one_tied = ((above_a | below_a) ^ (above_b | below_b)) & later
                twice += (popcount(opposite) << one) + popcount(one_tied)
        return np.int64(twice)

    @serial_kernel
    def _add(col, mark, union, n, take=True):
        """With ``take``, add column ``col`` to ``union[:n]`` unless ``mark``ed; returns the new size. Branch-free
        (``union`` holds one entry more than the row), with unsigned indices (``n`` too): no check for a negative
        one."""
        col = np.uint64(col)
        union[n] = col
        n += np.uint64(take and not mark[col])
        mark[col] |= take
        return n

    @serial_kernel
    def _scan_groups(k):
        """The groups of a scan for the top ``k``: ``2 k`` rounded up to whole vectors (see SCAN_MAX_GROUPS)."""
        return (2 * k + LANES - 1) // LANES * LANES

    @serial_kernel
    def _scan_applies(k, num_classes):
        """Whether :func:`_scan_top` serves the top ``k`` of rows of ``num_classes`` labels."""
        return 1 <= k <= SCAN_MAX_K and 2 * _scan_groups(k) <= num_classes

    @serial_kernel
    def _scan_top(values, k, floor, mark, union, n, cand_values, cand_cols):
        """Add the ``k`` highest entries of a row (tied: lower column first) to ``union[:n]`` unless ``mark``ed, by a
        scan (:func:`_scan_applies`) for the entries at or above ``floor`` (:func:`_scan_floors`), the candidates.
        Returns ``(size, found, placed)``: ``found`` (int64) the number of candidates; ``placed`` when there are
        ``k`` to :data:`RANKED_MAX` of them, which the scan then placed, ``size`` the new size (unsigned, as in
        :func:`_add`); else nothing was added (``size`` is ``n``), and the candidates are ``cand_values[:found]``,
        ``cand_cols[:found]``, for :func:`_add_rest`. ``cand_values``: the row's length and a vector more;
        ``cand_cols``: the row's length. The rare ways are the caller's: inside this function they made the common
        way 1.2 times as slow."""
        num_classes = values.shape[0]
        # The candidates, in column order: the set bits of vector comparisons, four to a 64-bit word, of which the
        # first four set bits are taken without a branch (a word with more goes on one at a time); unsigned counts
        # spare a check for a negative index.
        one, lanes = np.uint64(1), np.uint64(LANES)
        found = np.uint64(0)
        whole = np.uint64(num_classes // LANES * LANES)
        for base in range(np.uint64(0), whole, np.uint64(4 * LANES)):
            word = np.uint64(0)
            for start in range(base, min(base + np.uint64(4 * LANES), whole), lanes):
                word |= lanes_ge(values, start, floor) << (start - base)
            count = popcount(word)
            for i in range(4):
                # Past the count: never read. found <= base, so the index stays below the row's length.
                cand_cols[found + np.uint64(i)] = base + lowest_bit(word)
                word &= word - one
            found += min(count, np.uint64(4))
            while word:
                cand_cols[found] = base + lowest_bit(word)
                found += one
                word &= word - one
        for j in range(whole, num_classes):
            cand_cols[found] = j
            found += np.uint64(values[j] >= floor)
        for i in range(found):
            cand_values[i] = values[cand_cols[i]]
        m = np.int64(found)
        if not k <= m <= RANKED_MAX:
            return n, m, False
        # Each candidate's place: the candidates above it and the equal ones before it (vector comparisons; the
        # entries past the candidates are -inf and never above, nor before).
        cand_values[found: (found + lanes - one) // lanes * lanes] = -np.inf
        for i in range(found):
            v = cand_values[i]
            place = np.uint64(0)
            for start in range(np.uint64(0), found, lanes):
                before = (one << (i - start)) - one if i - start < lanes else ~np.uint64(0)
                before = before if i >= start else np.uint64(0)
                place += popcount(lanes_gt(cand_values, start, v))
                place += popcount(lanes_eq(cand_values, start, v) & before)
            n = _add(cand_cols[i], mark, union, n, place < np.uint64(k))
        return n, m, True

    @serial_kernel
    def _scan_floors(a, b, k, group_max):
        """``(floor_a, floor_b, nan)``: the floors of the scans for the top ``k`` of two rows (:func:`_scan_top`),
        and whether either row holds a NaN (then the floors are of no use). Group ``g`` of a row holds its columns
        ``g, g + G, g + 2 G, ...`` (``G``: :func:`_scan_groups`); the ``k`` highest group maxima are ``k`` entries,
        so the row's k-th highest entry is at least the lowest of them, its floor: only the entries at or above it
        can be among the top ``k``. Both rows' group maxima come from one read of both (twice the running maxima of
        one row's read, in registers), and their sorting networks follow one another: independent work, which the
        processor overlaps (1.1 times as fast as each row's scan in turn). The same read finds NaN (unordered
        comparisons). ``group_max``: ``2 * NETWORK_WIDTHS[-1]`` entries, ``b``'s maxima from the middle on."""
        num_classes = a.shape[0]
        groups = _scan_groups(k)
        top = NETWORK_WIDTHS[-1]
        stripes = num_classes // groups * groups
        nan = np.uint64(0)
        for g in range(0, groups, LANES):  # a vector of groups of each row at a time, its maxima kept in registers
            nan |= lanes_store_max(group_max, g, a, g, a, groups + g)
            nan |= lanes_store_max(group_max, top + g, b, g, b, groups + g)
            for start in range(2 * groups, stripes, groups):
                nan |= lanes_store_max(group_max, g, group_max, g, a, start + g)
                nan |= lanes_store_max(group_max, top + g, group_max, top + g, b, start + g)
        for j in range(stripes, num_classes):
            group_max[j - stripes] = max(group_max[j - stripes], a[j])
            group_max[top + j - stripes] = max(group_max[top + j - stripes], b[j])
            nan |= np.uint64(a[j] != a[j]) | np.uint64(b[j] != b[j])
        # The k-th highest group maximum: the maxima, -inf up to the narrowest network that holds them, sorted by it
        # (the two rows' networks written out one after the other: a shared helper was 1.02 times as slow).
        width = 16 if groups <= 16 else 32 if groups <= 32 else 64 if groups <= 64 else 128
        group_max[groups:width] = -np.inf
        group_max[top + groups:top + width] = -np.inf
        if width == 16:
            lanes_sort16(group_max, 0)
            lanes_sort16(group_max, top)
        elif width == 32:
            lanes_sort32(group_max, 0)
            lanes_sort32(group_max, top)
        elif width == 64:
            lanes_sort64(group_max, 0)
            lanes_sort64(group_max, top)
        else:
            lanes_sort128(group_max, 0)
            lanes_sort128(group_max, top)
        return group_max[k - 1], group_max[top + k - 1], nan != 0

    @serial_kernel
    def _add_rest(bits, nbits, k, found, mark, union, n, cand_values, cand_cols, top_values, top_cols, wide):
        """The top ``k`` of a row that :func:`_scan_top` left, added as there: more than ``k`` candidates (ties)
        through a sorted buffer; fewer (no scan, ``found`` 0; or NaN scores, which no check took out) from the row
        sorted, which takes any bits."""
        if found > k:
            return _add_many(cand_values, cand_cols, found, k, mark, union, n, top_values, top_cols)
        return _add_sorted(bits, nbits, k, mark, union, n, wide)

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
    def _add_sorted(bits, nbits, k, mark, union, n, wide):
        """The top ``k`` of a sorted row: the entries from position C - k on, except that the group of equal keys
        across that position contributes its lowest columns (its first entries)."""
        num_classes = bits.shape[0]
        keys, cols, tmp_keys, tmp_cols, count = wide
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
        scan = _scan_applies(k, num_classes)
        for block in prange(num_blocks):
            wide, items, spare, count, perm_keys, dense, tries = _workspace(num_classes, bits_a)
            mark = np.zeros(num_classes, np.bool_)
            union = np.empty(num_classes + 1, np.uint64)  # unsigned: no check for a negative index where it is read
            top_values = np.empty(num_classes, values_a.dtype)
            top_cols = np.empty(num_classes, np.int64)
            cand_values = np.empty(num_classes + LANES, values_a.dtype)  # the candidates of a scan, their columns
            cand_cols = np.empty(num_classes, np.uint64)
            keys_a = np.empty(num_classes, bits_a.dtype)
            keys_b = np.empty(num_classes, bits_a.dtype)
            pair_a = np.zeros(PAIRS_MAX, values_a.dtype)
            pair_b = np.zeros(PAIRS_MAX, values_a.dtype)
            group_max = np.empty(2 * NETWORK_WIDTHS[-1], values_a.dtype)
            for row in range(block * BLOCK_ROWS, min(num_rows, (block + 1) * BLOCK_ROWS)):
                ahead = row + 1 < num_rows  # the next pair of rows asked for in four halves, spread over this row's
                if ahead:  # work: one here, two after the floors, one after the first top k
                    prefetch_part(values_a, row + 1, 0, 2)
                if check_nan and not scan and (_has_nan(bits_a[row], 0, num_classes, nbits)
                                               or _has_nan(bits_b[row], 0, num_classes, nbits)):
                    out[row] = np.nan
                    continue
                a, b = values_a[row], values_b[row]
                floor_a = floor_b = group_max[0]  # (unused without a scan; any value of the right type)
                if scan:
                    floor_a, floor_b, nan = _scan_floors(a, b, k, group_max)
                    if check_nan and nan:
                        out[row] = np.nan
                        continue
                if ahead:
                    prefetch_part(values_a, row + 1, 1, 2)
                    prefetch_part(values_b, row + 1, 0, 2)
                size = np.uint64(0)
                for second in range(2):  # not a loop over a tuple of row views: that costs a reference count each
                    start, found, placed = size, 0, False
                    if scan:
                        size, found, placed = _scan_top(b if second else a, k, floor_b if second else floor_a, mark,
                                                        union, start, cand_values, cand_cols)
                    if ahead and not second:
                        prefetch_part(values_b, row + 1, 1, 2)
                    if not placed:
                        size = _add_rest(bits_b[row] if second else bits_a[row], nbits, k, found, mark, union, start,
                                         cand_values, cand_cols, top_values, top_cols, wide)
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
                    twice = _twice_discordant(pair_a, pair_b, size)
                else:
                    for p in range(n):
                        keys_a[p] = _key(bits_a[row, union[p]], nbits)
                        keys_b[p] = _key(bits_b[row, union[p]], nbits)
                    dis, xtie, ytie, ntie = _kendall_counts(keys_a, keys_b, n, nbits, items, spare, count, wide,
                                                            perm_keys, dense, tries)
                    twice = 2 * dis + xtie + ytie - 2 * ntie
                out[row] = twice / (n * (n - 1))
