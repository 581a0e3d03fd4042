"""The compiled per-row sorts of the rank-agreement kernels (:mod:`torch_lwlrap._ltr_sort`) against numpy's stable
argsort of the scores: rows whose top radix digit takes one, two or a few values (the top digit's pass places four
words at a time), every length modulo four around the insertion sort's limit, mixed signs, -0.0, +-inf, ties, and
float64 keys (their own sort, then dense ranks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from torch_lwlrap._ltr_numba import _workspace  # noqa: E402
from torch_lwlrap._ltr_sort import (  # noqa: E402
    INSERTION_MAX, SETTLE_BLOCK, _key, _settle, _sorted_words, _sorted_words_pair,
)


@njit
def _sorted(values, bits, nbits):
    n = bits.shape[0]
    keys = np.empty(n, bits.dtype)
    for j in range(n):
        keys[j] = _key(bits[j], nbits)
    wide, items, spare, count, _, _, _ = _workspace(n, bits)
    in_spare = _sorted_words(keys, None, n, nbits, items, spare, count, wide)
    return (spare if in_spare else items)[:n].copy()


@njit
def _sorted_pair(bits_a, bits_b, nbits):
    n = bits_a.shape[0]
    keys_a, keys_b = np.empty(n, bits_a.dtype), np.empty(n, bits_a.dtype)
    for j in range(n):
        keys_a[j], keys_b[j] = _key(bits_a[j], nbits), _key(bits_b[j], nbits)
    wide, items, spare, count, _, _, _ = _workspace(n, bits_a)
    pair_b = (np.empty(n, np.uint64), np.empty(n, np.uint64), np.empty_like(count))
    in_spare_a, in_spare_b = _sorted_words_pair(keys_a, keys_b, n, nbits, (items, spare, count), pair_b, wide)
    return ((spare if in_spare_a else items)[:n].copy(), (pair_b[1] if in_spare_b else pair_b[0])[:n].copy())


def _check_words(words, values, dtype, message):
    """The sorted words of ``values``: columns in numpy's stable order, keys equal exactly where values tie."""
    order = np.argsort(values + dtype(0.0), kind="stable")  # + 0.0: -0.0 ties with 0.0
    np.testing.assert_array_equal(words & 0xFFFFFFFF, order, err_msg=message)
    ranks = words >> np.uint64(32)  # the key (float32) or the dense rank (float64): equal exactly for ties
    ordered = values[order]
    tied = ordered[1:] == ordered[:-1]
    assert (ranks[1:][tied] == ranks[:-1][tied]).all() and (ranks[1:][~tied] > ranks[:-1][~tied]).all(), message


