"""Scores as training loops produce them, on every engine path, against the naive formula loops.

Every public entry (both functions, the per-class function, ``update``, ``forward``) must take what a training or
validation step hands it: logits that carry gradients, tensors made under ``torch.inference_mode()``, outputs of a
``torch.compile``d model, ``torch.autocast`` bfloat16/float16 logits, transposed and other non-contiguous views,
expanded (stride-0) targets, channels-last and ``(N, C, T)`` frame-level outputs. The values must equal the naive
reference, no autograd graph may be built (results have ``requires_grad=False``, the input's ``.grad`` stays None)
and the input must be left as it was.

The "triton" path runs in Triton's interpreter: :func:`test_triton_path_in_the_interpreter` runs this module again
in a subprocess with ``TRITON_INTERPRET=1``, where "triton" joins the engine paths. A Lightning run at the end logs
``self.train_lwlrap(logits, y)`` from ``training_step`` and both metrics from ``validation_step``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
import torch
from torch import nn

from tests.reference import naive_lrap, naive_lwlrap, naive_lwlrap_per_class
from torch_lwlrap import (
    MultilabelLRAP,
    MultilabelLWLRAP,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_lwlrap_per_class,
)
from torch_lwlrap import _numba_kernel
from torch_lwlrap._ranking import use_engine

#: Set in the interpreter subprocess: there the "triton" path runs on CPU tensors and must not be skipped.
_TRITON_RUN = os.environ.get("TORCH_LWLRAP_TRAINING_TRITON") == "1"


def _triton_interpreted() -> bool:
    if importlib.util.find_spec("triton") is None:
        return False
    from torch_lwlrap import _triton_kernel

    return _triton_kernel.is_available("cpu")


ENGINES = ["sort", "count"] + (["numba"] if _numba_kernel.is_available("cpu") else [])
if _TRITON_RUN:
    if not _triton_interpreted():
        raise RuntimeError("TORCH_LWLRAP_TRAINING_TRITON=1 needs Triton with TRITON_INTERPRET=1 set before import.")
    ENGINES = ["triton"]

#: The suite's standard for values that are exact up to float64 rounding.
REL = 1e-12

NUM_SAMPLES, NUM_CLASSES, NUM_FEATURES, NUM_FRAMES = 12, 6, 5, 3


# ----------------------------------------------------------------------------------------------------------------
# The input forms, each built the way a training loop builds it


def _features(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _labels(seed: int, *shape: int) -> torch.Tensor:
    labels = (torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) < 0.35).long()
    labels[0, 0] = 1  # at least one positive label
    return labels


def _linear(seed: int) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(NUM_FEATURES, NUM_CLASSES)


def form_grad_leaf():
    preds = _features(1, NUM_SAMPLES, NUM_CLASSES).requires_grad_()
    return preds, _labels(2, NUM_SAMPLES, NUM_CLASSES)


def form_grad_logits():
    return _linear(3)(_features(4, NUM_SAMPLES, NUM_FEATURES)), _labels(5, NUM_SAMPLES, NUM_CLASSES)


def form_inference_mode():
    model = _linear(6)
    with torch.inference_mode():
        preds = model(_features(7, NUM_SAMPLES, NUM_FEATURES))
        target = _labels(8, NUM_SAMPLES, NUM_CLASSES).bool()
    assert preds.is_inference() and target.is_inference()
    return preds, target


def form_compiled_model():
    # aot_eager: the autograd graph torch.compile builds (AOTAutograd), without a C++ toolchain's compile time.
    model = torch.compile(_linear(9), backend="aot_eager")
    return model(_features(10, NUM_SAMPLES, NUM_FEATURES)), _labels(11, NUM_SAMPLES, NUM_CLASSES).float()


def form_autocast_bfloat16():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        preds = _linear(12)(_features(13, NUM_SAMPLES, NUM_FEATURES))
    assert preds.dtype == torch.bfloat16
    return preds, _labels(14, NUM_SAMPLES, NUM_CLASSES)


def form_autocast_float16():
    with torch.autocast("cpu", dtype=torch.float16):
        preds = _linear(15)(_features(16, NUM_SAMPLES, NUM_FEATURES))
    assert preds.dtype == torch.float16
    return preds, _labels(17, NUM_SAMPLES, NUM_CLASSES).to(torch.uint8)


def form_transposed():
    # Class-major outputs (C, N) read as (N, C): a transposed view of scores and of target.
    logits = nn.Linear(NUM_FEATURES, NUM_SAMPLES)(_features(18, NUM_CLASSES, NUM_FEATURES))
    target = _labels(19, NUM_CLASSES, NUM_SAMPLES).T
    assert not logits.T.is_contiguous() and not target.is_contiguous()
    return logits.T, target


def form_strided_view():
    # Every other row and column of a wider output: neither dimension contiguous.
    logits = nn.Linear(NUM_FEATURES, 2 * NUM_CLASSES)(_features(20, 2 * NUM_SAMPLES, NUM_FEATURES))
    target = _labels(21, 2 * NUM_SAMPLES, 2 * NUM_CLASSES)
    return logits[::2, 1::2], target[1::2, ::2]


def form_expanded_target():
    # Segments of one recording, every segment labelled with the recording's labels: a (1, C) row expanded.
    logits = _linear(22)(_features(23, NUM_SAMPLES, NUM_FEATURES))
    target = torch.tensor([[1, 0, 1, 0, 0, 1]]).expand(NUM_SAMPLES, NUM_CLASSES)
    assert target.stride() == (0, 1)
    return logits, target


def form_frame_level():
    # (N, C, T) frame-level outputs of a 1-D convolution; clip labels expanded over the frames (stride 0).
    conv = nn.Conv1d(NUM_FEATURES, NUM_CLASSES, kernel_size=2)
    torch.manual_seed(24)
    preds = conv(_features(25, NUM_SAMPLES, NUM_FEATURES, NUM_FRAMES + 1))
    target = _labels(26, NUM_SAMPLES, NUM_CLASSES).unsqueeze(-1).expand(-1, -1, NUM_FRAMES)
    assert preds.shape == target.shape == (NUM_SAMPLES, NUM_CLASSES, NUM_FRAMES) and target.stride()[-1] == 0
    return preds, target


def form_channels_last():
    # (N, C, H, W) outputs of a 2-D convolution in channels-last memory format.
    torch.manual_seed(27)
    conv = nn.Conv2d(NUM_FEATURES, NUM_CLASSES, kernel_size=1).to(memory_format=torch.channels_last)
    features = _features(28, NUM_SAMPLES // 2, NUM_FEATURES, 2, 2).to(memory_format=torch.channels_last)
    preds = conv(features)
    target = _labels(29, NUM_SAMPLES // 2, NUM_CLASSES, 2, 2).to(memory_format=torch.channels_last)
    assert preds.is_contiguous(memory_format=torch.channels_last) and not preds.is_contiguous()
    return preds, target


FORMS: Dict[str, Callable[[], Tuple[torch.Tensor, torch.Tensor]]] = {
    name[len("form_") :]: value for name, value in dict(globals()).items() if name.startswith("form_")
}


# ----------------------------------------------------------------------------------------------------------------
# Every entry on one batch, against the naive loops


def _reference_inputs(preds: torch.Tensor, target: torch.Tensor):
    """The values as plain float64 / int64 CPU tensors (exact for every score dtype), made outside the library."""
    with torch.no_grad():
        return preds.detach().to(torch.float64).clone(), target.detach().to(torch.int64).clone()


def _snapshot(preds: torch.Tensor) -> Tuple[torch.Tensor, int]:
    version = None if preds.is_inference() else preds._version
    return preds.detach().clone(), version


def _assert_unchanged(preds: torch.Tensor, snapshot) -> None:
    values, version = snapshot
    assert torch.equal(preds.detach(), values), "the scores were modified"
    if version is not None:
        assert preds._version == version, "the scores were written in place"
    if preds.is_leaf and preds.requires_grad:
        assert preds.grad is None, "the input's .grad was touched"


def _assert_value(result: torch.Tensor, want) -> None:
    assert not result.requires_grad and result.grad_fn is None, "an autograd graph was built"
    assert result.dtype == torch.float64
    got = result.tolist()
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert (g != g and w != w) or g == pytest.approx(w, rel=REL, abs=REL)
    else:
        assert got == pytest.approx(want, rel=REL, abs=REL)


def check_every_entry(preds: torch.Tensor, target: torch.Tensor) -> None:
    """Both functions, the per-class function and both metrics' ``forward``/``update``/``compute`` on one batch."""
    snapshot = _snapshot(preds)
    ref_preds, ref_target = _reference_inputs(preds, target)
    half = preds.shape[0] // 2

    for ties in ("max", "index"):
        _assert_value(multilabel_lwlrap(preds, target, ties=ties), naive_lwlrap(ref_preds, ref_target, ties=ties))
        _assert_value(multilabel_lrap(preds, target, ties=ties), naive_lrap(ref_preds, ref_target, ties=ties))
    per_class, weights = multilabel_lwlrap_per_class(preds, target)
    want_per_class, want_weights, _ = naive_lwlrap_per_class(ref_preds, ref_target)
    _assert_value(per_class, want_per_class)
    _assert_value(weights, want_weights)
    _assert_value(multilabel_lwlrap(preds, target, average="macro"), naive_lwlrap(ref_preds, ref_target, average="macro"))

    # Sample weights that carry gradients too (weights from a model).
    sample_weight = torch.linspace(0.5, 2.0, preds.shape[0]).requires_grad_()
    weight_shape = (preds.shape[0],) + (1,) * (preds.ndim - 2)
    want = naive_lrap(ref_preds, ref_target, sample_weight=sample_weight.detach().reshape(weight_shape)
                      .expand((preds.shape[0],) + tuple(preds.shape[2:])).tolist())
    _assert_value(multilabel_lrap(preds, target, sample_weight=sample_weight), want)
    assert sample_weight.grad is None

    lwlrap, lrap = MultilabelLWLRAP(NUM_CLASSES), MultilabelLRAP(NUM_CLASSES)
    _assert_value(lwlrap(preds[:half], target[:half]), naive_lwlrap(ref_preds[:half], ref_target[:half]))
    _assert_value(lrap(preds[:half], target[:half]), naive_lrap(ref_preds[:half], ref_target[:half]))
    lwlrap.update(preds[half:], target[half:])
    lrap.update(preds[half:], target[half:])
    _assert_value(lwlrap.compute(), naive_lwlrap(ref_preds, ref_target))
    _assert_value(lrap.compute(), naive_lrap(ref_preds, ref_target))
    for state in (lwlrap.precision_sum, lwlrap.label_count, lrap.lrap_sum, lrap.weight_sum):
        assert not state.requires_grad

    _assert_unchanged(preds, snapshot)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("engine", ENGINES)
