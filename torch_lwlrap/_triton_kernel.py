"""Fused Triton kernel for the ranking engine: label precisions counted in one pass over the scores.

This is the ``"triton"`` path of :func:`torch_lwlrap._ranking.ranking_sums`; ``"auto"`` takes it for CUDA tensors
when Triton is importable (``pip install triton``, the ``gpu`` extra). It computes the same counts as the sort-free
``"count"`` path, without sorting and without any ``(N, C)`` temporary:

* Each program owns blocks of rows (a persistent grid: about as many programs as the GPU keeps resident, each
  striding over the row blocks). A block of ``BLOCK_R`` rows is read once from global memory into registers, with
  ``BLOCK_C`` the next power of two ``>= C``; the loads of a program's next block are issued before the current
  block is ranked (:data:`PREFETCH`), so two blocks per program are in flight.
* While a row has an unprocessed positive label, the lowest such column ``j`` and its score ``s_j`` are found by
  one masked minimum over a 64-bit key (the column in the high 32 bits, the float32 bits of the score in the low
  ones; float64 scores take a minimum over columns and a maximum over scores instead). Then one reduction over the
  row counts both ``rank = #{k known : s_k >= s_j}`` and ``hits = #{k positive : s_k >= s_j}`` (for
  ``ties="index"``: ``s_k > s_j``, or ``s_k == s_j`` and ``k <= j``), packed in one int32 (``rank + 65536 * hits``,
  exact for up to 16384 columns per tile). The precision ``hits / rank`` is divided in float64, as on the torch
  paths. A block of rows loops as many times as its row with the most positives: the work is ``O(P C)`` for ``P``
  positives, like the "count" path, and best when labels are sparse.
* Rows with more columns than :data:`MAX_BLOCK` are processed one at a time in tiles of :data:`TILE` columns: each
  positive of a tile is ranked by looping over every tile of its row (re-read from the L2 cache).
* Scores are compared in their own precision: float16 and bfloat16 are widened to float32 (exact, so order and ties
  are kept), float64 stays float64; ``+-inf`` rank like any other value. Targets are read as bytes (a bool tensor is
  reinterpreted, not copied). Any strides are accepted: no copy is made of non-contiguous inputs.

The label counts (per class, per sample, and known labels per sample) come from the same read of the targets.
Per-sample sums and counts are stored by the program that owns the row. Per-class sums are accumulated in
registers by each program and written to a ``(programs, C)`` float64 workspace (the tiled kernel adds each tile's
sums to the program's own workspace row, each column always from the same thread), then summed over programs by
torch: no atomics, so the result is the same on every run on the same GPU. The grid, hence the summation
order, depends on the GPU's multiprocessor count: other GPUs, or other paths, may differ in the last bits (about
1e-16 relative). The workspace holds at most ``N / 16`` rows of ``C`` float64, a small fraction of the inputs' size.

Launch parameters depend only on the shapes, so the path makes no host-device synchronization.

The kernels run on NVIDIA GPUs of compute capability 7.0 (Volta) or newer; older ones rank with the torch paths.

For development without a GPU, Triton's interpreter (``TRITON_INTERPRET=1`` in the environment before Triton is
first imported) runs the same kernels on CPU tensors; :func:`is_available` then reports CPU tensors as supported.
And ``benchmarks/triton_aot.py`` compiles, on any machine, the kernel a launch would run (:func:`_prepare_launch`,
with :data:`COMPILE_OPTIONS`) to machine code for a given GPU generation, reporting its registers and spills
(``tests/test_triton_compile.py``).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple, Optional

import torch
from torch import Tensor

from torch_lwlrap._kernel_contract import SCORE_DTYPES, check_kernel_args

#: Why Triton could not be imported (a broken or mismatched installation), or None.
_IMPORT_ERROR: Optional[str] = None
try:  # Triton is an optional dependency (the "gpu" extra)
    import triton
    import triton.language as tl
except Exception as _error:  # pragma: no cover - depends on the installation
    triton = None
    tl = None
    if not (isinstance(_error, ModuleNotFoundError) and _error.name == "triton"):
        _IMPORT_ERROR = f"{type(_error).__name__}: {_error}"

#: Device types the kernel ranks (a test seam: tests add "cpu" to simulate GPU failures on the CPU).
GPU_DEVICE_TYPES = {"cuda"}

#: Oldest GPU the kernel runs on (compute capability): the Volta generation, as for PyTorch's own Triton kernels.
MIN_CAPABILITY = (7, 0)

#: Largest ``BLOCK_C`` (power of two) ranked as one register tile per row; wider rows use the tiled kernel. (A tile
#: of 8192 scores spills registers on sm_90: ``tests/test_triton_compile.py`` checks the default tiles do not.)
MAX_BLOCK = 4096

#: Columns per tile in the tiled kernel (rows wider than :data:`MAX_BLOCK`).
TILE = 2048

#: Scores per program tile (``BLOCK_R * BLOCK_C``) aimed at for narrow rows.
TARGET_TILE_ELEMENTS = 1024

#: Scores per thread aimed at: about 100 registers per thread on sm_90, so several programs stay resident.
ELEMENTS_PER_THREAD = 8

#: At most one program per this many rows, so the class-sum workspace stays small next to the inputs.
ROWS_PER_PROGRAM_MIN = 16


#: Whether the rows kernel loads a program's next row block before ranking the current one (the default of the
#: ``prefetch`` tuning argument): two blocks in flight per program instead of one. On sm_90 it costs the default
#: tiles of 527 and 80 columns 2 and 18 registers, with no fewer programs resident. Both variants are exact;
#: ``benchmarks/gpu_check.py`` times both.
PREFETCH = True

#: Compiler options of every launch and ahead-of-time compile, stated rather than left to Triton's defaults. The
#: kernels' only floating-point arithmetic is one division per positive and sums, which no multiply-add fusion
#: touches: fusion off is what they compute either way. Stating it keeps the code independent of Triton's changing
#: default (on up to 3.9, off from 3.10) and of ``TRITON_DEFAULT_FP_FUSION``, and is what Triton 3.9 asks of code
#: that does not want its warning that the default will change.
COMPILE_OPTIONS = {"enable_fp_fusion": False}

#: The packed counts hold ``rank`` in the low 16 bits and ``hits`` above: tiles of at most this many columns.
_PACK_LIMIT = 16384


class LaunchConfig(NamedTuple):
    """How a batch is split among Triton programs."""

    tiled: bool  #: True: one row at a time in tiles of ``block_cols`` columns
    block_rows: int  #: rows per register tile (1 when tiled)
    block_cols: int  #: columns per register tile
    num_warps: int  #: warps per program
    num_programs: int  #: programs launched (persistent grid)


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def launch_config(
    num_samples: int,
    num_classes: int,
    *,
    max_programs: int,
    block_rows: Optional[int] = None,
    max_block: int = MAX_BLOCK,
    tile: int = TILE,
) -> LaunchConfig:
    """The launch parameters for a batch of ``num_samples`` rows of ``num_classes`` scores.

    Args:
        num_samples: rows ``N``.
        num_classes: columns ``C``.
        max_programs: the most programs to launch (about what the GPU keeps resident).
        block_rows: rows per tile for narrow rows; by default about :data:`TARGET_TILE_ELEMENTS` scores per tile.
        max_block: widest single tile (a power of two); wider rows use tiles of ``tile`` columns.
        tile: columns per tile for wide rows (a power of two, at most 16384).

    Returns:
        A :class:`LaunchConfig`.

    Example:
        >>> launch_config(1_000_000, 527, max_programs=2112)
        LaunchConfig(tiled=False, block_rows=1, block_cols=1024, num_warps=4, num_programs=2112)
        >>> launch_config(1_000_000, 80, max_programs=2112)
        LaunchConfig(tiled=False, block_rows=8, block_cols=128, num_warps=4, num_programs=2112)
        >>> launch_config(100_000, 10_000, max_programs=1056)
        LaunchConfig(tiled=True, block_rows=1, block_cols=2048, num_warps=8, num_programs=1056)
    """
    for name, value in (("max_block", max_block), ("tile", tile)):
        if value < 16 or value > _PACK_LIMIT or value & (value - 1):
            raise ValueError(
                f"Argument `{name}` must be a power of two between 16 and {_PACK_LIMIT}, but got {value!r}."
            )
    if block_rows is not None and (block_rows < 1 or block_rows & (block_rows - 1)):
        raise ValueError(f"Argument `block_rows` must be a power of two, but got {block_rows!r}.")
    block_cols = max(16, _next_power_of_2(num_classes))
    if block_cols > max_block:
        return LaunchConfig(True, 1, tile, _warps_for(tile), _grid_size(num_samples, num_samples, max_programs))
    if block_rows is None:
        block_rows = max(1, TARGET_TILE_ELEMENTS // block_cols)
        block_rows = min(block_rows, _next_power_of_2(max(num_samples, 1)))
    num_warps = _warps_for(block_rows * block_cols)
    blocks = -(-num_samples // block_rows)
    return LaunchConfig(False, block_rows, block_cols, num_warps, _grid_size(blocks, num_samples, max_programs))


def _warps_for(tile_elements: int) -> int:
    return max(1, min(16, tile_elements // (32 * ELEMENTS_PER_THREAD)))


def _grid_size(blocks: int, num_samples: int, max_programs: int) -> int:
    return max(1, min(blocks, max_programs, num_samples // ROWS_PER_PROGRAM_MIN))


def is_available(device, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the kernel can rank scores on ``device`` (and of ``dtype``, when given).

    True for CUDA devices of compute capability 7.0 or newer when Triton is importable (older GPUs, such as the
    P100, rank with the torch paths, as PyTorch's own Triton code requires the same); when Triton runs in
    interpreter mode (``TRITON_INTERPRET=1`` set before Triton was imported), CPU tensors instead. The supported
    score dtypes are float16, bfloat16, float32 and float64.

    Example:
        >>> import torch
        >>> is_available(torch.device("meta"))
        False
        >>> is_available("cuda", torch.float8_e4m3fn)
        False
    """
    return unavailable_reason(torch.device(device), dtype) is None


