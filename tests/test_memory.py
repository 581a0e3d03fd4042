"""The workspace of ``update``: bounded whatever the batch size, and small next to the inputs.

:class:`LiveBytes` follows every tensor that torch operators create while it is active and reports the peak of the
bytes they hold at once (storages shared by views counted once; the inputs and what existed before are not
counted). On the ``meta`` device this costs no memory and no time, so batches of any size can be followed: the
torch path that ranks off the CPU, and the host side of the Triton path with the grid of an H100 (its kernel's own
allocations are its two workspaces, made by torch and so counted here; the kernel allocates nothing else).

What it cannot see: scratch memory inside a single operator (a sort's buffers) and memory outside torch (numba's
arrays). The benchmark suite measures those as peak device memory and peak RSS.
"""

from __future__ import annotations

import math
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from sklearn.metrics import coverage_error as sklearn_coverage

from tests.conftest import engine_paths_for
from tests.reference import naive_lrap, naive_lwlrap
from torch_lwlrap import (
    MultilabelLRAP, MultilabelLWLRAP, MultilabelRankingMetrics, _checks, _engine_config, multilabel_coverage_error,
    multilabel_lwlrap_ci, multilabel_ndcg, multilabel_retrieval_at_k,
)
from torch_lwlrap._ranking import use_engine

META = torch.device("meta")
MiB = 1 << 20


class LiveBytes(TorchDispatchMode):
    """Peak bytes held at once by the tensors torch operators create while the mode is active."""

    def __init__(self, *existing: torch.Tensor):
        super().__init__()
        self._existing = {self._key(tensor) for tensor in existing}
        self._storages = {}  # storage -> [bytes, tensors alive that use it]
        self._tensors = set()  # ids of the tensors followed
        self.current = self.peak = 0

    @staticmethod
    def _key(tensor: torch.Tensor) -> int:
        return tensor.untyped_storage()._cdata

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                self._follow(tensor)
        self.peak = max(self.peak, self.current)
        return out

    def _follow(self, tensor: torch.Tensor) -> None:
        key = self._key(tensor)
        if key in self._existing or id(tensor) in self._tensors:
            return
        self._tensors.add(id(tensor))
        entry = self._storages.get(key)
        if entry is None:
            entry = self._storages[key] = [tensor.untyped_storage().nbytes(), 0]
            self.current += entry[0]
        entry[1] += 1
        weakref.finalize(tensor, self._release, key, id(tensor))

    def _release(self, key: int, ident: int) -> None:
        self._tensors.discard(ident)
        entry = self._storages[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self._storages[key]


def test_live_bytes_follows_allocations_and_frees():
    """The tracker itself: views share their storage, freed tensors stop counting, inputs never count."""
    existing = torch.empty(1000, device=META)
    with LiveBytes(existing) as mode:
        a = torch.empty(MiB, dtype=torch.uint8, device=META)
        view = a[: MiB // 2]  # no new storage
        b = existing * 2  # 4000 bytes
        assert mode.current == MiB + 4000
        del a, view
        c = torch.empty(2 * MiB, dtype=torch.uint8, device=META)
        assert mode.current == 2 * MiB + 4000
        existing.add_(1)  # in place on an input: nothing new
        del b, c
    assert (mode.peak, mode.current) == (2 * MiB + 4000, 0)


METRICS = {
    "lwlrap": lambda num_labels, **kw: MultilabelLWLRAP(num_labels, **kw),
    "lrap": lambda num_labels, **kw: MultilabelLRAP(num_labels, **kw),
}
# (id, target dtype, ignore_index, extra dimensions)
TARGETS = [
    ("bool", torch.bool, None, ()),
    ("int64-ignore", torch.int64, -1, ()),
    ("float32", torch.float32, None, ()),
    ("extra-dims", torch.int64, None, (4,)),
]


def _peak(name, num_samples, num_classes, target_dtype, ignore_index=None, extra=(), engine="sort", **metric_kwargs):
    """Peak bytes held by temporaries during one ``update`` of ``num_samples`` meta rows, and the inputs' bytes."""
    metric = METRICS[name](num_classes, ignore_index=ignore_index, validate_args=False, **metric_kwargs).to(META)
    shape = (num_samples, num_classes) + tuple(extra)
    preds = torch.empty(shape, device=META)
    target = torch.empty(shape, dtype=target_dtype, device=META)
    with use_engine(engine), LiveBytes(preds, target) as mode:
        metric.update(preds, target)
    return mode.peak, preds.nbytes + target.nbytes


@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.parametrize("target_id, target_dtype, ignore_index, extra", TARGETS, ids=[t[0] for t in TARGETS])
@pytest.mark.parametrize(
    "engine", ["sort", pytest.param("triton", marks=pytest.mark.fake_triton)], ids=["torch-fallback", "triton-host"]
)
def test_workspace_does_not_grow_with_the_batch(
    request, monkeypatch, name, target_id, target_dtype, ignore_index, extra, engine
):
    if engine == "triton":
        request.getfixturevalue("fake_triton")
    # A budget of 8 MiB per chunk of samples, so that both sizes span several chunks.
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 8 * MiB)
    samples = 1 << 18 if not extra else (1 << 18) // math.prod(extra)
    small, large = samples, 8 * samples
    example = torch.empty((0, 80) + tuple(extra))
    assert _checks.chunk_samples(example, example.to(target_dtype), ignore_index) < small
    peaks = {n: _peak(name, n, 80, target_dtype, ignore_index, extra, engine)[0] for n in (small, large)}
    # 8x the rows, the same workspace: at most a chunk of samples (and the torch path's chunk of scores) at a time.
    assert peaks[large] == peaks[small], peaks
    assert peaks[large] <= 2 * 8 * MiB + (128 * MiB if engine == "sort" else 0), peaks


def test_a_chunk_budget_is_kept(fake_triton, monkeypatch):
    """A smaller budget gives a smaller workspace: the chunks follow :data:`INPUT_CHUNK_BYTES`."""
    default = _peak("lrap", 1 << 22, 527, torch.int64, -1, engine="triton")[0]
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 4 * MiB)
    small = _peak("lrap", 1 << 22, 527, torch.int64, -1, engine="triton")[0]
    assert small < 10 * MiB < 60 * MiB < default, (small, default)


