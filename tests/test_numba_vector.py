"""The vector and bit primitives of the numba kernels (:mod:`torch_lwlrap._numba_vector`) against numpy, entry by
entry: float32 and float64, starts on and off a vector's alignment, signed and unsigned starts, ties, -0.0, +-inf
and NaN; the running sum of uint32 counters against numpy's cumsum, with carries that wrap."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402

from torch_lwlrap._numba_vector import (  # noqa: E402
    LANES,
    lanes_eq,
    lanes_exclusive_sum,
    lanes_ge,
    lanes_gt,
    lanes_lt,
    lanes_max,
    lanes_store_max,
    lowest_bit,
    popcount,
)


@njit
def _compared(values, start, value):
    return (lanes_ge(values, start, value), lanes_gt(values, np.uint64(start), value), lanes_lt(values, start, value),
            lanes_eq(values, np.int32(start), value))


@njit
def _highest(values, start):
    return lanes_max(values, start)


@njit
def _store_max(dst, at, a, a_start, b, b_start):
    lanes_store_max(dst, at, a, a_start, b, b_start)


@njit
def _running_sum(counts, start, carry):
    return lanes_exclusive_sum(counts, start, carry)


@njit
def _bits(word):
    return popcount(word), lowest_bit(word)


def _mask(flags):
    return sum(1 << i for i, flag in enumerate(flags) if flag)


def _rows(dtype):
    rng = np.random.default_rng(7)
    values = rng.standard_normal(3 * LANES + 5).astype(dtype)
    values[[3, 9, 20]] = values[5]  # ties
    values[[11, 30]] = np.inf, -np.inf
    values[[12, 13]] = 0.0, -0.0
    return values


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_comparison_masks_equal_numpy_at_every_start(dtype):
    values = _rows(dtype)
    for start in range(len(values) - LANES + 1):
        window = values[start : start + LANES]
        for value in [values[5], values[start], 0.0, -0.0, np.inf, -np.inf, 1e-30, np.nan]:
            value = dtype(value)
            expected = (_mask(window >= value), _mask(window > value), _mask(window < value), _mask(window == value))
            assert _compared(values, start, value) == expected, (start, value)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_nan_entry_sets_no_bit_and_the_maximum_stays_one_of_the_entries(dtype):
    values = _rows(dtype)
    values[LANES + 2] = np.nan
    masks = _compared(values, LANES, dtype(0.0))
    assert all(not (mask >> 2) & 1 for mask in masks)
    assert _highest(values, LANES) in values[LANES : 2 * LANES]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maxima_equal_numpy(dtype):
    values = _rows(dtype)
    for start in range(len(values) - LANES + 1):
        assert _highest(values, start) == values[start : start + LANES].max(), start
    dst = np.full(2 * LANES + 3, -1.0, dtype)
    _store_max(dst, 3, values, 1, values, LANES + 4)
    expected = np.full(2 * LANES + 3, -1.0, dtype)
    expected[3 : 3 + LANES] = np.maximum(values[1 : 1 + LANES], values[LANES + 4 : 2 * LANES + 4])
    np.testing.assert_array_equal(dst, expected)
    before = dst.copy()
    _store_max(dst, 3, dst, 3, values, 0)  # accumulate in place
    expected[3 : 3 + LANES] = np.maximum(before[3 : 3 + LANES], values[:LANES])
    np.testing.assert_array_equal(dst, expected)


def test_popcount_and_lowest_bit():
    for word in [1, 2, 3, 0b1011000, 1 << 63, (1 << 64) - 1, 0x8000_0000_0000_0001]:
        assert _bits(np.uint64(word)) == (bin(word).count("1"), (word & -word).bit_length() - 1), word
    assert _bits(np.uint64(0)) == (0, 64)


def test_the_running_sum_before_each_counter_equals_numpy_and_leaves_the_rest_alone():
    rng = np.random.default_rng(3)
    for trial in range(60):
        high = 1 << 32 if trial % 3 == 0 else 600  # counters near 2**32: the sums wrap as uint32 arithmetic does
        counts = rng.integers(0, high, 2 * LANES + 7, dtype=np.uint64).astype(np.uint32)
        start = int(rng.integers(0, LANES + 8))
        carry = np.uint32(rng.integers(0, high))
        window = counts[start : start + LANES].astype(np.uint64)
        expected = counts.copy()
        expected[start : start + LANES] = (int(carry) + np.concatenate([[0], np.cumsum(window)[:-1]])) % (1 << 32)
        total = _running_sum(counts, np.uint64(start) if trial % 2 else start, carry)
        np.testing.assert_array_equal(counts, expected, err_msg=f"start {start}")
        assert int(total) == (int(carry) + int(window.sum())) % (1 << 32)
