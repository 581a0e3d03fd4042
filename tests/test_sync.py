"""Host-device synchronization of ``update``: none with ``validate_args=False``, exactly one with value checks.

A GPU says directly when the host waits for it (``torch.cuda.set_sync_debug_mode``): the CUDA tests below count
those waits. Without a GPU the same property is checked on the ``meta`` device, whose tensors have shapes but no
values: any call that needs a value on the host (``.item()``, ``bool(tensor)``, ``nonzero``, a copy to the CPU, a
boolean mask) either fails there or, for scalar reads, is counted by :class:`HostReads` and answered "no problem
found". The torch path that ranks off the CPU and the host code around the Triton kernel's launch are the code
that runs on a GPU, so a read on ``meta`` is a sync on CUDA.
"""

from __future__ import annotations

import warnings
from typing import Optional

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.reference import naive_lrap, naive_lwlrap
from torch_lwlrap import MultilabelLRAP, MultilabelLWLRAP, MultilabelTieReport
from torch_lwlrap._ranking import use_engine

aten = torch.ops.aten
META = torch.device("meta")
NUM_LABELS = 7
IGNORE = -1

#: Operators whose output needs the input's values on the host: each one is a host-device sync on a GPU.
HOST_READS = {
    aten._local_scalar_dense.default,  # .item(), bool(t), int(t), float(t), `if t:`
    aten.nonzero.default,
    aten.masked_select.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten._unique2.default,
    aten.unique_consecutive.default,
    aten.unique_dim.default,
    aten.repeat_interleave.Tensor,
}


class HostReads(TorchDispatchMode):
    """Records every operator that reads values on the host; scalar reads are answered with 0 (False).

    Also records tensors made from host data on another device (``torch.tensor(x, device=...)``): a copy from
    pageable host memory, which waits for the device. Such copies bypass dispatch modes, so ``torch.tensor`` and
    ``torch.as_tensor`` are wrapped while the mode is active.
    """

    def __init__(self):
        super().__init__()
        self.reads = []
        self._saved = {}

    def __enter__(self):
        for name in ("tensor", "as_tensor"):
            original = self._saved[name] = getattr(torch, name)
            setattr(torch, name, self._recording(name, original))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._saved.items():
            setattr(torch, name, original)
        return super().__exit__(*exc)

    def _recording(self, name, original):
        def made_from_host_data(data, *args, **kwargs):
            result = original(data, *args, **kwargs)
            if result.device.type != "cpu" and not (isinstance(data, torch.Tensor) and data.device == result.device):
                self.reads.append(f"torch.{name} on {result.device}")
            return result

        return made_from_host_data

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_READS:
            self.reads.append(str(func))
            if func is aten._local_scalar_dense.default:
                return False  # the value checks ask "is anything wrong?": no
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default):
            if any(index is not None and index.dtype == torch.bool for index in args[1]):
                self.reads.append(f"{func} with a boolean mask")  # its kernel calls nonzero
        elif func in (aten._to_copy.default, aten.copy_.default):
            source = args[0] if func is aten._to_copy.default else args[1]
            target = kwargs.get("device") if func is aten._to_copy.default else args[0].device
            if isinstance(source, torch.Tensor) and target is not None and torch.device(target) != source.device:
                self.reads.append(f"{func} {source.device} -> {target}")
        return func(*args, **kwargs)


# (id, metric factory, update keyword arguments maker); the targets below follow each metric's ignore_index
METRICS = {
    "lwlrap": lambda **kw: MultilabelLWLRAP(NUM_LABELS, **kw),
    "lwlrap-none": lambda **kw: MultilabelLWLRAP(NUM_LABELS, average="none", **kw),
    "lwlrap-macro": lambda **kw: MultilabelLWLRAP(NUM_LABELS, average="macro", **kw),
    "lrap": lambda **kw: MultilabelLRAP(NUM_LABELS, **kw),
    "lrap-weighted": lambda **kw: MultilabelLRAP(NUM_LABELS, **kw),
    "tie-report": lambda ties="max", **kw: MultilabelTieReport(NUM_LABELS, **kw),  # every rule at once
}
TARGET_DTYPES = [torch.bool, torch.int64, torch.float32]


def _batch(device, target_dtype, *, rows=40, extra=(), seed=0, ignore_index=None):
    """Scores with ties, 0/1 targets of ``target_dtype`` (with ``ignore_index`` entries where it fits)."""
    generator = torch.Generator().manual_seed(seed)
    shape = (rows, NUM_LABELS) + tuple(extra)
    preds = torch.randint(0, 4, shape, generator=generator).float()
    target = torch.randint(0, 2, shape, generator=generator)
    if ignore_index is not None and target_dtype != torch.bool:
        target[torch.rand(shape, generator=generator) < 0.2] = ignore_index
    weight = torch.rand(shape[:1], generator=generator, dtype=torch.float64) * 3
    return preds.to(device), target.to(target_dtype).to(device), weight.to(device)


def _update(metric, name, preds, target, weight):
    if name == "lrap-weighted":
        metric.update(preds, target, sample_weight=weight)
    else:
        metric.update(preds, target)


def _meta_reads(name, validate_args, target_dtype, *, ties="max", ignore_index=None, extra=()):
    metric = METRICS[name](validate_args=validate_args, ties=ties, ignore_index=ignore_index).to(META)
    preds, target, weight = _batch("cpu", target_dtype, extra=extra, ignore_index=ignore_index)
    batch = [t.to(META) for t in (preds, target, weight)]
    with HostReads() as mode:
        _update(metric, name, *batch)
    states = [getattr(metric, state) for state in metric._defaults]
    assert all(state.device == META for state in states), "a state left the metric's device"
    return mode.reads