@pytest.mark.parametrize(
    "num_samples, num_classes",
    [(1_000_000, 527), (1_000_000, 80), (100_000, 10_000)],
    ids=["1M x 527", "1M x 80", "100k x 10000"],
)
def test_h100_goal_cases_fit_a_quarter_of_the_input(fake_triton, monkeypatch, num_samples, num_classes):
    """The benchmark's GPU cases (float32 scores, bool targets) on an H100's grid: the goal is at most 25% extra.

    With 132 multiprocessors the kernel's workspaces have ``132 * 32 / warps`` rows of ``C`` float64 sums and int64
    counts; the per-sample sums are 24 bytes a row.
    """
    from torch_lwlrap import _triton_kernel

    monkeypatch.setattr(_triton_kernel, "_max_programs", lambda device, num_warps: 132 * max(1, 32 // num_warps))
    for name in METRICS:
        peak, inputs = _peak(name, num_samples, num_classes, torch.bool, engine="triton")
        assert peak <= 0.25 * inputs, f"{name}: {peak / MiB:.0f} MiB for {inputs / MiB:.0f} MiB of inputs"
        if (num_samples, num_classes) == (1_000_000, 527):
            assert peak <= 0.03 * inputs, f"{name}: {peak / MiB:.1f} MiB"  # about 40 MiB of 2.5 GiB
    assert {launch[0] for launch in fake_triton} == {"_tiled_kernel" if num_classes > 4096 else "_rows_kernel"}


def test_torch_fallback_on_gpu_fits_a_quarter_of_the_input():
    """Without Triton a GPU ranks with the torch sort path, a chunk of about 2M scores at a time."""
    peak, inputs = _peak("lwlrap", 1_000_000, 527, torch.bool, engine="sort")
    assert peak <= 0.25 * inputs, f"{peak / MiB:.0f} MiB for {inputs / MiB:.0f} MiB of inputs"


@pytest.mark.parametrize("extra", [(), (3,)], ids=["2-d", "extra-dims"])
@pytest.mark.parametrize("target_dtype", [torch.bool, torch.int64, torch.float32], ids=str)
def test_chunked_batches_give_the_reference_values(monkeypatch, extra, target_dtype):
    """A budget of 512 bytes splits a batch of 97 samples into chunks of 1 to 8; values match the naive references."""
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 512)
    g = torch.Generator().manual_seed(11)
    shape = (97, 9) + extra
    preds = torch.randint(0, 5, shape, generator=g).float()
    target = (torch.rand(shape, generator=g) < 0.3).long()
    ignore_index = None
    if target_dtype != torch.bool:
        ignore_index = -1
        target[torch.rand(shape, generator=g) < 0.1] = -1
    target = target.to(target_dtype)
    weight = torch.rand(97, generator=g, dtype=torch.float64)
    steps = _checks.chunk_samples(preds, target, ignore_index)
    assert 1 <= steps <= 8, steps

    lwlrap = MultilabelLWLRAP(9, average="none", ignore_index=ignore_index)
    lrap = MultilabelLRAP(9, ignore_index=ignore_index)
    lwlrap.update(preds, target)
    lrap.update(preds, target, sample_weight=weight)
    p, t = preds.numpy(), target.numpy()
    torch.testing.assert_close(
        lwlrap.compute(),
        torch.tensor(naive_lwlrap(p, t, ignore_index=ignore_index, average="none"), dtype=torch.float64),
        rtol=0,
        atol=1e-12,
        equal_nan=True,
    )
    expected = naive_lrap(p, t, ignore_index=ignore_index, sample_weight=weight.numpy())
    assert lrap.compute().item() == pytest.approx(expected, abs=1e-12)


# --- CPU paths whose workspace grows with the positives or the cells, followed on real tensors ---------------------

needs_numba = pytest.mark.skipif("numba" not in engine_paths_for("cpu"), reason="needs numba (pip install numba)")


def _cpu_peak(call, *inputs):
    with LiveBytes(*inputs) as mode:
        value = call()
    return mode.peak, value


@needs_numba
@pytest.mark.parametrize("name", ["coverage_error", "retrieval", "collection"])
def test_dense_labels_are_reduced_a_block_of_positives_at_a_time(monkeypatch, name):
    # Half the labels positive: the numba pass's compact counts take 40 bytes a positive. They were joined over a
    # chunk of a million rows before their reduction (2 GB at 100,000 x 527); a block at a time they stay bounded.
    monkeypatch.setattr(_engine_config, "COMPACT_COUNTS_BLOCK_POSITIVES", 4000)
    calls = {
        "coverage_error": lambda p, t: multilabel_coverage_error(p, t),
        "retrieval": lambda p, t: multilabel_retrieval_at_k(p, t, k=(1, 5))["ap@5"],
        "collection": lambda p, t: _updated(MultilabelRankingMetrics(40), p, t)["coverage_error"],
    }
    g = torch.Generator().manual_seed(5)
    preds = torch.randint(0, 12, (16_000, 40), generator=g).float()  # ties too
    target = torch.rand(16_000, 40, generator=g) < 0.5
    peaks = {}
    with use_engine("numba"):
        for rows in (2_000, 16_000):
            p, t = preds[:rows], target[:rows]
            peaks[rows], value = _cpu_peak(lambda: calls[name](p, t), p, t)
            with use_engine("sort"):  # the torch path: dense counts, another route to the same values
                assert value.item() == pytest.approx(calls[name](p, t).item(), rel=1e-12)
    positives = int(target.sum())
    assert peaks[16_000] < 1.5 * peaks[2_000] + 64 * 16_000, peaks  # per-sample vectors aside, the same workspace
    assert peaks[16_000] < 40 * positives / 4, (peaks, positives)  # far below the joined counts
    assert multilabel_coverage_error(preds[:500], target[:500]).item() == pytest.approx(
        sklearn_coverage(target[:500].numpy(), preds[:500].double().numpy()), rel=1e-12)


def _updated(metric, preds, target):
    metric.update(preds, target)
    return metric.compute()


@needs_numba
@pytest.mark.parametrize("target_dtype", [torch.bool, torch.int64], ids=str)
def test_a_bootstrap_interval_counts_labelled_samples_without_copying_the_target(monkeypatch, target_dtype):
    # The interval's labelled samples were counted with `(target == 1).any(1)` over the whole batch: an int64 copy
    # of a bool target (8 bytes a cell) and a bool mask. A bool target now needs no temporary the size of the batch,
    # another target one chunk of INPUT_CHUNK_BYTES at a time.
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 1 * MiB)
    monkeypatch.setattr(_engine_config, "COMPACT_COUNTS_BLOCK_POSITIVES", 10_000)
    g = torch.Generator().manual_seed(6)
    preds = torch.randn(40_000, 100, generator=g)
    target = (torch.rand(40_000, 100, generator=g) < 0.03).to(target_dtype)
    target[:10] = 0  # samples without a positive label are not counted
    with use_engine("numba"):  # compact counts: the torch path's dense ones would hide the copy in their chunks
        peak, interval = _cpu_peak(lambda: multilabel_lwlrap_ci(preds, target, num_bootstrap=40, seed=1), preds, target)
    assert peak < target.numel() / 2, peak  # before: a bool mask of the batch (and an int64 copy inside `==`)
    assert interval.value.item() == pytest.approx(naive_lwlrap(preds.double().numpy(), target.numpy()), rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int64, torch.float32], ids=str)