def test_every_entry_takes_training_outputs(engine, form):
    preds, target = FORMS[form]()
    with use_engine(engine):
        check_every_entry(preds, target)


@pytest.mark.parametrize("engine", ENGINES)
def test_entries_called_inside_autocast_and_no_grad_contexts(engine):
    # Lightning runs training_step inside autocast with precision="bf16-mixed", and validation inside
    # inference_mode: the ranking runs inside these contexts too.
    preds, target = form_grad_logits()
    with use_engine(engine):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            check_every_entry(preds, target)
        with torch.no_grad():
            check_every_entry(preds, target)
        with torch.inference_mode():
            check_every_entry(preds, target)


@pytest.mark.parametrize("metric_class", [MultilabelLWLRAP, MultilabelLRAP])
@pytest.mark.parametrize("engine", ENGINES)
def test_metric_state_made_under_inference_mode(engine, metric_class):
    # A metric created, reset or run (validation) under inference_mode holds inference tensors: a later update
    # outside it must not write them in place. And the other way round: state made outside, updated inside.
    preds, target = form_grad_logits()
    ref_preds, ref_target = _reference_inputs(preds, target)
    naive = naive_lwlrap if metric_class is MultilabelLWLRAP else naive_lrap
    half = NUM_SAMPLES // 2
    with use_engine(engine):
        with torch.inference_mode():
            made_inside = metric_class(NUM_CLASSES)
        used_inside = metric_class(NUM_CLASSES)
        with torch.inference_mode():
            used_inside(preds[:half], target[:half])
            used_inside.reset()
            used_inside.update(preds[:half], target[:half])
        made_outside = metric_class(NUM_CLASSES)
        made_outside.update(preds[:half], target[:half])
        for metric in (made_inside, used_inside, made_outside):
            if metric is made_inside:
                metric.update(preds[:half], target[:half])  # outside inference mode
            _assert_value(metric(preds[half:], target[half:]), naive(ref_preds[half:], ref_target[half:]))
            _assert_value(metric.compute(), naive(ref_preds, ref_target))
        with torch.inference_mode():
            made_outside.update(preds, target)
            _assert_value(made_outside.compute(), naive(torch.cat([ref_preds, ref_preds]), torch.cat([ref_target] * 2)))