def unavailable_reason(device: torch.device, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the kernel cannot rank tensors on ``device`` (of ``dtype``, when given; None: it can), in words for a
    warning."""
    if dtype is not None and dtype not in SCORE_DTYPES:
        return f"the Triton kernel ranks floating scores, not {str(dtype).replace('torch.', '')} ones"
    if _INTERPRETED:
        return None if device.type == "cpu" else "Triton runs as an interpreter (TRITON_INTERPRET=1): CPU tensors only"
    if device.type not in GPU_DEVICE_TYPES:
        return f"the kernel ranks CUDA tensors, not {device.type} ones"
    if triton is None:
        if _IMPORT_ERROR is not None:
            return f"Triton is installed but failed to import ({_IMPORT_ERROR})"
        return "Triton is not installed"
    capability = _capability(device)
    if capability is None:
        return "no CUDA device is present"
    if tuple(capability) < MIN_CAPABILITY:
        return (
            f"the GPU's compute capability {capability[0]}.{capability[1]} is older than Volta "
            f"({MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}), which the kernel needs"
        )
    return None


def _capability(device: torch.device):
    """The compute capability of a CUDA device, or None without one (a test seam)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_capability(device)


def _max_programs(device: torch.device, num_warps: int) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        return sms * max(1, 32 // num_warps)  # about twice the programs one multiprocessor keeps resident
    return 8  # interpreter: programs run one after the other anyway


def ranking_sums_triton(
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
    block_rows: Optional[int] = None,
    max_block: int = MAX_BLOCK,
    tile: int = TILE,
    num_warps: Optional[int] = None,
    num_programs: Optional[int] = None,
    prefetch: Optional[bool] = None,
) -> None:
    """Add a batch's per-class sums to the ``class_*`` tensors and store its per-sample sums in the ``sample_*`` ones.

    The label counts come from the same read of the targets as the precisions.

    Args:
        preds: ``(N, C)`` floating scores (float16, bfloat16, float32 or float64), any strides.
        positive: ``(N, C)`` bool positive labels; a label that is not ``known`` is not positive.
        known: ``(N, C)`` bool or None; labels that are False are removed from their row's ranking.
        class_precision_sum: ``(C,)`` float64, added to: the precisions of each class's positives.
        class_label_count: ``(C,)`` int64, added to: the positives of each class.
        sample_precision_sum: ``(N,)`` contiguous float64, overwritten: the precisions of each sample's positives.
        sample_label_count: ``(N,)`` contiguous int64, overwritten: the positives of each sample.
        sample_known_count: ``(N,)`` contiguous int64, overwritten: the labels of each sample that are known.
        ties: ``"max"`` or ``"index"``.
        block_rows: rows per program tile (see :func:`launch_config`); tuning only.
        max_block: widest single tile; tuning and tests only.
        tile: columns per tile for wide rows; tuning and tests only.
        num_warps: warps per program, instead of :func:`launch_config`'s; tuning only.
        num_programs: programs launched, instead of the default persistent grid; tuning and tests only.
        prefetch: whether the rows kernel loads the next row block ahead (default :data:`PREFETCH`); tuning only.

    Example:
        The engine's ``"triton"`` path calls this function where the kernel can run, and ranks with the torch
        ``"sort"`` path elsewhere; the sums are the same:

        >>> import torch
        >>> from torch_lwlrap import _triton_kernel as kernel
        >>> from torch_lwlrap._ranking import ranking_sums, use_engine
        >>> engine, device = ("triton", "cuda") if kernel.is_available("cuda") else ("sort", "cpu")
        >>> scores = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2]], device=device)
        >>> positive = torch.tensor([[True, False, True], [False, True, True]], device=device)
        >>> with use_engine(engine):
        ...     sums = ranking_sums(scores, positive)
        >>> sums.class_precision_sum.tolist()  # column 0: 2/3 in row 0; column 1: 1/1 in row 1; column 2: 1/2 + 2/2
        [0.6666666666666666, 1.0, 1.5]
        >>> sums.sample_precision_sum.tolist()  # row 0: 2/3 + 1/2; row 1: 1/1 + 2/2
        [1.1666666666666665, 2.0]
    """
    launch = _prepare_launch(
        preds,
        positive,
        known,
        (class_precision_sum, class_label_count, sample_precision_sum, sample_label_count, sample_known_count),
        ties=ties,
        block_rows=block_rows,
        max_block=max_block,
        tile=tile,
        num_warps=num_warps,
        num_programs=num_programs,
        prefetch=prefetch,
    )
    if launch is None:
        return
    with torch.cuda.device(preds.device) if preds.device.type == "cuda" else contextlib.nullcontext():
        launch.kernel[(launch.grid,)](
            *launch.args, **launch.constexprs, num_warps=launch.num_warps, **COMPILE_OPTIONS
        )
    class_precision_sum.add_(launch.workspace.sum(0))
    class_label_count.add_(launch.count_workspace.sum(0))


class _Launch(NamedTuple):
    """One launch of a kernel: what :func:`ranking_sums_triton` runs and :func:`compile_for` compiles."""

    kernel: object  #: ``_rows_kernel`` or ``_tiled_kernel``
    grid: int  #: programs
    args: tuple  #: the kernel's run-time arguments, in order
    constexprs: dict  #: its compile-time arguments
    num_warps: int
    workspace: Tensor  #: ``(grid, C)`` float64 per-program class sums
    count_workspace: Tensor  #: ``(grid, C)`` int64 per-program label counts


def _prepare_launch(
    preds,
    positive,
    known,
    sums,
    *,
    ties,
    block_rows=None,
    max_block=MAX_BLOCK,
    tile=TILE,
    num_warps=None,
    num_programs=None,
    prefetch=None,
):
    """Check the arguments and build the launch (tuning as for :func:`ranking_sums_triton`); None for no rows."""
    if triton is None:
        raise RuntimeError("The triton engine needs Triton: `pip install triton` (the package's `gpu` extra).")
    check_kernel_args("triton", preds, positive, known, sums, ties)
    num_samples, num_classes = preds.shape
    if num_samples == 0 or num_classes == 0:
        return None
    device = preds.device
    config = launch_config(
        num_samples, num_classes, max_programs=1 << 30, block_rows=block_rows, max_block=max_block, tile=tile
    )
    if num_warps is not None:
        config = config._replace(num_warps=num_warps)
    grid = num_programs or min(config.num_programs, _max_programs(device, config.num_warps))
    targets = positive.view(torch.uint8)
    has_known = known is not None
    knowns = known.view(torch.uint8) if has_known else targets
    new_workspace = torch.zeros if config.tiled else torch.empty
    workspace = new_workspace((grid, num_classes), dtype=torch.float64, device=device)
    count_workspace = new_workspace((grid, num_classes), dtype=torch.int64, device=device)
    _, _, sample_precision_sum, sample_label_count, sample_known_count = sums
    args = (
        preds,
        targets,
        knowns,
        sample_precision_sum,
        sample_label_count,
        sample_known_count,
        workspace,
        count_workspace,
        num_samples,
        num_classes,
        preds.stride(0),
        preds.stride(1),
        targets.stride(0),
        targets.stride(1),
        knowns.stride(0),
        knowns.stride(1),
    )
    constexprs = dict(HAS_KNOWN=has_known, TIES_INDEX=ties == "index")
    if config.tiled:
        constexprs["TILE"] = config.block_cols
        return _Launch(_tiled_kernel, grid, args, constexprs, config.num_warps, workspace, count_workspace)
    constexprs.update(
        BLOCK_R=config.block_rows, BLOCK_C=config.block_cols, PREFETCH=PREFETCH if prefetch is None else prefetch
    )
    return _Launch(_rows_kernel, grid, args, constexprs, config.num_warps, workspace, count_workspace)


if triton is not None:

    @triton.jit
    def _load_block(
        preds_ptr,
        pos_ptr,
        known_ptr,
        block,
        N,
        C,
        stride_pr,
        stride_pc,
        stride_tr,
        stride_tc,
        stride_kr,
        stride_kc,
        HAS_KNOWN: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
    ):
        """Scores (float32, or float64), positive bytes and the known mask of row block ``block`` (past the end:
        nothing known)."""
        rows = block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_C)
        inside = (rows < N)[:, None] & (cols < C)[None, :]
        wide_cols = cols[None, :].to(tl.int64)  # 64-bit offsets: strides of transposed inputs can be large
        scores = tl.load(preds_ptr + rows[:, None] * stride_pr + wide_cols * stride_pc, mask=inside, other=0)
        if scores.dtype != tl.float64:
            scores = scores.to(tl.float32)  # exact for float16 and bfloat16: order and ties are kept
        positive = tl.load(pos_ptr + rows[:, None] * stride_tr + wide_cols * stride_tc, mask=inside, other=0)
        if HAS_KNOWN:
            kn = tl.load(known_ptr + rows[:, None] * stride_kr + wide_cols * stride_kc, mask=inside, other=0)
            known = inside & (kn != 0)
        else:
            known = inside
        return scores, positive, known

    @triton.jit(do_not_specialize=["N"])
    def _rows_kernel(
        preds_ptr,
        pos_ptr,
        known_ptr,
        sample_ptr,
        sample_count_ptr,
        sample_known_ptr,
        ws_ptr,
        ws_count_ptr,
        N,
        C,
        stride_pr,
        stride_pc,
        stride_tr,
        stride_tc,
        stride_kr,
        stride_kc,
        HAS_KNOWN: tl.constexpr,
        TIES_INDEX: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_C: tl.constexpr,
        PREFETCH: tl.constexpr,
    ):
        """Rows that fit one register tile: ``BLOCK_R`` rows of ``BLOCK_C >= C`` columns per step.

        With ``PREFETCH``, the loads of a program's next row block are issued before the current block is ranked,
        so that their latency overlaps the ranking (more registers, two blocks in flight per program).
        """
        pid = tl.program_id(0)
        num_programs = tl.num_programs(0)
        cols = tl.arange(0, BLOCK_C)
        col_ok = cols < C
        class_acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float64)
        count_acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.int32)
        num_blocks = tl.cdiv(N, BLOCK_R)
        block = pid
        if PREFETCH:
            next_scores, next_positive, next_known = _load_block(
                preds_ptr, pos_ptr, known_ptr, block, N, C, stride_pr, stride_pc, stride_tr, stride_tc, stride_kr,
                stride_kc, HAS_KNOWN, BLOCK_R, BLOCK_C,
            )  # fmt: skip
        while block < num_blocks:
            rows = block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
            row_ok = rows < N
            if PREFETCH:
                scores, positive, known = next_scores, next_positive, next_known
                next_scores, next_positive, next_known = _load_block(
                    preds_ptr, pos_ptr, known_ptr, block + num_programs, N, C, stride_pr, stride_pc, stride_tr,
                    stride_tc, stride_kr, stride_kc, HAS_KNOWN, BLOCK_R, BLOCK_C,
                )  # fmt: skip
            else:
                scores, positive, known = _load_block(
                    preds_ptr, pos_ptr, known_ptr, block, N, C, stride_pr, stride_pc, stride_tr, stride_tc,
                    stride_kr, stride_kc, HAS_KNOWN, BLOCK_R, BLOCK_C,
                )  # fmt: skip
            # One reduction counts both: 1 per known label ahead (rank), 65536 per positive ahead (hits).
            weight = tl.where(known, 1, 0) + tl.where(known & (positive != 0), 65536, 0)
            count_acc += weight >> 16
            row_counts = tl.sum(weight, axis=1)  # known labels in the low 16 bits, positives above
            tl.store(sample_count_ptr + rows, (row_counts >> 16).to(tl.int64), mask=row_ok)
            tl.store(sample_known_ptr + rows, (row_counts & 65535).to(tl.int64), mask=row_ok)
            num_steps = tl.max(row_counts >> 16, axis=0)
            sample_acc = tl.zeros((BLOCK_R,), dtype=tl.float64)
            last = tl.full((BLOCK_R,), -1, dtype=tl.int32)  # positives are taken in column order
            step = 0
            while step < num_steps:
                step += 1
                remaining = (weight >= 65536) & (cols[None, :] > last[:, None])
                if scores.dtype == tl.float64:
                    pick = tl.min(tl.where(remaining, cols[None, :], BLOCK_C), axis=1)
                    score = tl.max(tl.where(cols[None, :] == pick[:, None], scores, float("-inf")), axis=1)
                else:
                    # One reduction finds the lowest remaining column and its score: the key is the column in
                    # the high 32 bits and the score's bits in the low 32 bits.
                    bits = scores.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF
                    key = tl.where(remaining, (cols[None, :].to(tl.int64) << 32) | bits, BLOCK_C << 32)
                    key = tl.min(key, axis=1)
                    pick = (key >> 32).to(tl.int32)
                    score = (key & 0xFFFFFFFF).to(tl.uint32).to(tl.float32, bitcast=True)
                score = score[:, None]
                if TIES_INDEX:
                    ahead = (scores > score) | ((scores == score) & (cols[None, :] <= pick[:, None]))
                else:
                    ahead = scores >= score
                packed = tl.sum(tl.where(ahead, weight, 0), axis=1)
                rank = packed & 65535
                hits = packed >> 16
                precision = tl.where(
                    pick < BLOCK_C, hits.to(tl.float64) / tl.maximum(rank, 1).to(tl.float64), 0.0
                )
                sample_acc += precision
                class_acc += tl.where(cols[None, :] == pick[:, None], precision[:, None], 0.0)
                last = pick
            tl.store(sample_ptr + rows, sample_acc, mask=row_ok)
            block += num_programs
        tl.store(ws_ptr + pid.to(tl.int64) * C + cols, tl.sum(class_acc, axis=0), mask=col_ok)
        tl.store(ws_count_ptr + pid.to(tl.int64) * C + cols, tl.sum(count_acc, axis=0).to(tl.int64), mask=col_ok)

    @triton.jit(do_not_specialize=["N"])
    def _tiled_kernel(
        preds_ptr,
        pos_ptr,
        known_ptr,
        sample_ptr,
        sample_count_ptr,
        sample_known_ptr,
        ws_ptr,
        ws_count_ptr,
        N,
        C,
        stride_pr,
        stride_pc,
        stride_tr,
        stride_tc,
        stride_kr,
        stride_kc,
        HAS_KNOWN: tl.constexpr,
        TIES_INDEX: tl.constexpr,
        TILE: tl.constexpr,
    ):
        """Wide rows: one row at a time, in tiles of ``TILE`` columns; each positive re-reads its row's tiles."""
        pid = tl.program_id(0)
        num_programs = tl.num_programs(0)
        offsets = tl.arange(0, TILE)
        row = pid.to(tl.int64)
        while row < N:
            score_base = preds_ptr + row * stride_pr
            pos_base = pos_ptr + row * stride_tr
            known_base = known_ptr + row * stride_kr
            sample_sum = tl.full((), 0.0, dtype=tl.float64)
            sample_count = tl.full((), 0, dtype=tl.int64)
            sample_known = tl.full((), 0, dtype=tl.int64)
            start = 0
            while start < C:
                cols = start + offsets
                inside = cols < C
                wide_cols = cols.to(tl.int64)  # 64-bit offsets: strides of transposed inputs can be large
                scores = tl.load(score_base + wide_cols * stride_pc, mask=inside, other=0)
                positive = tl.load(pos_base + wide_cols * stride_tc, mask=inside, other=0) != 0
                if HAS_KNOWN:
                    tile_known = inside & (tl.load(known_base + wide_cols * stride_kc, mask=inside, other=0) != 0)
                    positive = positive & tile_known
                    sample_known += tl.sum(tile_known.to(tl.int32), axis=0)
                else:
                    sample_known += tl.sum(inside.to(tl.int32), axis=0)
                positive = inside & positive
                class_acc = tl.zeros((TILE,), dtype=tl.float64)
                num_steps = tl.sum(positive.to(tl.int32), axis=0)
                sample_count += num_steps
                last = start - 1  # positives are taken in column order
                step = 0
                while step < num_steps:
                    step += 1
                    pick = tl.min(tl.where(positive & (cols > last), cols, C), axis=0)
                    selected = cols == pick
                    score = tl.max(tl.where(selected, scores, float("-inf")), axis=0)
                    if score.dtype != tl.float64:
                        score = score.to(tl.float32)
                    rank = 0
                    hits = 0
                    other_start = 0
                    while other_start < C:
                        other_cols = other_start + offsets
                        other_inside = other_cols < C
                        other_wide = other_cols.to(tl.int64)
                        others = tl.load(score_base + other_wide * stride_pc, mask=other_inside, other=0)
                        if others.dtype != tl.float64:
                            others = others.to(tl.float32)
                        other_pos = tl.load(pos_base + other_wide * stride_tc, mask=other_inside, other=0) != 0
                        if HAS_KNOWN:
                            kn = tl.load(known_base + other_wide * stride_kc, mask=other_inside, other=0)
                            other_known = other_inside & (kn != 0)
                        else:
                            other_known = other_inside
                        weight = tl.where(other_known, 1, 0) + tl.where(other_known & other_pos, 65536, 0)
                        if TIES_INDEX:
                            ahead = (others > score) | ((others == score) & (other_cols <= pick))
                        else:
                            ahead = others >= score
                        packed = tl.sum(tl.where(ahead, weight, 0), axis=0)
                        rank += packed & 65535
                        hits += packed >> 16
                        other_start += TILE
                    precision = hits.to(tl.float64) / tl.maximum(rank, 1).to(tl.float64)
                    class_acc += tl.where(selected, precision, 0.0)
                    last = pick
                sample_sum += tl.sum(class_acc, axis=0)
                # Only this program touches its workspace row, and each column always from the same thread (the
                # same lane of the same tile layout): a plain read-modify-write, no atomics, a fixed order.
                ws_row = ws_ptr + pid.to(tl.int64) * C + cols
                tl.store(ws_row, tl.load(ws_row, mask=positive, other=0.0) + class_acc, mask=positive)
                count_row = ws_count_ptr + pid.to(tl.int64) * C + cols
                tl.store(count_row, tl.load(count_row, mask=positive, other=0) + 1, mask=positive)
                start += TILE
            tl.store(sample_ptr + row, sample_sum)
            tl.store(sample_count_ptr + row, sample_count)
            tl.store(sample_known_ptr + row, sample_known)
            row += num_programs

    _INTERPRETED = type(_rows_kernel).__name__ == "InterpretedFunction"
else:  # pragma: no cover
    _INTERPRETED = False