def _rows(rng, n, dtype):
    yield rng.uniform(0.5, 1.0, n)  # one top digit (the pass is skipped)
    yield rng.uniform(0.0, 1.0, n)  # two or three
    yield rng.standard_normal(n) * 3  # a few, both signs
    yield rng.integers(-3, 4, n).astype(float)  # ties, zeros
    yield rng.integers(1, 8, n).astype(float)  # float32: the lowest sorted digit's pass skipped, the next one's not
    row = rng.standard_normal(n) * 1e30
    row[rng.integers(0, n, max(1, n // 8))] = np.inf
    row[rng.integers(0, n, max(1, n // 8))] = -np.inf
    row[rng.integers(0, n, max(1, n // 8))] = -0.0
    row[rng.integers(0, n, max(1, n // 8))] = 0.0
    yield row
    yield np.where(rng.random(n) < 0.5, 2.0 ** rng.integers(-126, 127, n), -(2.0 ** rng.integers(-126, 127, n)))
    # Scores whose keys share their upper 24 bits (float32: 1 + a few ulps; float64: the lowest 8 bits of 1 and -1):
    # the three radix passes leave them to the insertion sort, which gives up, and all four passes sort again.
    uint = np.uint32 if dtype == np.float32 else np.uint64
    one, minus_one = (np.array([1.0, -1.0], dtype).view(uint) + rng.integers(0, 256, (n, 1)).astype(uint)).T
    yield np.where(rng.random(n) < 0.3, minus_one.view(dtype), one.view(dtype)).astype(float)
    yield one.view(dtype).astype(float)  # all of them: straight to the four passes
    # Pairs of neighbouring floats among continuous scores: a few words for the insertion sort to move.
    row = rng.standard_normal(n).astype(dtype)
    pairs = rng.integers(0, n, max(1, n // 16))
    row[rng.permutation(pairs)] = np.nextafter(row[pairs], dtype(np.inf))
    yield row.astype(float)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sorted_words_follow_numpys_stable_order(dtype):
    rng = np.random.default_rng(0)
    lengths = list(range(INSERTION_MAX - 2, INSERTION_MAX + 10)) + [64, 65, 66, 67, 527, 1003]
    for n in lengths:
        for case, row in enumerate(_rows(rng, n, dtype)):
            values = row.astype(dtype)
            words = _sorted(values, values.view(np.uint32 if dtype == np.float32 else np.uint64),
                            32 if dtype == np.float32 else 64)
            _check_words(words, values, dtype, f"n {n} case {case}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_rows_sorted_side_by_side_each_follow_numpys_stable_order(dtype):
    """Spearman's rows are sorted in pairs (the middle digits' passes in one loop): every pairing of the kinds of
    row above, so that one row's pass runs where the other's is skipped, one row takes the shortcut or falls back to
    the four passes while the other does not, and rows at the insertion sort's limit."""
    rng = np.random.default_rng(2)
    uint, nbits = (np.uint32, 32) if dtype == np.float32 else (np.uint64, 64)
    for n in (INSERTION_MAX, INSERTION_MAX + 1, 67, 527):
        rows = [row.astype(dtype) for row in _rows(rng, n, dtype)]
        for case_a, values_a in enumerate(rows):
            for case_b, values_b in enumerate(rows):
                words_a, words_b = _sorted_pair(values_a.view(uint), values_b.view(uint), nbits)
                _check_words(words_a, values_a, dtype, f"n {n} cases {case_a}, {case_b}: the first row")
                _check_words(words_b, values_b, dtype, f"n {n} cases {case_a}, {case_b}: the second row")


def test_the_insertion_sort_finishes_within_its_budget_or_says_it_gave_up():
    rng = np.random.default_rng(1)
    for n in (2, 5, 30, 527):
        nearly = np.sort(rng.integers(0, 1 << 60, n).astype(np.uint64))
        swaps = rng.integers(0, n - 1, max(1, n // 20))
        for i in swaps:  # neighbours swapped: one move each
            nearly[i], nearly[i + 1] = nearly[i + 1], nearly[i]
        expected = np.sort(nearly)
        items = nearly.copy()
        assert _settle(items, n, n)
        np.testing.assert_array_equal(items, expected)
        backwards = expected[::-1].copy()  # n (n - 1) / 2 moves
        items = backwards.copy()
        assert _settle(items, n, n * n) and (items == expected).all()
        items = backwards.copy()
        assert _settle(items, n, n) == (n * (n - 1) // 2 <= n)
        assert sorted(items.tolist()) == expected.tolist()  # given up or not: the same words
    # Blocks of SETTLE_BLOCK words read at once: neighbours swapped across a block's edge, a word that belongs
    # several blocks back, and the last, partial block.
    n = 5 * SETTLE_BLOCK + 7
    expected = np.sort(rng.integers(0, 1 << 60, n).astype(np.uint64))
    items = expected.copy()
    for edge in (SETTLE_BLOCK, 3 * SETTLE_BLOCK + 1):
        items[edge - 1], items[edge] = items[edge], items[edge - 1]
    items[2 * SETTLE_BLOCK + 1 : 4 * SETTLE_BLOCK + 2] = np.roll(items[2 * SETTLE_BLOCK + 1 : 4 * SETTLE_BLOCK + 2], 1)
    items[n - 2], items[n - 1] = items[n - 1], items[n - 2]
    assert _settle(items, n, n)
    np.testing.assert_array_equal(items, expected)


_REFERENCES_SCRIPT = r"""
import re, numpy as np, torch
from torch_lwlrap import _ltr_numba as L
for nbits, dtype in ((32, torch.float32), (64, torch.float64)):
    _, bits_a, nb = L._bits(torch.rand(4, 40, dtype=dtype))
    _, bits_b, _ = L._bits(torch.rand(4, 40, dtype=dtype))
    for kendall in (False, True):
        L._correlation_kernel.serial(bits_a, bits_b, nb, kendall, True, np.zeros(4), np.zeros(4, np.bool_), np.int64(0))
for code in L._correlation_kernel.serial.inspect_llvm().values():
    function = None
    for line in code.splitlines():
        found = re.match(r'define [^@]*@"?([^"(]+)', line)
        if found:
            function = found.group(1)
        elif function and re.search(r"call [^@]*@NRT_(incref|decref)", line):
            print(function)
"""


def test_a_rows_work_takes_no_reference_counts(tmp_path):
    """The functions the correlation kernel's rows call (the sorts, ranks, counts and tries) are compiled without
    numba's reference counts (``borrowing_kernel``): compiled afresh (an empty cache directory, so that numba keeps
    the code's text), only the kernel itself and its workspace's allocation take or drop a reference."""
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", _REFERENCES_SCRIPT], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    counted = {re.sub(r"B\d+v\d+B.*", "", name) for name in result.stdout.split()}
    assert counted, "no function of the kernel counted a reference: the kernel's text was not read"
    assert all(name.endswith(("_correlation_kernel_serial", "_workspace")) for name in counted), sorted(counted)


def _inversions_reference(values):
    """Pairs ``p < q`` with ``values[p] > values[q]``: for each value, those before it that are greater (a sorted
    list of the values read, Python's bisect)."""
    import bisect

    seen, count = [], 0
    for v in values:
        count += len(seen) - bisect.bisect_right(seen, v)
        bisect.insort(seen, v)
    return count


def test_inversions_count_the_pairs_in_the_wrong_order_on_every_path():
    """:func:`_inversions` against a count by bisection: permutations of ``1 .. n`` (the bitset, in two halves: odd
    and even lengths, sorted and reversed), values with ties (the 4-ary trie) and more than 65535 values (the binary
    trie)."""
    from torch_lwlrap._ltr_counts import BITSET_MAX_RANK, _inversions

    rng = np.random.default_rng(3)
    cases = []
    for n in (1, 2, 3, 4, 5, 24, 25, 526, 527, BITSET_MAX_RANK - 1, BITSET_MAX_RANK):
        permutation = rng.permutation(n) + 1
        cases += [(permutation, n, True), (np.arange(1, n + 1), n, True), (np.arange(n, 0, -1), n, True)]
    for n, rank in ((527, 40), (527, 527), (2000, 1500), (70_000, 70_000)):
        cases.append((rng.integers(1, rank + 1, n), rank, False))
    cases.append((rng.permutation(3000) + 1, 3000, True))  # distinct beyond the bitset's range: the 4-ary trie
    for values, rank, distinct in cases:
        n = len(values)
        words = (np.uint64(7) << np.uint64(32)) | values.astype(np.uint64)  # the upper halves are ignored
        tries = (np.empty(64, np.uint64), np.empty(2 * (n + 1), np.uint64), np.zeros(4 * (rank + 2), np.int32))
        got = _inversions(words, n, rank, distinct, *tries)
        assert got == _inversions_reference(values.tolist()), (n, rank, distinct)
