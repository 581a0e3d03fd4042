"""Compiled per-row sorts of the rank-agreement kernels (:mod:`torch_lwlrap._ltr_numba`), with numba, and the
bit tests on scores they start from (the order-preserving key, the NaN test).

A row is ranked by a stable least-significant-digit radix sort of its scores' bits, made order-preserving
(``-0.0`` read as ``0.0``), a pass skipped when all of the row's keys share its digit. A float32 key (float16 and
bfloat16 rows are widened to float32, exactly) travels with its payload (column or rank) in one 64-bit word,
``key << 32 | payload``, sorted by the upper 24 bits of its key in three passes of 8 bits (one load and store per
entry and pass), then by the whole word in an insertion sort, which has little to do: the scores of a row seldom
share the upper 24 bits of their keys (where many do, the words are sorted again in all four passes; where all
do, the lowest digit's pass alone sorts them). Each pass's first places are a running sum over its histogram, in
vectors (:func:`torch_lwlrap._numba_vector.lanes_exclusive_sum`); the top digit (sign, high exponent bits) takes
few values, and its pass places four words at a time, so that a digit's counter is stored and loaded again once
per four words. Two rows are sorted side by side (Spearman's two inputs; Kendall's two rows' ``y``, then their
``x``): each middle digit's pass moves both rows' words in one loop, two independent chains of counter updates
that the processor overlaps. The functions are compiled without numba's reference counts
(:func:`torch_lwlrap._numba_runtime.borrowing_kernel`); a sort returns whether its result is in the spare array
rather than returning an array.
A float64 key is sorted with an int32 column array in eight passes, then replaced by its dense rank (the same words
follow). Tied scores keep their column order. Several times faster than ``torch.argsort`` here.
"""

from __future__ import annotations

import numpy as np

from torch_lwlrap._numba_runtime import borrowing_kernel, numba, serial_kernel
from torch_lwlrap._numba_vector import LANES

__all__ = ["DIGIT_BITS", "INSERTION_MAX", "SETTLE_BLOCK"]

#: Bits per radix digit (256 buckets): float32 keys take 4 passes, float64 keys 8 (the histograms are unrolled for
#: this width).
DIGIT_BITS = 8

#: Rows of up to this many entries are sorted by insertion instead.
INSERTION_MAX = 24

#: Words per block that the insertion sort after the radix passes checks in one vectorized read before it moves any.
SETTLE_BLOCK = 64


