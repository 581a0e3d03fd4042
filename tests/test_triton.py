"""The fused Triton kernel (the "triton" engine path) against the naive formula loops and the torch "sort" path.

Where a CUDA device is present the kernel runs on it. Without one, Triton's interpreter runs the same kernels on CPU
tensors; it must be switched on (``TRITON_INTERPRET=1``) before Triton is first imported, so
:func:`test_kernels_in_the_interpreter` runs this module again in a subprocess with the variable set. The
interpreter is slow (milliseconds per operation), so the cases are small: a few dozen rows.

Run only these tests: ``python -m pytest tests/test_triton.py -q -p no:cacheprovider``.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from tests.reference import (
    check_special_row_sums,
    exact_sums,
    low_bit_cases,
    make_case,
    naive_lrap,
    naive_lwlrap,
    naive_lwlrap_per_class,
    run_kernel,
    special_rows_case,
)
from torch_lwlrap import EngineFallbackWarning, MultilabelLRAP, MultilabelLWLRAP, multilabel_lrap, multilabel_lwlrap
from torch_lwlrap import _dispatch, _ranking
from torch_lwlrap import _triton_kernel as kernel
from torch_lwlrap._ranking import ranking_sums, use_engine

HAS_TRITON = importlib.util.find_spec("triton") is not None
CUDA = torch.cuda.is_available()
#: The interpreter ranks CPU tensors; compiled kernels rank CUDA tensors.
DEVICE = "cpu" if getattr(kernel, "_INTERPRETED", False) or not CUDA else "cuda"
RUN_KERNEL = kernel.is_available(DEVICE)
#: Set by the interpreter subprocess: there, a kernel test that cannot run is an error, not a skip.
_REQUIRED = os.environ.get("TORCH_LWLRAP_REQUIRE_TRITON") == "1"

if _REQUIRED and not RUN_KERNEL:
    raise RuntimeError(
        f"The Triton kernel cannot run on {DEVICE!r} in this process (Triton importable: {HAS_TRITON}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET')!r})."
    )

needs_kernel = pytest.mark.skipif(
    not RUN_KERNEL, reason="needs Triton and a CUDA device (or Triton's interpreter: see the subprocess test)"
)

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
TOL = dict(rtol=0, atol=1e-12)


def kernel_sums(preds, target, ties, ignore_index=None, **tuning):
    """(class sums, sample sums) from the kernel, moved to the CPU; its label counts are checked on the way."""
    return run_kernel(kernel.ranking_sums_triton, preds, target, ties, ignore_index, DEVICE, **tuning)


def sort_sums(preds, target, ties, ignore_index=None):
    """(class sums, sample sums) from the torch sort path, on the CPU."""
    positive = target == 1
    known = None if ignore_index is None else target != ignore_index
    with use_engine("sort"):
        sums = ranking_sums(preds.cpu(), positive.cpu(), None if known is None else known.cpu(), ties=ties)
    return sums.class_precision_sum, sums.sample_precision_sum


def check_against_references(preds, target, ties, ignore_index=None, **tuning):
    got_class, got_sample = kernel_sums(preds, target, ties, ignore_index, **tuning)
    want_class, want_sample = exact_sums(preds, target, ties, ignore_index)
    torch.testing.assert_close(got_class, want_class, **TOL)
    torch.testing.assert_close(got_sample, want_sample, **TOL)
    sort_class, sort_sample = sort_sums(preds, target, ties, ignore_index)
    torch.testing.assert_close(got_class, sort_class, **TOL)
    torch.testing.assert_close(got_sample, sort_sample, **TOL)


# ----------------------------------------------------------------------------------------------------------------
# The kernel against the references


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
@pytest.mark.parametrize("num_classes", [1, 2, 7])
def test_random_tied_scores(dtype, ties, ignore_index, num_classes):
    seed = 1000 * num_classes + 10 * DTYPES.index(dtype) + (ties == "index") + 2 * (ignore_index is not None)
    preds, target = make_case(seed, 24, num_classes, dtype=dtype, ignore_index=ignore_index)
    check_against_references(preds, target, ties, ignore_index)


@needs_kernel
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
@pytest.mark.parametrize("prefetch", [False, True])
def test_several_row_blocks_and_wider_rows(ties, ignore_index, prefetch):
    # 33 columns: tiles of 16 rows x 64 columns, two row blocks, about 10 positives per row
    preds, target = make_case(7, 24, 33, ignore_index=ignore_index, levels=6)
    check_against_references(preds, target, ties, ignore_index, prefetch=prefetch)


@needs_kernel
@pytest.mark.parametrize("ties", ["max", "index"])
def test_scores_that_differ_only_in_low_bits(ties):
    for preds, target in low_bit_cases():
        check_against_references(preds, target, ties)


@needs_kernel
@pytest.mark.parametrize("ties", ["max", "index"])
def test_all_positive_and_no_positive_rows(ties):
    preds, target = special_rows_case()
    check_special_row_sums(kernel_sums(preds, target, ties)[1], ties)
    check_against_references(preds, target, ties)


@needs_kernel
def test_no_positive_at_all_and_empty_batch():
    preds, target = make_case(5, 9, 4)
    got_class, got_sample = kernel_sums(preds, torch.zeros_like(target), "max")
    assert torch.equal(got_class, torch.zeros(4, dtype=torch.float64))
    assert torch.equal(got_sample, torch.zeros(9, dtype=torch.float64))
    got_class, got_sample = kernel_sums(preds[:0], target[:0], "max")
    assert got_class.shape == (4,) and got_sample.shape == (0,)
    assert torch.equal(got_class, torch.zeros(4, dtype=torch.float64))


@needs_kernel
@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
def test_tiled_kernel_with_small_tiles(ties, ignore_index):
    # Rows wider than `max_block` take the tiled kernel: 40 columns in tiles of 16, so tiles 2 and 3 are ragged.
    preds, target = make_case(21, 6, 40, ignore_index=ignore_index, density=0.12, levels=5)
    target[0] = 0
    target[1, :] = 0
    target[1, 39] = 1  # a positive in the last, partial tile
    assert kernel.launch_config(6, 40, max_programs=8, max_block=16, tile=16).tiled
    check_against_references(preds, target, ties, ignore_index, max_block=16, tile=16)


@needs_kernel
@pytest.mark.parametrize("ties", ["max", "index"])
def test_tiled_kernel_wide_rows(ties):
    # C = 5000 in tiles of 1024: each positive is ranked against all five tiles of its row.
    num_classes = 5000
    g = torch.Generator().manual_seed(8)
    preds = torch.randint(0, 50, (3, num_classes), generator=g).float()
    preds[0, :100] = math.inf
    preds[2, 4000:] = -math.inf
    target = torch.zeros(3, num_classes, dtype=torch.long)
    target[0, [5, 2100, 4999]] = 1
    target[1, [0, 1024, 3072]] = 1
    target[2, [4001, 4500]] = 1
    target[1, 2000:2500] = -1  # ignored labels
    check_against_references(preds, target, ties, -1, max_block=1024, tile=1024)


@needs_kernel
def test_counts_above_one_byte():
    # Ranks up to 300: the packed counts must not wrap at 8 bits.
    g = torch.Generator().manual_seed(4)
    preds = torch.randint(0, 3, (4, 300), generator=g).double()
    target = torch.zeros(4, 300, dtype=torch.long)
    target[:, [0, 150, 299]] = 1
    target[3] = (torch.rand(300, generator=g) < 0.02).long()
    for ties in ("max", "index"):
        check_against_references(preds, target, ties)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_non_contiguous_inputs(dtype):
    preds, target = make_case(31, 16, 10, dtype=dtype, ignore_index=-1)
    # transposed storage for the scores, every other column of a wider tensor for the targets
    preds_t = preds.t().contiguous().t()
    wide = torch.zeros(16, 20, dtype=target.dtype)
    wide[:, ::2] = target
    target_strided = wide[:, ::2]
    assert not preds_t.is_contiguous() and not target_strided.is_contiguous()
    got = kernel_sums(preds_t, target_strided, "max", -1)
    want = kernel_sums(preds, target, "max", -1)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    check_against_references(preds_t, target_strided, "max", -1)


@needs_kernel
def test_tuning_parameters_do_not_change_results():
    preds, target = make_case(41, 30, 12, density=0.25)
    want_class, want_sample = exact_sums(preds, target, "max")
    for tuning in (
        dict(block_rows=1),
        dict(block_rows=4, num_warps=1),
        dict(num_programs=1),
        dict(num_programs=3),
        dict(max_block=16, tile=16, num_programs=2, num_warps=1),
        dict(prefetch=False),
        dict(prefetch=True, block_rows=2, num_programs=4),  # several blocks per program: the last prefetch is empty
        dict(prefetch=False, block_rows=2, num_programs=4),
    ):
        got_class, got_sample = kernel_sums(preds, target, "max", **tuning)
        torch.testing.assert_close(got_class, want_class, **TOL, msg=lambda m: f"{tuning}: {m}")
        torch.testing.assert_close(got_sample, want_sample, **TOL, msg=lambda m: f"{tuning}: {m}")


@needs_kernel
def test_deterministic_and_adds_to_class_sums():
    preds, target = make_case(51, 20, 9)
    first = kernel_sums(preds, target, "index")
    second = kernel_sums(preds, target, "index")
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    # The class sums are added to what the tensor holds; the sample sums are overwritten.
    class_sum = torch.arange(9, dtype=torch.float64, device=DEVICE)
    class_count = torch.arange(9, device=DEVICE)
    sample_sum = torch.full((20,), 7.0, dtype=torch.float64, device=DEVICE)
    sample_counts = torch.full((2, 20), 7, device=DEVICE)
    positive = (target == 1).to(DEVICE)
    kernel.ranking_sums_triton(
        preds.to(DEVICE), positive, None, class_sum, class_count, sample_sum, *sample_counts, ties="index"
    )
    torch.testing.assert_close(class_sum.cpu() - torch.arange(9, dtype=torch.float64), first[0], **TOL)
    assert torch.equal(class_count.cpu() - torch.arange(9), (target == 1).sum(0))
    assert torch.equal(sample_counts[0].cpu(), (target == 1).sum(1))
    assert torch.equal(sample_counts[1].cpu(), torch.full((20,), 9))
    torch.testing.assert_close(sample_sum.cpu(), first[1], **TOL)


# ----------------------------------------------------------------------------------------------------------------
# Through the public functions and metrics, with the engine forced to "triton"


@needs_kernel
@pytest.mark.parametrize("ties", ["max", "index"])
def test_public_functions_on_the_triton_engine(ties):
    preds, target = make_case(61, 20, 5, ignore_index=-1)
    preds_d, target_d = preds.to(DEVICE), target.to(DEVICE)
    with use_engine("triton"):
        for average in ("weighted", "macro"):
            got = multilabel_lwlrap(preds_d, target_d, ties=ties, ignore_index=-1, average=average).item()
            assert got == pytest.approx(naive_lwlrap(preds, target, ties, -1, average), abs=1e-12)
        per_class = multilabel_lwlrap(preds_d, target_d, ties=ties, ignore_index=-1, average="none").cpu()
        want = torch.tensor(naive_lwlrap(preds, target, ties, -1, "none"), dtype=torch.float64)
        torch.testing.assert_close(per_class, want, **TOL, equal_nan=True)
        got_lrap = multilabel_lrap(preds_d, target_d, ties=ties, ignore_index=-1).item()
        assert got_lrap == pytest.approx(naive_lrap(preds, target, ties, -1), abs=1e-12)


@needs_kernel
def test_metrics_on_the_triton_engine_with_extra_dims():
    g = torch.Generator().manual_seed(71)
    preds = torch.randint(0, 4, (4, 6, 3), generator=g).float()  # (N, C, T): 12 samples
    target = (torch.rand(4, 6, 3, generator=g) < 0.3).long()
    weights = torch.rand(4, generator=g)
    lwlrap, lrap = MultilabelLWLRAP(6), MultilabelLRAP(6)
    lwlrap.to(DEVICE)
    lrap.to(DEVICE)
    with use_engine("triton"):
        for half in (slice(0, 2), slice(2, 4)):
            lwlrap.update(preds[half].to(DEVICE), target[half].to(DEVICE))
            lrap.update(preds[half].to(DEVICE), target[half].to(DEVICE), sample_weight=weights[half].to(DEVICE))
    assert lwlrap.compute().item() == pytest.approx(naive_lwlrap(preds, target), abs=1e-12)
    per_class, weights_out, _ = naive_lwlrap_per_class(preds, target)
    got_per_class, got_weights = lwlrap.per_class()
    torch.testing.assert_close(got_per_class.cpu(), torch.tensor(per_class, dtype=torch.float64), **TOL, equal_nan=True)
    torch.testing.assert_close(got_weights.cpu(), torch.tensor(weights_out, dtype=torch.float64), **TOL)
    want_lrap = naive_lrap(preds, target, sample_weight=weights.tolist())  # (N,) weights cover the T samples
    assert lrap.compute().item() == pytest.approx(want_lrap, abs=1e-12)


# ----------------------------------------------------------------------------------------------------------------
# Dispatch, fallback, validation: these need no GPU and no interpreter


def test_engine_dispatch(monkeypatch):
    calls = []
    original = kernel.ranking_sums_triton

    def counting(*args, **kwargs):
        calls.append(args[0].device.type)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernel, "ranking_sums_triton", counting)
    preds, target = make_case(81, 8, 4)
    preds, target = preds.to(DEVICE), target.to(DEVICE)
    want = naive_lwlrap(preds.cpu(), target.cpu())
    # Where the kernel cannot run, forcing "triton" ranks on the torch sort path and says so, once.
    monkeypatch.setattr(_dispatch, "_warned", set())
    with use_engine("triton"), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, abs=1e-12)
    fallbacks = [str(w.message) for w in record if issubclass(w.category, EngineFallbackWarning)]
    assert calls == ([DEVICE] if RUN_KERNEL else [])
    if RUN_KERNEL:
        assert not fallbacks
    else:
        assert len(fallbacks) == 1 and "triton engine cannot rank cpu tensors" in fallbacks[0]
        assert "torch sort path" in fallbacks[0]
    calls.clear()
    with use_engine("auto"):
        assert multilabel_lwlrap(preds, target).item() == pytest.approx(want, abs=1e-12)
    # "auto" takes the kernel for CUDA tensors only (never the slow interpreter)
    assert calls == (["cuda"] if RUN_KERNEL and DEVICE == "cuda" else [])


def test_triton_engine_falls_back_to_sort_where_unavailable(monkeypatch):
    monkeypatch.setattr(kernel, "unavailable_reason", lambda device, dtype=None: "switched off by the test")
    monkeypatch.setattr(_dispatch, "_warned", set())
    preds, target = make_case(91, 15, 6, ignore_index=-1)
    with use_engine("triton"), pytest.warns(EngineFallbackWarning, match="Ranking with the torch sort path"):
        got = multilabel_lwlrap(preds, target, ignore_index=-1, ties="index").item()
    assert got == pytest.approx(naive_lwlrap(preds, target, "index", -1), abs=1e-12)


def test_launch_config_and_arguments():
    config = kernel.launch_config(10, 10_000, max_programs=64)
    assert config.tiled and config.block_cols == kernel.TILE and config.num_programs == 1  # 10 rows // 16 -> 1
    config = kernel.launch_config(1000, 7, max_programs=64)
    assert not config.tiled and config.block_cols == 16 and config.block_rows * 16 <= kernel.TARGET_TILE_ELEMENTS
    assert config.num_programs == min(64, 1000 // 16, -(-1000 // config.block_rows))
    with pytest.raises(ValueError, match=r"`tile` must be a power of two between 16 and 16384, but got 100"):
        kernel.launch_config(10, 10, max_programs=4, tile=100)
    with pytest.raises(ValueError, match=r"`max_block` must be a power of two .* but got 32768"):
        kernel.launch_config(10, 10, max_programs=4, max_block=32768)
    with pytest.raises(ValueError, match=r"`block_rows` must be a power of two, but got 3"):
        kernel.launch_config(10, 10, max_programs=4, block_rows=3)
    assert not kernel.is_available("cuda", torch.int32)


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
def test_kernel_argument_errors():
    # Checked before any launch: CPU tensors do for the messages.
    scores = torch.zeros(2, 3, dtype=torch.int32)
    positive = torch.zeros(2, 3, dtype=torch.bool)
    sums = (
        torch.zeros(3, dtype=torch.float64),
        torch.zeros(3, dtype=torch.int64),
        torch.zeros(2, dtype=torch.float64),
        torch.zeros(2, dtype=torch.int64),
        torch.zeros(2, dtype=torch.int64),
    )
    with pytest.raises(TypeError, match=r"float16, bfloat16, float32 or float64 scores, but got dtype torch.int32"):
        kernel.ranking_sums_triton(scores, positive, None, *sums)
    for ties in ("min", "expected"):  # "expected" is a reduction over label counts, not a kernel variant
        with pytest.raises(ValueError, match=rf"triton kernel ranks with `ties` in \('max', 'index'\), but got '{ties}'"):
            kernel.ranking_sums_triton(scores.float(), positive, None, *sums, ties=ties)
    message = r"`positive` must be a bool tensor of the shape of `preds` \(2, 3\), but got dtype torch.int64"
    with pytest.raises(ValueError, match=message):
        kernel.ranking_sums_triton(scores.float(), positive.long(), None, *sums)
    with pytest.raises(ValueError, match=r"`known` must be a bool tensor .* dtype torch.bool and shape \(2, 4\)"):
        kernel.ranking_sums_triton(scores.float(), positive, torch.ones(2, 4, dtype=torch.bool), *sums)
    with pytest.raises(
        ValueError, match=r"`sample_precision_sum` must be a contiguous float64 tensor of shape \(2,\), but got dtype "
    ):
        kernel.ranking_sums_triton(scores.float(), positive, None, sums[0], sums[1], sums[2].float(), *sums[3:])
    with pytest.raises(ValueError, match=r"`class_label_count` must be a contiguous int64 tensor of shape \(3,\)"):
        kernel.ranking_sums_triton(scores.float(), positive, None, sums[0], sums[1].int(), *sums[2:])
    strided = torch.zeros(12, dtype=torch.float64)[::2]
    with pytest.raises(ValueError, match=r"`class_precision_sum` must be .* \(3,\), but got .* and strides \(2,\)"):
        kernel.ranking_sums_triton(scores.float(), positive, None, strided, *sums[1:])


# ----------------------------------------------------------------------------------------------------------------
# Without CUDA: the kernel tests above, in Triton's interpreter


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
@pytest.mark.skipif(RUN_KERNEL, reason="the kernel tests run in this process")
def test_kernels_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", TORCH_LWLRAP_REQUIRE_TRITON="1")
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-q", "-p", "no:cacheprovider", "-x"]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"The interpreter run failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-3000:]
