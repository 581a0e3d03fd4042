"""The Triton kernels compiled ahead of time to NVIDIA machine code, without a GPU: development tooling for
``tests/test_triton_compile.py`` and ``benchmarks/gpu_check.py`` (registers, spills, PTX), beside the tests and
benchmarks that use it rather than in the runtime module.

:func:`compile_for` builds the launch that :func:`torch_lwlrap._triton_kernel.ranking_sums_triton` would make for
the given inputs (the same compile-time arguments, options and argument specializations) and compiles it with
Triton's NVIDIA back end (LLVM, then its bundled ``ptxas``) for a given GPU generation. Needs Triton, not a GPU.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch
from torch import Tensor

from torch_lwlrap import _triton_kernel as kernel
from torch_lwlrap._ranking import RankingSums

_POINTER_TYPES = {
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.float32: "*fp32",
    torch.float64: "*fp64",
    torch.uint8: "*u8",
    torch.int64: "*i64",
}


class CompiledLaunch(NamedTuple):
    """A kernel compiled ahead of time by :func:`compile_for`, and what its machine code uses."""

    kernel_name: str  #: ``"_rows_kernel"`` or ``"_tiled_kernel"``
    constexprs: dict  #: the compile-time arguments, as the launch gives them
    num_warps: int
    arch: int  #: the compute capability compiled for, e.g. 90
    registers: int  #: registers per thread
    stack_bytes: int  #: bytes of stack frame per thread
    spill_stores: int  #: bytes of registers spilled to local memory per thread (0: the kernel does not spill)
    spill_loads: int  #: bytes loaded back from those spills
    ptx: str  #: the PTX assembly the machine code was built from
    cubin: bytes  #: the machine code


def compile_for(
    arch: int,
    preds: Tensor,
    positive: Tensor,
    known: Optional[Tensor] = None,
    *,
    ties: str = "max",
    block_rows: Optional[int] = None,
    max_block: Optional[int] = None,
    tile: Optional[int] = None,
    num_warps: Optional[int] = None,
    prefetch: Optional[bool] = None,
) -> CompiledLaunch:
    """Compile, without a GPU, the kernel that :func:`torch_lwlrap._triton_kernel.ranking_sums_triton` would launch for these inputs.

    The inputs may be CPU tensors: only their dtypes, shapes, strides and alignment matter (nothing is copied).
    The kernel is compiled to machine code (``cubin``) for the NVIDIA GPU of compute capability ``arch`` (90 for
    the H100 and H200, 80 for the A100) with the same compile-time arguments and argument specializations as a
    launch on a GPU (a stride of 1 is a constant; pointers and values that are multiples of 16 are marked so).
    This is how the kernels are checked to compile, and their registers and spills read, where no GPU is at hand;
    it needs Triton's NVIDIA back end (LLVM and ``ptxas``), which the Triton wheels ship.

    Args:
        arch: compute capability times ten, e.g. 90.
        preds, positive, known, ties: as for :func:`torch_lwlrap._triton_kernel.ranking_sums_triton`.
        block_rows, max_block, tile, num_warps, prefetch: tuning, as for :func:`torch_lwlrap._triton_kernel.ranking_sums_triton`.

    Returns:
        A :class:`CompiledLaunch`.
    """
    if kernel.triton is None:
        raise RuntimeError("Compiling the kernels needs Triton: `pip install triton` (the package's `gpu` extra).")
    if kernel._INTERPRETED:
        raise RuntimeError("The kernels cannot be compiled while Triton runs as an interpreter (TRITON_INTERPRET=1).")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    launch = kernel._prepare_launch(
        preds,
        positive,
        known,
        RankingSums.zeros(*preds.shape, preds.device),
        ties=ties,
        block_rows=block_rows,
        max_block=kernel.MAX_BLOCK if max_block is None else max_block,
        tile=kernel.TILE if tile is None else tile,
        num_warps=num_warps,
        num_programs=1,
        prefetch=prefetch,
    )
    if launch is None:
        raise ValueError(f"Nothing to compile for an empty batch of shape {tuple(preds.shape)}.")
    signature, constexprs, attrs = _specialization(launch)
    source = ASTSource(fn=launch.kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {"num_warps": launch.num_warps, **kernel.COMPILE_OPTIONS}
    compiled = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    return CompiledLaunch(
        launch.kernel.__name__,
        dict(launch.constexprs),
        launch.num_warps,
        arch,
        **_ptxas_report(compiled.asm["ptx"], arch),
        ptx=compiled.asm["ptx"],
        cubin=compiled.asm["cubin"],
    )


def _specialization(launch):
    """The signature, constants and attributes Triton derives from a launch's arguments, as a GPU launch would.

    The rules of Triton's launcher (and its ahead-of-time compiler): a tensor is a pointer to its dtype, marked
    divisible by 16 when its address is; an integer is ``i32`` (``i64`` beyond 32 bits), a constant when it is 1,
    marked divisible by 16 when it is; parameters declared ``do_not_specialize`` are neither.
    """
    signature, constexprs, attrs = {}, dict(launch.constexprs), {}
    for index, (param, value) in enumerate(zip(launch.kernel.params, launch.args)):
        name = param.name
        if isinstance(value, Tensor):
            signature[name] = _POINTER_TYPES[value.dtype]
            divisible = value.data_ptr() % 16 == 0
        else:
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if param.do_not_specialize:
                continue
            if value == 1:
                signature[name] = "constexpr"
                constexprs[name] = 1
                continue
            divisible = value % 16 == 0
        if divisible:
            attrs[(index,)] = [["tt.divisibility", 16]]
    signature.update({name: "constexpr" for name in launch.constexprs})
    return signature, constexprs, attrs


def _ptxas_report(ptx: str, arch: int) -> dict:
    """Registers, spills and stack of the one function in ``ptx``, as ``ptxas -v`` reports them for ``arch``."""
    import os
    import re
    import subprocess
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as folder:
        source = os.path.join(folder, "kernel.ptx")
        with open(source, "w") as file:
            file.write(ptx)
        command = [get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", source]
        report = subprocess.run(command + ["-o", source + ".o"], capture_output=True, text=True, check=True).stderr
    patterns = {
        "registers": r"Used (\d+) registers",
        "stack_bytes": r"(\d+) bytes stack frame",
        "spill_stores": r"(\d+) bytes spill stores",
        "spill_loads": r"(\d+) bytes spill loads",
    }
    found = {key: re.findall(pattern, report) for key, pattern in patterns.items()}
    if any(len(values) != 1 for values in found.values()):
        raise RuntimeError(f"Unexpected report of ptxas, expected one function:\n{report}")
    return {key: int(values[0]) for key, values in found.items()}