def test_graded_relevance_is_checked_a_chunk_of_rows_at_a_time(monkeypatch, dtype):
    # The value check of `relevance` compared the whole batch at once (an integer one was also copied into floats to
    # be compared with inf): it now follows INPUT_CHUNK_BYTES, as the ranking does.
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 1 * MiB)
    g = torch.Generator().manual_seed(7)
    preds = torch.randn(32_000, 50, generator=g)
    relevance = torch.randint(0, 4, (32_000, 50), generator=g).to(dtype)
    peaks = {}
    for rows in (4_000, 32_000):
        p, r = preds[:rows], relevance[:rows]
        peaks[rows], _ = _cpu_peak(lambda: multilabel_ndcg(p, r, k=10), p, r)
    assert peaks[32_000] < 1.25 * peaks[4_000] + 16 * 32_000, peaks
    assert peaks[32_000] < relevance.numel(), peaks  # before: 4 to 5 bytes a cell
    with pytest.raises(ValueError, match="`relevance`"):  # and a bad grade in a later chunk is still found
        bad = relevance.clone()
        bad[-1, -1] = 1024 if dtype != torch.uint8 else 0
        if dtype == torch.uint8:
            bad = bad.float()
            bad[-1, -1] = math.inf
        multilabel_ndcg(preds, bad, k=10)