@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.parametrize("target_dtype", TARGET_DTYPES, ids=str)
@pytest.mark.parametrize("ignore_index", [None, IGNORE], ids=["all-known", "ignore"])
@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_update_without_value_checks_reads_nothing_on_the_host(name, target_dtype, ignore_index, ties):
    assert _meta_reads(name, False, target_dtype, ties=ties, ignore_index=ignore_index) == []


@pytest.mark.parametrize("name", list(METRICS))
@pytest.mark.parametrize("target_dtype", TARGET_DTYPES, ids=str)
@pytest.mark.parametrize("ignore_index", [None, IGNORE], ids=["all-known", "ignore"])
def test_value_checks_read_the_host_once_per_batch(name, target_dtype, ignore_index):
    reads = _meta_reads(name, True, target_dtype, ignore_index=ignore_index)
    assert reads == ["aten._local_scalar_dense.default"]


def test_extra_dimensions_read_nothing_on_the_host():
    assert _meta_reads("lrap-weighted", False, torch.int64, ignore_index=IGNORE, extra=(3,)) == []
    assert _meta_reads("lwlrap", True, torch.int64, ignore_index=IGNORE, extra=(2, 2)) == [
        "aten._local_scalar_dense.default"
    ]


def test_the_counter_sees_host_reads():
    """The checks above can fail: each kind of host read is recorded."""
    tensor = torch.ones(3, 2, device=META)
    original_tensor = torch.tensor
    with HostReads() as mode:
        bool(tensor.sum() > 0)
        with pytest.raises((RuntimeError, NotImplementedError)):
            tensor.nonzero()
        with pytest.raises((RuntimeError, NotImplementedError)):
            tensor.cpu()
        cpu = torch.ones(2)
        cpu[cpu > 0]  # a boolean mask: nonzero
        torch.tensor(2.0, device=META)  # a copy from host memory
        torch.as_tensor([1, 2], device=META)
        torch.as_tensor(tensor)  # already there: no copy
    assert mode.reads == [
        "aten._local_scalar_dense.default",
        "aten.nonzero.default",
        "aten._to_copy.default meta -> cpu",
        "aten.index.Tensor with a boolean mask",
        "torch.tensor on meta",
        "torch.as_tensor on meta",
    ]
    assert torch.tensor is original_tensor  # restored on exit


@pytest.mark.parametrize("num_labels", [NUM_LABELS, 5000], ids=["rows-kernel", "tiled-kernel"])
@pytest.mark.parametrize("ignore_index", [None, IGNORE], ids=["all-known", "ignore"])
@pytest.mark.parametrize("validate_args", [False, True], ids=["unchecked", "checked"])
def test_triton_path_reads_the_host_only_for_value_checks(fake_triton, num_labels, ignore_index, validate_args):
    metric = MultilabelLWLRAP(num_labels, validate_args=validate_args, ignore_index=ignore_index).to(META)
    preds = torch.empty(64, num_labels, device=META)
    target = torch.empty(64, num_labels, dtype=torch.int64, device=META)
    with use_engine("triton"), HostReads() as mode:
        metric.update(preds, target)
    assert mode.reads == (["aten._local_scalar_dense.default"] if validate_args else [])
    assert [name for name, _, _, _ in fake_triton] == ["_tiled_kernel" if num_labels > 4096 else "_rows_kernel"]


# ----------------------------------------------------------------------------------------------------------------
# On a GPU: the syncs themselves, counted by CUDA's sync debug mode


def _cuda_syncs(action) -> int:
    """The host-device syncs ``action()`` makes, as CUDA's sync debug mode reports them."""
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            action()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchronizing" in str(w.message) for w in caught)  # "called a synchronizing CUDA operation"


def _expected_value(name, preds, target, weight, ignore_index) -> float:
    preds, target, weight = preds.cpu(), target.cpu(), weight.cpu()
    if name == "lrap" or name == "lrap-weighted":
        weights = weight.tolist() if name == "lrap-weighted" else None
        return naive_lrap(preds, target, ignore_index=ignore_index, sample_weight=weights)
    return naive_lwlrap(preds, target, ignore_index=ignore_index)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("engine", ["auto", "sort"], ids=["auto(triton)", "sort"])
@pytest.mark.parametrize("name", ["lwlrap", "lrap", "lrap-weighted"])
@pytest.mark.parametrize("target_dtype", [torch.bool, torch.int64], ids=str)
@pytest.mark.parametrize("ignore_index", [None, IGNORE], ids=["all-known", "ignore"])
def test_cuda_update_syncs(engine, name, target_dtype, ignore_index: Optional[int]):
    preds, target, weight = _batch("cuda", target_dtype, rows=300, ignore_index=ignore_index)
    counts = {}
    for validate_args in (False, True):
        metric = METRICS[name](validate_args=validate_args, ignore_index=ignore_index).to("cuda")
        with use_engine(engine):
            _update(metric, name, preds, target, weight)  # compiles outside the counted region
            metric.reset()
            counts[validate_args] = _cuda_syncs(lambda: _update(metric, name, preds, target, weight))
        value = metric.compute().item()
        assert value == pytest.approx(_expected_value(name, preds, target, weight, ignore_index), abs=1e-12)
    assert counts == {False: 0, True: 1}
