"""Vector and bit primitives for the numba kernels, written as LLVM IR (numba's ``intrinsic``).

numba leaves vector code to LLVM's loop vectorizer and keeps its SLP vectorizer off, so a loop with a small fixed
trip count (the 16 entries of a chunk) is unrolled into scalar code, each load with a check for a negative index.
These primitives load :data:`LANES` consecutive entries (the sorts: ``w``) of a contiguous 1-D float32 or float64
array as one LLVM vector and reduce it there: LLVM lowers them to the processor's vector instructions (AVX2, SSE,
NEON), the same values on any of them.

* :func:`lanes_max`: the highest of ``LANES`` entries (a tree of ``>`` and select: with a NaN among them, one of
  the entries, never an error; the callers test for NaN first or take any value).
* :func:`lanes_store_max`: ``dst[d : d + LANES]`` set to the higher of ``a[i : i + LANES]`` and
  ``b[j : j + LANES]``, entry by entry (the same select); returns the bit mask of the entries where either is NaN.
  Accumulate in a loop that keeps ``d`` fixed: LLVM then keeps the running maxima in registers (a vector load of
  what a store has just written can miss the store's forwarding where it crosses a cache line, a stall each time).
* :func:`lanes_ge`, :func:`lanes_gt`, :func:`lanes_lt`, :func:`lanes_eq`: a bit mask, bit ``i`` set when entry
  ``start + i`` is ``>=``, ``>``, ``<``, ``==`` a scalar (ordered comparisons: a NaN sets no bit).
* :func:`lanes_exclusive_sum`: ``LANES`` uint32 counters replaced by their running sum before each (a radix sort's
  first place of each digit), in ``log2(LANES)`` shifted vector additions.
* ``lanes_sort16`` to ``lanes_sort128`` (:data:`SORT_DESCENDING`): ``array[start : start + w]`` sorted in place,
  highest first, by a bitonic sorting network on one vector of ``w`` entries (shuffles, comparisons and selects; no
  branch, no loop). With a NaN among them: the entries in some order, some possibly repeated in place of others,
  never an error.
* :func:`prefetch_row`: a row of a 2-D array asked for from memory ahead of its use (LLVM's ``prefetch``), so that
  a kernel's next row arrives while it ranks the current one.
  :func:`prefetch_part`: part of such a row, to spread the requests for a row over a kernel's work.
* :func:`popcount`, :func:`lowest_bit`: the set bits of a uint64 and the index of its lowest set bit.

The entries ``start .. start + LANES - 1`` (``start + w - 1`` for a sort) must lie inside the array: the caller
reads a shorter tail one entry at a time.
"""

from __future__ import annotations

from torch_lwlrap._numba_runtime import numba

__all__ = ["LANES", "NETWORK_WIDTHS"]

#: Entries per vector primitive: 16 float32 (two AVX2 registers) or float64 values.
LANES = 16

#: The widths of the sorting networks ``lanes_sort16`` to ``lanes_sort128``.
NETWORK_WIDTHS = (16, 32, 64, 128)