@pytest.mark.parametrize("engine", ENGINES)
def test_backward_after_scoring_gives_the_same_gradients(engine):
    # Scoring the logits between forward and backward changes nothing for autograd.
    model = _linear(30)
    features, target = _features(31, NUM_SAMPLES, NUM_FEATURES), _labels(32, NUM_SAMPLES, NUM_CLASSES)

    def gradients(score: bool):
        model.zero_grad()
        logits = model(features)
        if score:
            with use_engine(engine):
                multilabel_lwlrap(logits, target)
                MultilabelLWLRAP(NUM_CLASSES)(logits, target)
        nn.functional.binary_cross_entropy_with_logits(logits, target.float()).backward()
        return [p.grad.clone() for p in model.parameters()]

    for with_score, without in zip(gradients(True), gradients(False)):
        assert torch.equal(with_score, without)


# ----------------------------------------------------------------------------------------------------------------
# The "triton" path, in Triton's interpreter


@pytest.mark.skipif(_TRITON_RUN, reason="this is the interpreter run")
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_triton_path_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1", TORCH_LWLRAP_TRAINING_TRITON="1")
    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "pytest", str(Path(__file__).resolve()), "-q", "-p", "no:cacheprovider", "-x",
               "-k", "not lightning"]
    result = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"The interpreter run failed:\n{result.stdout[-6000:]}\n{result.stderr[-3000:]}"
    assert " passed" in result.stdout and " failed" not in result.stdout, result.stdout[-3000:]


