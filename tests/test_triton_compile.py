"""The Triton kernels compiled ahead of time to NVIDIA machine code, without a GPU.

Triton's interpreter (``tests/test_triton.py``) checks what the kernels compute, but not that they compile: it runs
the kernel's Python on tensors and does not type-check loops, lower to PTX or assemble. Here each kernel variant a
launch can ask for is compiled by Triton's NVIDIA back end (LLVM, then its bundled ``ptxas``) for the GPUs users
run, with the argument specializations of a real launch (:func:`benchmarks.triton_aot.compile_for`), and the
kernels of the benchmarked cases must not spill registers on the H100. Nothing here runs a kernel.

Run only these tests: ``python -m pytest tests/test_triton_compile.py -q``.
"""

from __future__ import annotations

import importlib.util
import re

import pytest
import torch

from benchmarks.triton_aot import _specialization, compile_for
from torch_lwlrap import _triton_kernel as kernel
from torch_lwlrap._ranking import RankingSums

pytestmark = pytest.mark.skipif(
    kernel.triton is None
    or getattr(kernel, "_INTERPRETED", False)
    or importlib.util.find_spec("triton.backends.nvidia") is None,
    reason="needs Triton with its NVIDIA back end, not in interpreter mode",
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
H100 = 90
#: V100, T4, A100, A10/RTX 30x0, L4/RTX 40x0, H100/H200, B200, RTX 50x0
ARCHS = [70, 75, 80, 86, 89, 90, 100, 120]
ELF = b"\x7fELF"


def inputs(num_samples, num_classes, dtype=torch.float32, *, known=False):
    preds = torch.zeros(num_samples, num_classes, dtype=dtype)
    positive = torch.zeros(num_samples, num_classes, dtype=torch.bool)
    return preds, positive, (torch.ones_like(positive) if known else None)


def expected_kernel(num_samples, num_classes, **tuning):
    config = kernel.launch_config(num_samples, num_classes, max_programs=1, **tuning)
    if config.tiled:
        return "_tiled_kernel", {"TILE": config.block_cols}, config.num_warps
    sizes = {"BLOCK_R": config.block_rows, "BLOCK_C": config.block_cols, "PREFETCH": kernel.PREFETCH}
    return "_rows_kernel", sizes, config.num_warps


def check_compiled(compiled, num_samples, num_classes, ties, known, arch):
    name, sizes, num_warps = expected_kernel(num_samples, num_classes)
    assert compiled.kernel_name == name
    assert compiled.constexprs == dict(HAS_KNOWN=known, TIES_INDEX=ties == "index", **sizes)
    assert compiled.num_warps == num_warps
    assert compiled.arch == arch
    assert compiled.cubin[:4] == ELF and len(compiled.cubin) > 1000
    assert 16 <= compiled.registers <= 255


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("known", [False, True], ids=["all-known", "ignore_index"])
@pytest.mark.parametrize("num_classes", [527, 10_000], ids=["rows-527", "tiled-10000"])
def test_every_variant_compiles_for_the_h100(dtype, ties, known, num_classes):
    preds, positive, known_mask = inputs(64, num_classes, dtype, known=known)
    compiled = compile_for(H100, preds, positive, known_mask, ties=ties)
    check_compiled(compiled, 64, num_classes, ties, known, H100)


@pytest.mark.parametrize(
    "num_samples, num_classes",
    [(1, 1), (64, 1), (64, 80), (3, 2000), (64, 4096), (2, 4097), (64, 8192)],
    ids=lambda value: str(value),
)
@pytest.mark.parametrize("ties", ["max", "index"])
def test_every_tile_shape_compiles_for_the_h100(num_samples, num_classes, ties):
    preds, positive, known = inputs(num_samples, num_classes)
    compiled = compile_for(H100, preds, positive, known, ties=ties)
    check_compiled(compiled, num_samples, num_classes, ties, False, H100)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("num_classes, dtype", [(527, torch.float32), (10_000, torch.bfloat16)], ids=["rows", "tiled"])
def test_the_kernels_compile_for_every_supported_gpu(arch, num_classes, dtype):
    preds, positive, known = inputs(64, num_classes, dtype, known=True)
    compiled = compile_for(arch, preds, positive, known, ties="index")
    check_compiled(compiled, 64, num_classes, "index", True, arch)


def test_strided_inputs_compile():
    # transposed scores (column stride > 1) starting 4 bytes past a 16-byte boundary, expanded targets (row
    # stride 0) and a mask starting 1 byte past one
    preds = torch.zeros(700 * 64 + 1)[1:].view(700, 64).t()[:, :527]
    positive = torch.zeros(1, 527, dtype=torch.bool).expand(64, 527)
    known = torch.ones(64, 529, dtype=torch.bool)[:, 1:528]
    signature, constexprs, attrs = _specialization(_launch(preds, positive, known))
    assert signature["stride_pr"] == "constexpr" and constexprs["stride_pr"] == 1
    assert signature["stride_pc"] == "i32" and attrs[(11,)] == [["tt.divisibility", 16]]  # 64
    assert signature["stride_tr"] == "i32" and attrs[(12,)] == [["tt.divisibility", 16]]  # 0: an ordinary value
    assert (0,) not in attrs and (2,) not in attrs and (1,) in attrs
    compiled = compile_for(H100, preds, positive, known, ties="max")
    check_compiled(compiled, 64, 527, "max", True, H100)


@pytest.mark.parametrize(
    "num_classes, dtype",
    [(80, torch.float32), (527, torch.float32), (527, torch.float16), (527, torch.bfloat16), (10_000, torch.float32)],
    ids=str,
)
@pytest.mark.parametrize("known", [False, True], ids=["all-known", "ignore_index"])
def test_benchmarked_kernels_do_not_spill_registers_on_the_h100(num_classes, dtype, known):
    # The goal cases of the benchmark suite (C = 80, 527 and 10,000): a spill to local memory in the kernel's
    # loop would cost a trip to memory per positive.
    preds, positive, known_mask = inputs(1024, num_classes, dtype, known=known)
    compiled = compile_for(H100, preds, positive, known_mask, ties="max")
    assert (compiled.spill_stores, compiled.spill_loads, compiled.stack_bytes) == (0, 0, 0), compiled._replace(
        cubin=b"...", ptx="..."
    )


@pytest.mark.parametrize("num_classes", [1, 9, 40, 80, 200, 300, 527, 1000, 2000, 3000, 4096, 5000, 10_000])
@pytest.mark.parametrize("known", [False, True], ids=["all-known", "ignore_index"])
def test_default_tiles_do_not_spill_registers_on_the_h100(num_classes, known):
    # float32 scores and the default tie rule, at every tile shape the defaults choose. (ptxas spills a few dozen
    # bytes in some ties="index" and float64 variants, at 80 registers or more: see RESULTS.md.)
    preds, positive, known_mask = inputs(4096, num_classes, known=known)
    compiled = compile_for(H100, preds, positive, known_mask, ties="max")
    allowed = _known_spill(compiled.kernel_name, num_classes, known)
    assert (compiled.spill_stores, compiled.spill_loads) == allowed, compiled._replace(cubin=b"...", ptx="...")


def _known_spill(kernel_name, num_classes, known):
    """The spill ``(stores, loads)`` in bytes that the installed Triton is known to give a default tile on sm_90.

    Triton 3.9's compiler gives the tiled kernel (rows wider than 4096) of a width that is not a multiple of 16,
    without ignore_index, 80 registers and 32 bytes of spill stores (24 of loads); Triton 3.6 gives the same kernel
    125 registers and no spill, and so does 3.9 for widths that are multiples of 16 (measured with
    ``compile_for``; fp fusion changes nothing). Tolerated exactly: any other spill, or a larger one, fails.
    """
    version = tuple(int(part) for part in re.findall(r"\d+", kernel.triton.__version__)[:2])
    if version >= (3, 9) and kernel_name == "_tiled_kernel" and num_classes % 16 and not known:
        return (32, 24)
    return (0, 0)


@pytest.mark.parametrize("prefetch", [False, True])
def test_both_rows_kernel_variants_compile(prefetch):
    preds, positive, known = inputs(64, 527, known=True)
    compiled = compile_for(H100, preds, positive, known, ties="index", prefetch=prefetch)
    assert compiled.constexprs["PREFETCH"] is prefetch


@pytest.mark.parametrize("num_classes", [527, 10_000], ids=["rows", "tiled"])
def test_precision_is_one_correctly_rounded_division_and_no_atomics(num_classes):
    # hits / rank in float64 with IEEE rounding, as on the CPU paths: per-label precisions agree to the bit.
    # No atomics: the per-class sums are added in a fixed order, so every run on a GPU gives the same bits.
    compiled = compile_for(H100, *inputs(64, num_classes, known=True))
    assert re.findall(r"\b(?:div|rcp)\.[\w.]+", compiled.ptx) == ["div.rn.f64"]
    assert not re.findall(r"\b(?:atom|red)\.", compiled.ptx)


def test_empty_batch_has_nothing_to_compile():
    with pytest.raises(ValueError, match=r"empty batch of shape \(0, 5\)"):
        compile_for(H100, *inputs(0, 5))


def _launch(preds, positive, known, ties="max"):
    return kernel._prepare_launch(preds, positive, known, RankingSums.zeros(*preds.shape), ties=ties)


@pytest.mark.parametrize(
    "make",
    [
        lambda: inputs(64, 527),
        lambda: inputs(64, 527, torch.float16, known=True),
        lambda: inputs(1, 10_000, torch.bfloat16),
        lambda: (torch.zeros(527, 64).t(), torch.zeros(64, 527, dtype=torch.bool), None),
        lambda: (torch.zeros(64, 530)[:, 3:], torch.zeros(1, 527, dtype=torch.bool).expand(64, -1), None),
    ],
    ids=["contiguous", "float16-known", "tiled-one-row", "transposed", "offset-expanded"],
)
def test_specialization_matches_the_triton_launcher(make):
    # The signature compile_for builds must be the one Triton's own launcher derives from the same arguments
    # (read through Triton's internal binder: this test follows the installed Triton's rules).
    jit = pytest.importorskip("triton.runtime.jit")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    launch = _launch(*make())
    backend = make_backend(GPUTarget("cuda", H100, 32))
    binder = jit.create_function_from_signature(launch.kernel.signature, launch.kernel.params, backend)
    options = dict(launch.constexprs, num_warps=launch.num_warps, **kernel.COMPILE_OPTIONS)
    bound, specialization, parsed = binder(*launch.args, **options)
    _, signature, constexprs, attrs = launch.kernel._pack_args(backend, options, bound, specialization, parsed)
    names = launch.kernel.arg_names
    want_constexprs = {names[path[0]]: value for path, value in constexprs.items()}
    want_attrs = {path: value for path, value in attrs.items() if value}

    got_signature, got_constexprs, got_attrs = _specialization(launch)
    assert got_signature == signature
    assert got_constexprs == want_constexprs
    assert got_attrs == want_attrs


@pytest.mark.parametrize("capability, runs", [((6, 0), False), ((6, 1), False), ((7, 0), True), ((9, 0), True)])
def test_only_volta_and_newer_gpus_take_the_kernel(monkeypatch, capability, runs):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert kernel.is_available("cuda", torch.float32) is runs
    assert kernel.is_available("cpu") is False