if numba is not None:  # numba is an optional dependency (the "cpu" extra): without it this module only imports
    from llvmlite import ir
    from numba.core import cgutils, types
    from numba.extending import intrinsic

    _I32 = ir.IntType(32)
    _I64 = ir.IntType(64)

    def _contiguous_floats(array) -> bool:
        return (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
                and array.dtype in (types.float32, types.float64))

    def _address(context, builder, array_type, array, start_type, start, width=LANES):
        """Where ``array[start]`` lies, as a pointer to a vector of ``width`` entries."""
        data = context.make_array(array_type)(context, builder, array).data
        at = builder.gep(data, [context.cast(builder, start, start_type, types.intp)])
        return builder.bitcast(at, ir.VectorType(context.get_value_type(array_type.dtype), width).as_pointer())

    def _load(context, builder, array_type, array, start_type, start):
        """The ``LANES`` entries of ``array`` from ``start`` on, as one LLVM vector."""
        return builder.load(_address(context, builder, array_type, array, start_type, start),
                            align=array_type.dtype.bitwidth // 8)

    def _higher(builder, a, b):
        """Entry by entry, ``b`` where it is above ``a``, else ``a``."""
        return builder.select(builder.fcmp_ordered(">", b, a), b, a)

    def _splat(builder, vector_type, value):
        one = builder.insert_element(ir.Constant(vector_type, ir.Undefined), value, ir.Constant(_I32, 0))
        return builder.shuffle_vector(one, ir.Constant(vector_type, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, LANES), [0] * LANES))

    @intrinsic
    def lanes_max(typingctx, array, start):
        """The highest of ``array[start : start + LANES]``."""
        if not (_contiguous_floats(array) and isinstance(start, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            vector = _load(context, builder, signature.args[0], args[0], signature.args[1], args[1])
            width = LANES
            while width > 1:  # halve: the upper half against the lower
                width //= 2
                lanes = ir.VectorType(vector.type.element, width)
                low = builder.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined),
                                             ir.Constant(ir.VectorType(_I32, width), list(range(width))))
                high = builder.shuffle_vector(vector, ir.Constant(vector.type, ir.Undefined),
                                              ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width))))
                vector = _higher(builder, low, high)
                assert vector.type == lanes
            return builder.extract_element(vector, ir.Constant(_I32, 0))

        return array.dtype(array, start), codegen

    @intrinsic
    def lanes_store_max(typingctx, dst, dst_start, a, a_start, b, b_start):
        """``dst[dst_start + i] = max(a[a_start + i], b[b_start + i])`` for ``i < LANES``. Returns a uint64 bit mask,
        bit ``i`` set when ``a[a_start + i]`` or ``b[b_start + i]`` is NaN (one unordered comparison, which carries
        no fast-math flag: no compiler option drops it), so that a scan finds a row's NaN in the read it makes
        anyway."""
        if not (_contiguous_floats(dst) and dst == a == b
                and all(isinstance(start, types.Integer) for start in (dst_start, a_start, b_start))):
            return None

        def codegen(context, builder, signature, args):
            kinds = signature.args
            first = _load(context, builder, kinds[2], args[2], kinds[3], args[3])
            second = _load(context, builder, kinds[4], args[4], kinds[5], args[5])
            at = _address(context, builder, kinds[0], args[0], kinds[1], args[1])
            builder.store(_higher(builder, first, second), at, align=dst.dtype.bitwidth // 8)
            unordered = builder.fcmp_unordered("uno", first, second)
            return builder.zext(builder.bitcast(unordered, ir.IntType(LANES)), _I64)

        return types.uint64(dst, dst_start, a, a_start, b, b_start), codegen

    def _compare(operator: str, doc: str):
        @intrinsic
        def compare(typingctx, array, start, value):
            if not (_contiguous_floats(array) and isinstance(start, types.Integer) and isinstance(value, types.Float)):
                return None

            def codegen(context, builder, signature, args):
                vector = _load(context, builder, signature.args[0], args[0], signature.args[1], args[1])
                scalar = context.cast(builder, args[2], signature.args[2], array.dtype)
                bits = builder.fcmp_ordered(operator, vector, _splat(builder, vector.type, scalar))
                return builder.zext(builder.bitcast(bits, ir.IntType(LANES)), _I64)

            return types.uint64(array, start, value), codegen

        compare.__doc__ = doc
        return compare

    lanes_ge = _compare(">=", "Bit ``i``: ``array[start + i] >= value``.")
    lanes_gt = _compare(">", "Bit ``i``: ``array[start + i] > value``.")
    lanes_lt = _compare("<", "Bit ``i``: ``array[start + i] < value``.")
    lanes_eq = _compare("==", "Bit ``i``: ``array[start + i] == value``.")

    @intrinsic
    def lanes_exclusive_sum(typingctx, array, start, carry):
        """Replace ``array[start : start + LANES]`` (uint32) by its exclusive prefix sums plus ``carry`` (entry ``i``:
        ``carry`` and the entries before ``i``); returns ``carry`` plus all ``LANES`` entries (modulo ``2**32``)."""
        if not (isinstance(array, types.Array) and array.ndim == 1 and array.layout == "C"
                and array.dtype == types.uint32 and isinstance(start, types.Integer) and carry == types.uint32):
            return None

        def codegen(context, builder, signature, args):
            at = _address(context, builder, signature.args[0], args[0], signature.args[1], args[1])
            entries = builder.load(at, align=4)
            zero = ir.Constant(entries.type, None)
            total = entries
            shift = 1
            while shift < LANES:  # inclusive sums: add the vector moved up by 1, 2, 4, 8 lanes
                lanes = [LANES + i if i < shift else i - shift for i in range(LANES)]  # below the shift: zero's
                total = builder.add(total, builder.shuffle_vector(total, zero,
                                                                  ir.Constant(ir.VectorType(_I32, LANES), lanes)))
                shift *= 2
            base = _splat(builder, entries.type, args[2])
            builder.store(builder.add(builder.sub(total, entries), base), at, align=4)
            return builder.add(args[2], builder.extract_element(total, ir.Constant(_I32, LANES - 1)))

        return types.uint32(array, start, carry), codegen

    def _bitonic_descending(builder, vector):
        """``vector`` (an LLVM vector of ``w`` floats, ``w`` a power of 2) sorted highest first: Batcher's bitonic
        network, each of its ``log2(w) (log2(w) + 1) / 2`` steps a shuffle to the partners (``i ^ stride``), an
        ordered ``>`` and two selects (the higher and the lower of each pair), and a shuffle that gives each entry the
        one it keeps. Equal entries (``-0.0`` and ``0.0`` among them) may trade places; with a NaN among them the
        entries come out in some order, some possibly repeated in place of others."""
        width = vector.type.count
        undefined = ir.Constant(vector.type, ir.Undefined)
        size = 2
        while size <= width:  # bitonic runs of this size, merged stride by stride
            stride = size // 2
            while stride:
                partners = ir.Constant(ir.VectorType(_I32, width), [i ^ stride for i in range(width)])
                partner = builder.shuffle_vector(vector, undefined, partners)
                above = builder.fcmp_ordered(">", vector, partner)
                higher = builder.select(above, vector, partner)
                lower = builder.select(above, partner, vector)
                # The pair's first entry keeps the higher in a run that descends (size's bit clear: the last run,
                # all of them, descends), the lower in one that ascends.
                keep = [i if ((i & stride) == 0) == ((i & size) == 0) else width + i for i in range(width)]
                vector = builder.shuffle_vector(higher, lower, ir.Constant(ir.VectorType(_I32, width), keep))
                stride //= 2
            size *= 2
        return vector

    def _sorting_network(width: int):
        """The primitive that sorts ``array[start : start + width]`` in place, highest first
        (:func:`_bitonic_descending`)."""

        @intrinsic
        def sort_descending(typingctx, array, start):
            if not (_contiguous_floats(array) and isinstance(start, types.Integer)):
                return None

            def codegen(context, builder, signature, args):
                at = _address(context, builder, signature.args[0], args[0], signature.args[1], args[1], width)
                align = array.dtype.bitwidth // 8
                builder.store(_bitonic_descending(builder, builder.load(at, align=align)), at, align=align)
                return context.get_dummy_value()

            return types.none(array, start), codegen

        sort_descending.__doc__ = f"Sort ``array[start : start + {width}]`` in place, highest first (bitonic network)."
        return sort_descending

    #: The sorting networks by width: ``SORT_DESCENDING[w]`` sorts ``w`` entries (:func:`_sorting_network`).
    SORT_DESCENDING = {width: _sorting_network(width) for width in NETWORK_WIDTHS}
    lanes_sort16, lanes_sort32, lanes_sort64, lanes_sort128 = SORT_DESCENDING.values()

    #: Bytes per cache line that :func:`prefetch_row` asks for at a time (64 on x86-64 and most Arm cores).
    _LINE_BYTES = 64

    def _prefetch_bytes(builder, start, size):
        """Emit LLVM's ``prefetch`` (for reading, to every cache level) at each line of the ``size`` bytes from
        ``start`` (an ``i8*``; ``size`` an integer) and at their last byte: a range that starts within a line ends in
        the line after the last one asked for."""
        bytes_ = start.type
        fetch = builder.module.declare_intrinsic(
            "llvm.prefetch", [bytes_], ir.FunctionType(ir.VoidType(), [bytes_, _I32, _I32, _I32])
        )
        flags = [ir.Constant(_I32, value) for value in (0, 3, 1)]  # read, every cache level, data
        line = ir.Constant(size.type, _LINE_BYTES)
        lines = builder.udiv(builder.add(size, ir.Constant(size.type, _LINE_BYTES - 1)), line)
        with cgutils.for_range(builder, lines) as loop:
            builder.call(fetch, [builder.gep(start, [builder.mul(loop.index, line)]), *flags])
        with builder.if_then(builder.icmp_signed(">", size, ir.Constant(size.type, 0))):
            builder.call(fetch, [builder.gep(start, [builder.sub(size, ir.Constant(size.type, 1))]), *flags])

    def _part_bounds(builder, size, part, parts):
        """``(size * part // parts, size * (part + 1) // parts)``: the bytes of part ``part`` of ``parts`` of a row of
        ``size`` bytes (integers of one type): the parts of a row tile it."""
        one = ir.Constant(size.type, 1)
        return (builder.udiv(builder.mul(size, part), parts),
                builder.udiv(builder.mul(size, builder.add(part, one)), parts))

    def _prefetch_part(context, builder, array_type, array, indices):
        """Prefetch part ``part`` of ``parts`` of row ``row`` of ``array``; ``indices``: ``(row, part, parts)`` as
        ``intp`` values."""
        data = context.make_array(array_type)(context, builder, array)
        columns = cgutils.unpack_tuple(builder, data.shape, 2)[1]
        row, part, parts = indices
        itemsize = ir.Constant(columns.type, context.get_abi_sizeof(data.data.type.pointee))
        first, last = _part_bounds(builder, builder.mul(columns, itemsize), part, parts)
        row_start = builder.bitcast(builder.gep(data.data, [builder.mul(row, columns)]), ir.IntType(8).as_pointer())
        _prefetch_bytes(builder, builder.gep(row_start, [first]), builder.sub(last, first))

    def _rows_2d(array) -> bool:
        return isinstance(array, types.Array) and array.ndim == 2 and array.layout == "C"

    @intrinsic
    def prefetch_row(typingctx, array, row):
        """Ask the processor to bring row ``row`` of a C-contiguous 2-D array into its caches
        (:func:`_prefetch_bytes`). A hint only: it changes no value, never faults, and is dropped where the target
        has no such instruction. ``row`` must be one of the array's rows."""
        if not (_rows_2d(array) and isinstance(row, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            whole = [context.cast(builder, args[1], signature.args[1], types.intp),
                     context.get_constant(types.intp, 0), context.get_constant(types.intp, 1)]
            _prefetch_part(context, builder, signature.args[0], args[0], whole)
            return context.get_dummy_value()

        return types.none(array, row), codegen

    @intrinsic
    def prefetch_part(typingctx, array, row, part, parts):
        """:func:`prefetch_row` for part ``part`` of ``parts`` of the row only (its bytes from ``size * part //
        parts`` to ``size * (part + 1) // parts``), so that a kernel can spread its requests for a row over its
        work: a row asked for at once can fill the processor's line-fill buffers, and the next instruction then
        waits. ``0 <= part < parts``."""
        if not (_rows_2d(array) and all(isinstance(x, types.Integer) for x in (row, part, parts))):
            return None

        def codegen(context, builder, signature, args):
            indices = [context.cast(builder, value, kind, types.intp)
                       for value, kind in zip(args[1:], signature.args[1:])]
            _prefetch_part(context, builder, signature.args[0], args[0], indices)
            return context.get_dummy_value()

        return types.none(array, row, part, parts), codegen

    @intrinsic
    def popcount(typingctx, word):
        """The set bits of a uint64 (LLVM's ``ctpop``: one instruction where the processor has one)."""
        if word != types.uint64:
            return None

        def codegen(context, builder, signature, args):
            return builder.ctpop(args[0])

        return types.uint64(types.uint64), codegen

    @intrinsic
    def lowest_bit(typingctx, word):
        """The index of the lowest set bit of a nonzero uint64 (64 for 0)."""
        if word != types.uint64:
            return None

        def codegen(context, builder, signature, args):
            return builder.cttz(args[0], ir.Constant(ir.IntType(1), 0))

        return types.uint64(types.uint64), codegen