# ----------------------------------------------------------------------------------------------------------------
# A Lightning run: training_step logs the metric's forward on grad-carrying logits, validation logs both metrics


def _lightning_run(tmp_path, precision: str):
    """Fit a linear tagger for 2 epochs of 4 steps on the CPU; returns the logged values and the logits behind them.

    Validation runs under torch.inference_mode() (Lightning's default), its sanity check included, so the
    validation metrics are updated, computed and reset there; the training metric is run outside it.
    """
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader, TensorDataset

    def dataset(seed: int, size: int) -> TensorDataset:
        labels = _labels(seed, size, NUM_CLASSES)
        features = labels.float() @ _features(seed + 1, NUM_CLASSES, NUM_FEATURES) + _features(seed + 2, size, NUM_FEATURES)
        return TensorDataset(features, labels)

    class Tagger(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _linear(40)
            self.train_lwlrap = MultilabelLWLRAP(num_labels=NUM_CLASSES)
            self.val_lwlrap = MultilabelLWLRAP(num_labels=NUM_CLASSES)
            self.val_lrap = MultilabelLRAP(num_labels=NUM_CLASSES)
            self.train_logits: List[Tuple[torch.Tensor, torch.Tensor]] = []
            self.val_logits: List[List[Tuple[torch.Tensor, torch.Tensor]]] = []

        def training_step(self, batch, batch_idx):
            features, y = batch
            logits = self.net(features)
            assert logits.requires_grad
            self.train_logits.append((logits.detach().clone(), y.clone()))
            self.log("train_lwlrap", self.train_lwlrap(logits, y))
            return nn.functional.binary_cross_entropy_with_logits(logits.float(), y.float())

        def on_validation_epoch_start(self) -> None:
            self.val_logits.append([])

        def validation_step(self, batch, batch_idx):
            features, y = batch
            logits = self.net(features)
            self.val_logits[-1].append((logits.clone(), y.clone()))
            self.val_lwlrap.update(logits, y)
            self.val_lrap.update(logits, y)
            self.log("val_lwlrap", self.val_lwlrap, on_epoch=True)
            self.log("val_lrap", self.val_lrap, on_epoch=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

        def train_dataloader(self):
            return DataLoader(dataset(50, 48), batch_size=12, shuffle=False)

        def val_dataloader(self):
            return DataLoader(dataset(60, 30), batch_size=12)  # a partial last batch

    class Record(Callback):
        def __init__(self) -> None:
            self.train: List[float] = []
            self.val: List[Tuple[bool, float, float]] = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.train.append(trainer.callback_metrics["train_lwlrap"].item())

        def on_validation_end(self, trainer, pl_module) -> None:
            metrics = trainer.callback_metrics
            if not trainer.sanity_checking:  # the sanity check's values are not logged
                self.val.append((metrics["val_lwlrap"].item(), metrics["val_lrap"].item()))

    model, record = Tagger(), Record()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        precision=precision,
        num_sanity_val_steps=1,
        logger=False,
        callbacks=[record],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    start = [p.detach().clone() for p in model.net.parameters()]
    trainer.fit(model)
    trained = any(not torch.equal(a, b) for a, b in zip(start, model.net.parameters()))
    return record, model, trained


# Lightning's own advice (workers, logging intervals) and its deprecation notices; the library's warnings still fail.
@pytest.mark.filterwarnings("ignore::UserWarning:lightning")
@pytest.mark.filterwarnings("ignore::FutureWarning:lightning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:lightning")
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_training_step_logs_the_metric_on_grad_carrying_logits(tmp_path, precision):
    record, model, trained = _lightning_run(tmp_path, precision)
    assert trained, "the optimizer never stepped: the loss lost its graph"
    # Every training step logged the lwlrap of its own batch, from logits that carried gradients.
    assert len(record.train) == len(model.train_logits) == 8
    for logged, (logits, y) in zip(record.train, model.train_logits):
        assert logits.dtype == (torch.bfloat16 if precision == "bf16-mixed" else torch.float32)
        assert logged == pytest.approx(naive_lwlrap(logits.double(), y), rel=REL, abs=REL)
    # Every validation epoch logged both metrics over the whole validation set (sanity check excluded: index 0).
    assert len(record.val) == 2 and len(model.val_logits) == 3
    for (lwlrap, lrap), batches in zip(record.val, model.val_logits[1:]):
        logits = torch.cat([b[0] for b in batches]).double()
        y = torch.cat([b[1] for b in batches])
        assert logits.shape == (30, NUM_CLASSES)
        assert lwlrap == pytest.approx(naive_lwlrap(logits, y), rel=REL, abs=REL)
        assert lrap == pytest.approx(naive_lrap(logits, y), rel=REL, abs=REL)
    assert record.val[0] != record.val[1]  # the model changed between the epochs