if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports
    from torch_lwlrap._numba_vector import lanes_exclusive_sum

    _DIGIT_MASK = np.uint64((1 << DIGIT_BITS) - 1)

    _LOW = np.uint64(0xFFFFFFFF)

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
    def _is_nan(bits, nbits):
        """Whether the float of ``bits`` is a NaN: its bits without the sign above those of infinity (an integer
        test, which no fastmath flag can drop)."""
        if nbits == 32:
            return (np.int64(bits) & np.int64(0x7FFFFFFF)) > np.int64(0x7F800000)
        return (np.int64(bits) & np.int64(0x7FFFFFFFFFFFFFFF)) > np.int64(0x7FF0000000000000)

    @borrowing_kernel
    def _has_nan(bits, start, stop, nbits):
        """Whether a float of ``bits[start:stop]`` is a NaN (:func:`_is_nan`)."""
        found = False
        for j in range(start, stop):
            found |= _is_nan(bits[j], nbits)
        return found

    @borrowing_kernel
    def _starts(count, base):
        """Each digit's first place: the histogram ``count[base : base + 256]`` (uint32) replaced by the running sum
        before each digit, a vector of counters at a time (8 times as fast as one at a time)."""
        total = np.uint32(0)
        for d in range(base, base + (1 << DIGIT_BITS), LANES):
            total = lanes_exclusive_sum(count, d, total)

    @borrowing_kernel
    def _sort(keys, cols, n, nbits, tmp_keys, tmp_cols, count):
        """Sort ``keys[:n]`` ascending, stably, moving ``cols[:n]`` along. ``count``: ``8 * 256`` uint32 entries."""
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
        moved = False  # True: the entries are in tmp_keys, tmp_cols
        for p in range(passes):
            s = np.uint64(DIGIT_BITS * p)
            base = p * radix
            if count[base + np.int64((np.uint64(keys[0]) >> s) & _DIGIT_MASK)] == n:  # one digit for all
                continue
            _starts(count, base)
            # Two calls rather than swapped array variables: the scatter loop then keeps its arrays in registers
            # (about 1.5 times faster).
            if moved:
                _scatter(tmp_keys, tmp_cols, keys, cols, n, count, base, s)
            else:
                _scatter(keys, cols, tmp_keys, tmp_cols, n, count, base, s)
            moved = not moved
        if moved:
            for j in range(n):
                keys[j], cols[j] = tmp_keys[j], tmp_cols[j]

    @borrowing_kernel
    def _scatter(src_keys, src_cols, dst_keys, dst_cols, n, count, base, s):
        """One pass of the radix sort: each entry to the next place of its digit (``count[base + digit]``)."""
        for j in range(n):
            key = src_keys[j]
            d = base + np.int64((np.uint64(key) >> s) & _DIGIT_MASK)
            at = count[d]
            dst_keys[at] = key
            dst_cols[at] = src_cols[j]
            count[d] = at + 1

    @borrowing_kernel
    def _count_key(count, key):
        """Add a 32-bit key to the histograms of its upper three digits, those :func:`_sort_packed` sorts by (as the
        caller writes its word)."""
        count[1, (key >> np.uint32(8)) & np.uint32(0xFF)] += np.uint32(1)
        count[2, (key >> np.uint32(16)) & np.uint32(0xFF)] += np.uint32(1)
        count[3, key >> np.uint32(24)] += np.uint32(1)

    @borrowing_kernel
    def _count_words(items, n, count):
        """The histograms of all four digits of the keys of the words ``items[:n]`` (``count`` zeroed here)."""
        count[:] = 0
        for j in range(n):
            key = np.uint32(items[j] >> np.uint64(32))
            count[0, key & np.uint32(0xFF)] += np.uint32(1)
            _count_key(count, key)

    @borrowing_kernel
    def _settle(items, n, budget):
        """Insertion sort of the words ``items[:n]``, nearly sorted, that gives up once its moves exceed ``budget``
        (tested after each word it places, so the words stay a permutation): whether it finished (then they are
        sorted). A block of :data:`SETTLE_BLOCK` words in order (each no less than the one before it, the block's
        first against the word before the block) is passed over after one vectorized read (:func:`_in_order`):
        most blocks of a row are."""
        moves = 0
        for start in range(1, n, SETTLE_BLOCK):
            stop = min(n, start + SETTLE_BLOCK)
            if _in_order(items, start, stop):
                continue
            for i in range(start, stop):
                item = items[i]
                if items[i - 1] <= item:
                    continue
                j = i - 1
                while j >= 0 and items[j] > item:
                    items[j + 1] = items[j]
                    j -= 1
                items[j + 1] = item
                moves += i - 1 - j
                if moves > budget:
                    return False
        return True

    @borrowing_kernel
    def _in_order(items, start, stop):
        """Whether each of the words ``items[start:stop]`` is no less than the word before it (``start >= 1``): one
        read without a branch, which LLVM vectorizes."""
        disorder = False
        for j in range(np.uint64(start), np.uint64(stop)):  # unsigned: no test for a negative index (no gathers)
            disorder |= items[j - np.uint64(1)] > items[j]
        return not disorder

    @borrowing_kernel
    def _sort_packed(items, n, tmp, count):
        """Sort ``items[:n]``, words ``key << 32 | payload``, ascending, stably by key; ``count``: the histograms of the
        keys' upper three digits (:func:`_count_key`). Returns whether the result is in ``tmp`` (else in ``items``;
        the other array then holds no meaning). Payloads never decrease in the input order, so the words end
        ascending, and any sort of the words gives the one result: three radix passes, by the upper 24 bits of the
        keys, then an insertion sort of the words (:func:`_settle`) orders the few whose keys share those bits (about
        one pair a row of 527 continuous scores: 1.2 times as fast as the fourth pass). Where that takes more than
        ``n`` moves (many scores within one band of 2**-15 of their size), all four passes sort the words again from
        there (the equal keys are still in payload order), and a row whose keys all share those bits goes to the
        four passes (three of them skipped) at once. Such rows take up to 1.75 times as long as four passes alone
        (half of a row's scores within 256 ulps of 1.0); no row of 527 gave up among scores from ``randn``, its
        sigmoid, or the softmax or sigmoid of logits as small as ``0.01 * randn``."""
        if n <= INSERTION_MAX:
            _settle(items, n, n * n)
            return False
        return _sort_packed_from(items, n, tmp, count, _shares_upper(items, n, count), 1)

    @borrowing_kernel
    def _shares_upper(items, n, count):
        """Whether all the keys of the words ``items[:n]`` share their upper 24 bits (``count``: their histograms):
        then the lowest digit's pass alone sorts them."""
        shared = True
        for p in range(1, 4):
            shared &= count[p, (items[0] >> np.uint64(32 + DIGIT_BITS * p)) & _DIGIT_MASK] == n
        return shared

    @borrowing_kernel
    def _sort_packed_from(items, n, tmp, count, shared, first):
        """:func:`_sort_packed` from its radix pass ``first`` on (the earlier passes done, ``items`` their result;
        ``shared``: :func:`_shares_upper`): whether the result is in ``tmp``."""
        in_tmp = False
        if not shared and _radix_packed(items, n, tmp, count, first):
            items, tmp, in_tmp = tmp, items, True
        if shared or not _settle(items, n, n):
            _count_words(items, n, count)
            if _radix_packed(items, n, tmp, count, 0):
                in_tmp = not in_tmp
        return in_tmp

    @borrowing_kernel
    def _sort_packed_pair(items_a, tmp_a, count_a, items_b, tmp_b, count_b, n):
        """:func:`_sort_packed` of two rows' words, each with its own arrays: ``(in_tmp_a, in_tmp_b)``. The passes
        of the two middle digits move both rows' words in one loop (:func:`_scatter_packed_pair`); the top digit's
        pass and the insertion sort then finish each row on its own."""
        if n <= INSERTION_MAX:
            return _sort_packed(items_a, n, tmp_a, count_a), _sort_packed(items_b, n, tmp_b, count_b)
        shared_a, shared_b = _shares_upper(items_a, n, count_a), _shares_upper(items_b, n, count_b)
        in_a = in_b = False
        for p in range(1, 3):
            s = np.uint64(32 + DIGIT_BITS * p)
            digits_a, digits_b = count_a[p], count_b[p]
            pass_a = not shared_a and digits_a[(items_a[0] >> s) & _DIGIT_MASK] != n  # else one digit for all
            pass_b = not shared_b and digits_b[(items_b[0] >> s) & _DIGIT_MASK] != n
            if pass_a:
                _starts(digits_a, 0)
            if pass_b:
                _starts(digits_b, 0)
            if pass_a and pass_b:
                _scatter_packed_pair(items_a, tmp_a, digits_a, items_b, tmp_b, digits_b, n, s)
            elif pass_a:
                _scatter_packed(items_a, tmp_a, n, digits_a, s)
            elif pass_b:
                _scatter_packed(items_b, tmp_b, n, digits_b, s)
            if pass_a:
                items_a, tmp_a, in_a = tmp_a, items_a, not in_a
            if pass_b:
                items_b, tmp_b, in_b = tmp_b, items_b, not in_b
        in_a ^= _sort_packed_from(items_a, n, tmp_a, count_a, shared_a, 3)
        in_b ^= _sort_packed_from(items_b, n, tmp_b, count_b, shared_b, 3)
        return in_a, in_b

    @borrowing_kernel
    def _radix_packed(items, n, tmp, count, first):
        """The radix passes ``first`` to 3 of :func:`_sort_packed` (``count[first:]`` consumed); returns whether the
        result is in ``tmp``. One word moves per entry and pass: 1.4 times as fast as :func:`_sort`."""
        moved = False  # True: the entries are in tmp
        for p in range(first, 4):
            s = np.uint64(32 + DIGIT_BITS * p)
            digits = count[p]
            if digits[(items[0] >> s) & _DIGIT_MASK] == n:  # one digit for all
                continue
            _starts(digits, 0)
            # The top digit (sign, high exponent bits) takes a few values, consecutive entries often share its counter:
            # its pass has its own loop, which loads a counter again once per four words (1.2 times as fast in all).
            if p == 3:
                if moved:
                    _scatter_packed_top(tmp, items, n, digits, s)
                else:
                    _scatter_packed_top(items, tmp, n, digits, s)
            elif moved:
                _scatter_packed(tmp, items, n, digits, s)
            else:
                _scatter_packed(items, tmp, n, digits, s)
            moved = not moved
        return moved

    @borrowing_kernel
    def _scatter_packed(src, dst, n, digits, s):
        """One pass of :func:`_sort_packed`: each word to the next place of its digit (``digits[digit]``)."""
        for j in range(n):
            item = src[j]
            d = (item >> s) & _DIGIT_MASK
            at = digits[d]
            dst[np.uint64(at)] = item
            digits[d] = at + np.uint32(1)

    @borrowing_kernel
    def _scatter_packed_pair(src_a, dst_a, digits_a, src_b, dst_b, digits_b, n, s):
        """:func:`_scatter_packed` of two rows in one loop: each row's counters a chain of loads and stores of its
        own, which the processor overlaps (1.1 times as fast as two loops; not for the top digit, whose own loop is
        faster)."""
        one = np.uint32(1)
        for j in range(n):
            word_a, word_b = src_a[j], src_b[j]
            d_a, d_b = (word_a >> s) & _DIGIT_MASK, (word_b >> s) & _DIGIT_MASK
            at_a, at_b = digits_a[d_a], digits_b[d_b]
            dst_a[np.uint64(at_a)], dst_b[np.uint64(at_b)] = word_a, word_b
            digits_a[d_a], digits_b[d_b] = at_a + one, at_b + one

    @borrowing_kernel
    def _scatter_packed_top(src, dst, n, digits, s):
        """:func:`_scatter_packed` for the top digit, which takes few values (sign, high exponent bits): four words
        at a time, each word's place its digit's counter plus the earlier words of the four with the same digit, so
        that a counter's next load waits on a store once per four words, not once per word (2.3 times as fast)."""
        one = np.uint32(1)
        end = n - n % 4
        for j in range(0, end, 4):
            w0, w1, w2, w3 = src[j], src[j + 1], src[j + 2], src[j + 3]
            d0, d1 = (w0 >> s) & _DIGIT_MASK, (w1 >> s) & _DIGIT_MASK
            d2, d3 = (w2 >> s) & _DIGIT_MASK, (w3 >> s) & _DIGIT_MASK
            at0 = digits[d0]
            at1 = digits[d1] + np.uint32(d1 == d0)
            at2 = digits[d2] + np.uint32(d2 == d0) + np.uint32(d2 == d1)
            at3 = digits[d3] + np.uint32(d3 == d0) + np.uint32(d3 == d1) + np.uint32(d3 == d2)
            dst[np.uint64(at0)], dst[np.uint64(at1)], dst[np.uint64(at2)], dst[np.uint64(at3)] = w0, w1, w2, w3
            digits[d0], digits[d1], digits[d2], digits[d3] = at0 + one, at1 + one, at2 + one, at3 + one
        _scatter_packed(src[end:], dst, n - end, digits, s)

    @borrowing_kernel
    def _sorted_words(keys, payload, n, nbits, items, spare, count, wide):
        """The words ``rank << 32 | payload[j]`` of ``keys[:n]`` sorted, stably, ``rank`` the 32-bit key or a 64-bit
        key's dense rank (sorted by :func:`_sort` first, with ``wide``: its keys, columns, their spares and its
        counts); ``payload``: None for the column ``j``; ``count``: the packed sort's histograms. Returns whether
        the words are in ``spare`` (else in ``items``)."""
        if nbits == 32:
            _packed_words(keys, payload, n, items, count)
            return _sort_packed(items, n, spare, count)
        sorted_keys, cols, tmp_keys, tmp_cols, wide_count = wide
        for j in range(n):
            sorted_keys[j], cols[j] = keys[j], j
        _sort(sorted_keys, cols, n, nbits, tmp_keys, tmp_cols, wide_count)
        rank = np.uint64(0)
        for p in range(n):
            rank += np.uint64(p > 0 and sorted_keys[p] != sorted_keys[p - 1])
            j = cols[p]
            items[p] = (rank << np.uint64(32)) | np.uint64(j if payload is None else payload[j])
        return False

    @borrowing_kernel
    def _sorted_words_pair(keys_a, keys_b, n, nbits, pair_a, pair_b, wide):
        """:func:`_sorted_words` of two rows' keys (columns as payloads), each with its own words, spare and
        histograms (``pair_a``, ``pair_b``: ``(items, spare, count)``), 32-bit keys sorted side by side
        (:func:`_sort_packed_pair`): whether each row's words are in its spare."""
        items_a, spare_a, count_a = pair_a
        items_b, spare_b, count_b = pair_b
        if nbits != 32:
            return (_sorted_words(keys_a, None, n, nbits, items_a, spare_a, count_a, wide),
                    _sorted_words(keys_b, None, n, nbits, items_b, spare_b, count_b, wide))
        _packed_words(keys_a, None, n, items_a, count_a)
        _packed_words(keys_b, None, n, items_b, count_b)
        return _sort_packed_pair(items_a, spare_a, count_a, items_b, spare_b, count_b, n)

    @borrowing_kernel
    def _packed_words(keys, payload, n, items, count):
        """The words ``key << 32 | payload[j]`` of the 32-bit keys ``keys[:n]`` (``payload`` None: the column ``j``)
        and their histograms (:func:`_count_key`)."""
        count[:] = 0
        for j in range(n):
            key = np.uint32(keys[j])
            items[j] = (np.uint64(key) << np.uint64(32)) | np.uint64(j if payload is None else payload[j])
            _count_key(count, key)

    @borrowing_kernel
    def _has_ties(items, n):
        """Whether two of the sorted words ``items[:n]`` share their key (upper half): one vectorized read."""
        tied = False
        for p in range(1, n):
            tied |= (items[p] ^ items[p - 1]) >> np.uint64(32) == 0
        return tied

