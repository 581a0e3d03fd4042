"""Kendall's counts for the rank-agreement kernels (:mod:`torch_lwlrap._ltr_numba`), with numba: the discordant
pairs of two rows and their tied pairs, over the sorts of :mod:`torch_lwlrap._ltr_sort`.

Kendall's tau-b: the counts of scipy's ``kendalltau``. ``y`` is sorted first (its dense ranks and tied pairs);
``x`` is then sorted starting from ``y``'s order, so that the stable sort orders the labels by ``(x, y)`` and
carries ``y``'s dense rank along: pairs tied in ``x`` are never inversions of that sequence, pairs tied in both
are its runs of equal ranks within a group of equal ``x``, and the discordant pairs are its inversions, counted
in one read through a 4-ary trie over the ranks' 2-bit digits, whose nodes are words of four 16-bit counters
(``O(C log C)``, branch-free; a binary trie beyond 65535 labels). Sorted keys without ties (one vectorized read)
skip the tie counts: the dense ranks are the positions, their inversions (up to 1023) a bitset's popcounts, in
two halves at once (the pairs across them from a sum).
:func:`_kendall_counts_pair` counts two rows of 32-bit keys: both rows' ``y`` sorted side by side, then both rows'
``x`` (:func:`torch_lwlrap._ltr_sort._sort_packed_pair`), 1.2 times as fast as one row at a time. Every function is
compiled without numba's reference counts (:func:`torch_lwlrap._numba_runtime.borrowing_kernel`).
"""

from __future__ import annotations

import numpy as np

from torch_lwlrap._numba_runtime import borrowing_kernel, numba

__all__ = ["BITSET_MAX_RANK"]

#: Largest rank whose distinct values are counted through a bitset (16 words) and a trie over its words.
BITSET_MAX_RANK = 1023


