"""The vector and bit primitives of the numba kernels (:mod:`torch_lwlrap._numba_vector`) against numpy, entry by
entry: float32 and float64, starts on and off a vector's alignment, signed and unsigned starts, ties, -0.0, +-inf
and NaN; the running sum of uint32 counters against numpy's cumsum, with carries that wrap; the sorting networks
against numpy's sort; the prefetch of a row, which changes nothing and reaches the processor's instruction."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba")

from numba import njit  # noqa: E402
from numba.core import types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

from torch_lwlrap._numba_vector import (  # noqa: E402
    LANES,
    _bitonic_descending,
    _part_bounds,
    _prefetch_bytes,
    lanes_eq,
    lanes_exclusive_sum,
    lanes_ge,
    lanes_gt,
    lanes_lt,
    lanes_max,
    lanes_sort16,
    lanes_sort32,
    lanes_sort64,
    lanes_sort128,
    lanes_store_max,
    lowest_bit,
    popcount,
    prefetch_part,
    prefetch_row,
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
    return lanes_store_max(dst, at, a, a_start, b, b_start)


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


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_stored_maximum_reports_each_lane_where_either_input_is_nan(dtype):
    rng = np.random.default_rng(11)
    for trial in range(40):
        a = rng.standard_normal(2 * LANES + 3).astype(dtype)
        b = rng.standard_normal(2 * LANES + 3).astype(dtype)
        a[[11, 12]], b[[13]] = np.inf, -np.inf
        if trial:  # the first trial has none: the mask is 0
            a[rng.choice(len(a), int(rng.integers(1, 4)), replace=False)] = np.nan
            b[rng.choice(len(b), int(rng.integers(0, 4)), replace=False)] = -np.nan if trial % 2 else np.nan
        a_start, b_start = int(rng.integers(0, LANES + 4)), int(rng.integers(0, LANES + 4))
        dst = np.zeros(LANES, dtype)
        window_a, window_b = a[a_start : a_start + LANES], b[b_start : b_start + LANES]
        mask = _store_max(dst, 0, a, a_start, b, np.uint64(b_start))
        assert int(mask) == _mask(np.isnan(window_a) | np.isnan(window_b)), trial
        known = ~(np.isnan(window_a) | np.isnan(window_b))  # NaN lanes: either entry, as the select picks
        np.testing.assert_array_equal(dst[known], np.maximum(window_a, window_b)[known])


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


@njit
def _sorted_in_place(values, start, width):
    if width == 16:
        lanes_sort16(values, start)
    elif width == 32:
        lanes_sort32(values, np.uint64(start))
    elif width == 64:
        lanes_sort64(values, start)
    else:
        lanes_sort128(values, np.int32(start))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("width", [16, 32, 64, 128])
def test_the_sorting_networks_sort_highest_first_and_leave_the_rest_alone(dtype, width):
    rng = np.random.default_rng(width)
    for trial in range(120):
        kind = trial % 4
        if kind == 0:
            values = rng.standard_normal(width + 9)
        elif kind == 1:  # few levels: many ties
            values = rng.integers(0, 4, width + 9).astype(np.float64)
        elif kind == 2:  # infinities and -0.0 beside 0.0
            values = rng.standard_normal(width + 9)
            values[::5], values[1], values[2], values[3] = -np.inf, np.inf, -0.0, 0.0
        else:  # already sorted, either way
            values = np.sort(rng.standard_normal(width + 9))[:: 1 if trial % 8 == 3 else -1].copy()
        values = values.astype(dtype)
        start = trial % 9
        out = values.copy()
        _sorted_in_place(out, start, width)
        expected = values.copy()
        expected[start : start + width] = np.sort(values[start : start + width])[::-1]
        np.testing.assert_array_equal(out, expected, err_msg=f"trial {trial}, start {start}")


def test_a_sorting_network_with_nan_gives_entries_of_its_input_without_error():
    values = np.arange(32, dtype=np.float32)
    values[[3, 17]] = np.nan
    out = values.copy()
    _sorted_in_place(out, 0, 32)
    assert all(v in values or np.isnan(v) for v in out)


#: Processors the IR of the primitives is compiled for (through llvmlite's own LLVM), whatever this machine is.
TRIPLES = ["aarch64-unknown-linux-gnu", "powerpc64le-unknown-linux-gnu", "x86_64-unknown-linux-gnu"]


def _target_machine(triple):
    """llvmlite's binding module and a target machine for ``triple`` (the test is skipped where llvmlite was built
    without that target)."""
    llvm = pytest.importorskip("llvmlite.binding")
    try:
        llvm.initialize_all_targets()
        llvm.initialize_all_asmprinters()
        target = llvm.Target.from_triple(triple)
    except (RuntimeError, AttributeError) as error:  # an llvmlite built without that target
        pytest.skip(f"llvmlite cannot target {triple}: {error}")
    return llvm, target.create_target_machine(opt=3)


@pytest.mark.parametrize("triple", TRIPLES)
def test_the_sorting_network_compiles_for_other_processors(triple):
    # The network is target-independent LLVM IR: a processor without these vector widths splits them. Compiled here
    # for processors this machine is not, through llvmlite's own LLVM.
    from llvmlite import ir

    llvm, machine = _target_machine(triple)
    for element in (ir.FloatType(), ir.DoubleType()):
        for width in (16, 128):
            module = ir.Module()
            module.triple = triple
            function = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.VectorType(element, width).as_pointer()]),
                                   "sort")
            builder = ir.IRBuilder(function.append_basic_block())
            builder.store(_bitonic_descending(builder, builder.load(function.args[0])), function.args[0])
            builder.ret_void()
            parsed = llvm.parse_assembly(str(module))
            parsed.verify()
            assert machine.emit_object(parsed)


@njit
def _prefetched_sums(rows):
    """Each row's sum, every row prefetched first (the last one twice)."""
    sums = np.zeros(rows.shape[0])
    for row in range(rows.shape[0]):
        prefetch_row(rows, row)
        prefetch_row(rows, rows.shape[0] - 1)
        for j in range(rows.shape[1]):
            sums[row] += rows[row, j]
    return sums


@njit
def _part_prefetched_sums(rows, parts):
    """Each row's sum, the next row prefetched in ``parts`` parts along the way (the last row asks for itself)."""
    sums = np.zeros(rows.shape[0])
    for row in range(rows.shape[0]):
        ahead = min(row + 1, rows.shape[0] - 1)
        for j in range(rows.shape[1]):
            if j % 7 == 0:
                prefetch_part(rows, ahead, np.uint8(j // 7 % parts), parts)
            sums[row] += rows[row, j]
    return sums


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.uint32, np.uint8])
@pytest.mark.parametrize("columns", [0, 1, 15, 16, 17, 527])
def test_prefetching_a_row_changes_no_value(dtype, columns):
    rows = np.arange(7 * columns, dtype=np.int64).reshape(7, columns).astype(dtype)
    before = rows.copy()
    assert np.array_equal(_prefetched_sums(rows), rows.astype(np.float64).sum(axis=1))
    for parts in (1, 2, 3, 8):
        assert np.array_equal(_part_prefetched_sums(rows, parts), rows.astype(np.float64).sum(axis=1))
    assert np.array_equal(rows, before)


@intrinsic
def _bounds_of(typingctx, size, part, parts):
    def codegen(context, builder, signature, args):
        return context.make_tuple(builder, signature.return_type, _part_bounds(builder, *args))

    return types.UniTuple(types.int64, 2)(types.int64, types.int64, types.int64), codegen


@njit
def _bounds(size, part, parts):
    return _bounds_of(size, part, parts)


def test_the_parts_of_a_row_tile_its_bytes():
    # Part p of P: the bytes [size p // P, size (p + 1) // P): in order, without gap or overlap, as even as whole
    # bytes allow; from Python's integers.
    for size in (0, 1, 5, 63, 64, 65, 2108, 4216, 1 << 40):
        for parts in range(1, 9):
            bounds = [tuple(int(x) for x in _bounds(np.int64(size), np.int64(p), np.int64(parts)))
                      for p in range(parts)]
            assert bounds == [(size * p // parts, size * (p + 1) // parts) for p in range(parts)], (size, parts)
            assert bounds[0][0] == 0 and bounds[-1][1] == size
            assert all(size // parts <= last - first <= -(-size // parts) for first, last in bounds)


def test_prefetching_a_row_emits_the_processor_s_prefetch_instruction():
    # A hint that LLVM could drop silently: on x86-64 it must become prefetcht0, one per 64-byte line of the row.
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("the instruction's name is x86-64's")
    _prefetched_sums(np.zeros((2, 40), np.float32))
    _part_prefetched_sums(np.zeros((2, 40), np.float32), 2)
    for kernel in (_prefetched_sums, _part_prefetched_sums):
        assert "prefetcht0" in "\n".join(kernel.inspect_asm().values()), kernel


@pytest.mark.parametrize("triple", TRIPLES)
def test_the_prefetch_compiles_for_other_processors(triple):
    # LLVM's prefetch intrinsic is target-independent: each processor lowers it to its own instruction or drops it.
    from llvmlite import ir

    llvm, machine = _target_machine(triple)
    module = ir.Module()
    module.triple = triple
    bytes_ = ir.IntType(8).as_pointer()
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [bytes_, ir.IntType(64)]), "fetch")
    builder = ir.IRBuilder(function.append_basic_block())
    _prefetch_bytes(builder, *function.args)
    builder.ret_void()
    parsed = llvm.parse_assembly(str(module))
    parsed.verify()
    assert machine.emit_object(parsed)
    assembly = machine.emit_assembly(parsed)
    expected = {"aarch64": "prfm", "x86_64": "prefetcht0", "powerpc64le": "dcbt"}[triple.split("-")[0]]
    assert expected in assembly