if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports
    from torch_lwlrap._ltr_sort import (
        _LOW, _count_key, _has_ties, _sort_packed, _sort_packed_pair, _sorted_words, _sorted_words_pair,
    )
    from torch_lwlrap._numba_vector import popcount

    #: One in each 16-bit counter below ``x`` (:func:`_inversions_4ary`).
    _BELOW = np.array([0, 1, 0x10001, 0x100010001], np.uint64)

    @borrowing_kernel
    def _inversions(sequence, n, rank, distinct, bitset, nodes, ones):
        """The pairs ``p < q`` with ``sequence[p] > sequence[q]`` of ``sequence[:n]`` (words' lower halves), values
        in ``[1, rank]``: a trie over the values' digits, highest first, read once, branch-free. ``distinct``: the
        values are ``1 .. n`` (dense ranks without ties), up to :data:`BITSET_MAX_RANK` :func:`_inversions_distinct`;
        else up to 65535 values a 4-ary trie
        (:func:`_inversions_4ary`); more, a binary trie whose node ``ones[node]`` counts the values read so far
        that went on to its upper half (a value that goes to the lower half is below all of them)."""
        if distinct and rank <= BITSET_MAX_RANK:
            return _inversions_distinct(sequence, n, rank, bitset)
        levels = 0
        while (1 << levels) <= rank:
            levels += 1
        if n <= 0xFFFF:
            return _inversions_4ary(sequence, n, (levels + 1) >> 1, nodes)
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

    @borrowing_kernel
    def _inversions_distinct(sequence, n, rank, work):
        """:func:`_inversions` of the values ``1 .. n``, each once (``n`` up to :data:`BITSET_MAX_RANK`), counted in
        two halves at once: the inversions within the first half and within the rest, each with its own set of the
        values read (:func:`_add_distinct`, ``work[:32]`` and ``work[32:64]``), two independent chains of loads and
        stores that the processor overlaps (1.25 times as fast as one), and the pairs across: the first half's ``h``
        values ``v`` each have ``v - 1`` values below them, of which the rest holds all but those of the first half,
        ``sum(v) - h (h + 1) / 2`` in all."""
        words = (rank >> 6) + 1
        work[:words] = 0
        work[20:24] = 0
        work[32 : 32 + words] = 0
        work[52:56] = 0
        half = n // 2
        dis = first = root_a = root_b = np.uint64(0)
        for p in range(half):
            v = sequence[p] & _LOW
            first += v
            above_a, root_a = _add_distinct(work, np.uint64(0), root_a, v)
            above_b, root_b = _add_distinct(work, np.uint64(32), root_b, sequence[p + half] & _LOW)
            dis += above_a + above_b
        for p in range(2 * half, n):
            above_b, root_b = _add_distinct(work, np.uint64(32), root_b, sequence[p] & _LOW)
            dis += above_b
        h = np.uint64(half)
        return np.int64(dis + first - h * (h + np.uint64(1)) // np.uint64(2))

    @borrowing_kernel
    def _add_distinct(work, base, root, v):
        """Add ``v`` (up to :data:`BITSET_MAX_RANK`) to a set of distinct values: ``(the values of the set above v,
        the new root)``. A bitset (``work[base : base + 16]``) counts those in ``v``'s word (shift, popcount), a
        4-ary trie over the word index those in higher words: its root ``root`` (kept in a register by the caller)
        and its four nodes ``work[base + 20 : base + 24]``, each a word of four 16-bit counters (:data:`_BELOW`):
        two words loaded and stored per value (the bitset's and one node), not 5 as in a binary trie."""
        w = v >> np.uint64(6)
        bit = v & np.uint64(63)
        word = work[base + w]
        above = popcount(word >> bit)  # the values in this word above v (v itself is not there yet)
        work[base + w] = word | (np.uint64(1) << bit)
        x, y = w >> np.uint64(2), w & np.uint64(3)  # the word's two digits
        above += (root >> (x << np.uint64(4))) & np.uint64(0xFFFF)
        node = work[base + np.uint64(20) + x]
        above += (node >> (y << np.uint64(4))) & np.uint64(0xFFFF)
        work[base + np.uint64(20) + x] = node + _BELOW[y]
        return above, root + _BELOW[x]

    @borrowing_kernel
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

    @borrowing_kernel
    def _kendall_counts(keys_a, keys_b, n, nbits, items, spare, count, wide, perm_keys, dense, tries):
        """``(dis, xtie, ytie, ntie)`` of the keys ``[:n]`` of two rows (see the module's docstring); the arrays of
        :func:`_sorted_words`, then ``x``'s keys in ``y``'s order and ``y``'s dense ranks (a 64-bit key's way), and
        the tries of :func:`_inversions` (``bitset, nodes, ones``)."""
        if _sorted_words(keys_b, None, n, nbits, items, spare, count, wide):
            items, spare = spare, items
        y_tied, ytie, rank = _by_y(keys_a, items, n, nbits, spare, count, perm_keys, dense)
        if nbits == 32:
            if not _sort_packed(spare, n, items, count):
                items = spare
        elif _sorted_words(perm_keys, dense, n, nbits, items, spare, count, wide):
            items = spare
        dis, xtie, ntie = _discordant(items, n, rank, y_tied, tries)
        return dis, xtie, ytie, ntie

    @borrowing_kernel
    def _kendall_counts_pair(keys_a, keys_b, keys_c, keys_d, n, pair_1, pair_2, wide, perm_keys, dense, tries):
        """:func:`_kendall_counts` of two pairs of rows of 32-bit keys, ``(keys_a, keys_b)`` and ``(keys_c,
        keys_d)``, each with its own words, spare and histograms (``pair_1``, ``pair_2``): both ``y`` rows sorted
        side by side (:func:`_sorted_words_pair`), then both ``x`` rows (:func:`_sort_packed_pair`). Returns the two
        rows' counts."""
        items_1, spare_1, count_1 = pair_1
        items_2, spare_2, count_2 = pair_2
        in_spare_1, in_spare_2 = _sorted_words_pair(keys_b, keys_d, n, 32, pair_1, pair_2, wide)
        if in_spare_1:
            items_1, spare_1 = spare_1, items_1
        if in_spare_2:
            items_2, spare_2 = spare_2, items_2
        y_tied_1, ytie_1, rank_1 = _by_y(keys_a, items_1, n, 32, spare_1, count_1, perm_keys, dense)
        y_tied_2, ytie_2, rank_2 = _by_y(keys_c, items_2, n, 32, spare_2, count_2, perm_keys, dense)
        in_items_1, in_items_2 = _sort_packed_pair(spare_1, items_1, count_1, spare_2, items_2, count_2, n)
        dis_1, xtie_1, ntie_1 = _discordant(items_1 if in_items_1 else spare_1, n, rank_1, y_tied_1, tries)
        dis_2, xtie_2, ntie_2 = _discordant(items_2 if in_items_2 else spare_2, n, rank_2, y_tied_2, tries)
        return (dis_1, xtie_1, ytie_1, ntie_1), (dis_2, xtie_2, ytie_2, ntie_2)

    @borrowing_kernel
    def _by_y(keys_a, items, n, nbits, words, count, perm_keys, dense):
        """From ``y``'s sorted words ``items[:n]``: ``(y_tied, ytie, rank)``, whether two share a key, the tied pairs
        and the highest dense rank; ``x``'s keys in ``y``'s order with ``y``'s dense ranks (from 1), as words and
        their histograms in ``words``, ``count`` (32-bit keys), else in ``perm_keys``, ``dense``."""
        y_tied = _has_ties(items, n)
        ytie = rank = start = 0
        if nbits == 32:
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
        return y_tied, ytie, rank

    @borrowing_kernel
    def _discordant(items, n, rank, y_tied, tries):
        """From the words ``x key << 32 | y's dense rank`` sorted (by ``x``, then ``y``): ``(dis, xtie, ntie)``, the
        discordant pairs (:func:`_inversions`), the pairs tied in ``x`` and those tied in both."""
        xtie = ntie = group = run_start = 0
        if _has_ties(items, n):
            for p in range(n):
                changed = items[p] ^ items[p - 1] if p else ~np.uint64(0)
                group = p if changed >> np.uint64(32) != 0 else group
                run_start = p if changed != 0 else run_start
                xtie += p - group
                ntie += p - run_start
        bitset, nodes, ones = tries
        return _inversions(items, n, rank, not y_tied, bitset, nodes, ones), xtie, ntie
