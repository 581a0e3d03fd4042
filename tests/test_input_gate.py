"""Every public function goes through the one input gate: called as a training step calls it, on logits that carry
gradients; and the bootstrap interval does not depend on how the samples were cut into batches."""

from __future__ import annotations

from typing import Dict, List

import math
import warnings

import numpy as np
import pytest
import torch
from torch import nn

import torch_lwlrap
from tests.reference import naive_lrap, naive_lwlrap
from torch_lwlrap import use_engine

REL = 1e-12
NUM_CLASSES = 7


def _calls(logits, y) -> Dict[str, object]:
    """Every public function, called on ``logits`` as given."""
    return {
        "multilabel_lwlrap": torch_lwlrap.multilabel_lwlrap(logits, y),
        "multilabel_lwlrap_expected": torch_lwlrap.multilabel_lwlrap(logits, y, ties="expected"),
        "multilabel_lwlrap_per_class": torch_lwlrap.multilabel_lwlrap_per_class(logits, y)[0],
        "multilabel_lrap": torch_lwlrap.multilabel_lrap(logits, y),
        "multilabel_lwlrap_ci": torch_lwlrap.multilabel_lwlrap_ci(logits, y, num_bootstrap=100, seed=0).low,
        "multilabel_lrap_ci": torch_lwlrap.multilabel_lrap_ci(logits, y, num_bootstrap=100, seed=0).high,
        "compare_lwlrap": torch_lwlrap.compare_lwlrap(logits, logits * 0.5, y, num_bootstrap=100, seed=0).difference,
        "tie_report": torch.tensor(torch_lwlrap.tie_report(logits, y).lwlrap_expected),
        "multilabel_ranking_loss": torch_lwlrap.multilabel_ranking_loss(logits, y),
        "multilabel_coverage_error": torch_lwlrap.multilabel_coverage_error(logits, y),
        "multilabel_one_error": torch_lwlrap.multilabel_one_error(logits, y),
        "multilabel_retrieval_at_k": torch_lwlrap.multilabel_retrieval_at_k(logits, y, k=3)["ndcg@3"],
    }


@pytest.mark.filterwarnings("ignore::UserWarning:lightning")
@pytest.mark.filterwarnings("ignore::FutureWarning:lightning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:lightning")
def test_every_public_function_in_a_lightning_training_step(tmp_path):
    L = pytest.importorskip("lightning")
    from torch.utils.data import DataLoader, TensorDataset

    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(48, NUM_CLASSES, generator=g) < 0.3).long()
    features = labels.float() @ torch.randn(NUM_CLASSES, 5, generator=g) + torch.randn(48, 5, generator=g)

    class Tagger(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Linear(5, NUM_CLASSES)
            self.train_ci = torch_lwlrap.MultilabelLWLRAP(NUM_CLASSES, num_bootstrap=100, bootstrap_seed=0)
            self.seen: List[tuple] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            assert logits.requires_grad
            got = _calls(logits, y)
            self.seen.append((logits.detach().clone(), y.clone(), got))
            self.log("train_lwlrap", self.train_ci(logits, y))
            return nn.functional.binary_cross_entropy_with_logits(logits, y.float())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.5)

        def train_dataloader(self):
            return DataLoader(TensorDataset(features, labels), batch_size=12)

    model = Tagger()
    start = model.net.weight.detach().clone()
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model)
    assert not torch.equal(start, model.net.weight), "the loss lost its graph"
    assert len(model.seen) == 4
    for logits, y, got in model.seen:
        want = _calls(logits, y)  # the same calls on values without gradients
        for name, value in got.items():
            assert not value.requires_grad, name
            torch.testing.assert_close(value, want[name], rtol=0, atol=0, equal_nan=True, msg=name)
        assert got["multilabel_lwlrap"].item() == pytest.approx(naive_lwlrap(logits.double(), y), rel=REL)
        assert got["multilabel_lrap"].item() == pytest.approx(naive_lrap(logits.double(), y), rel=REL)
    low, high = model.train_ci.confidence_interval()
    all_logits = torch.cat([s[0] for s in model.seen])
    all_y = torch.cat([s[1] for s in model.seen])
    interval = torch_lwlrap.multilabel_lwlrap_ci(all_logits, all_y, num_bootstrap=100, seed=0)
    assert (low.item(), high.item()) == (interval.low.item(), interval.high.item())


def _data():
    g = torch.Generator().manual_seed(0)
    target = torch.rand(2000, 20, generator=g) < 0.1
    preds = target * 1.5 + torch.randn(2000, 20, generator=g)
    target = target.long()
    target[::13, 3] = -1  # unknown labels
    weight = torch.rand(2000, generator=g)
    return preds, target, weight


@pytest.mark.parametrize("engine", ["auto", "sort"])
@pytest.mark.parametrize("num_batches", [1, 4, 37])
@pytest.mark.parametrize("call", ["update", "forward"])
def test_the_metric_in_any_batches_gives_the_functions_interval_bit_for_bit(engine, num_batches, call):
    preds, target, weight = _data()
    cuts = torch.linspace(0, preds.shape[0], num_batches + 1).long().tolist()
    with use_engine(engine):
        lwlrap = torch_lwlrap.multilabel_lwlrap_ci(preds, target, ignore_index=-1, num_bootstrap=300, seed=7)
        lrap = torch_lwlrap.multilabel_lrap_ci(preds, target, sample_weight=weight, ignore_index=-1,
                                               num_bootstrap=300, seed=7)
        metrics = (
            torch_lwlrap.MultilabelLWLRAP(20, ignore_index=-1, num_bootstrap=300, bootstrap_seed=7),
            torch_lwlrap.MultilabelLRAP(20, ignore_index=-1, num_bootstrap=300, bootstrap_seed=7),
        )
        for start, stop in zip(cuts[:-1], cuts[1:]):
            batch = (preds[start:stop], target[start:stop])
            for metric in metrics:
                extra = {"sample_weight": weight[start:stop]} if isinstance(metric, torch_lwlrap.MultilabelLRAP) else {}
                getattr(metric, call)(*batch, **extra) if call == "update" else metric(*batch, **extra)
        for metric, interval in zip(metrics, (lwlrap, lrap)):
            low, high = metric.confidence_interval()
            assert (low.item(), high.item()) == (interval.low.item(), interval.high.item()), type(metric).__name__
            assert metric.compute().item() == pytest.approx(interval.value.item(), rel=REL)


def test_extra_dimensions_are_samples_of_the_stream():
    # (N, C, T) batches: each frame is a sample, its position counted across batches as the function counts it.
    g = torch.Generator().manual_seed(3)
    preds = torch.randn(60, 5, 4, generator=g)
    target = (torch.rand(60, 5, 4, generator=g) < 0.3).long()
    interval = torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=200, seed=1)
    metric = torch_lwlrap.MultilabelLWLRAP(5, num_bootstrap=200, bootstrap_seed=1)
    for start in range(0, 60, 7):
        metric.update(preds[start:start + 7], target[start:start + 7])
    assert int(metric.bootstrap_lwlrap_samples) == 60 * 4
    low, high = metric.confidence_interval()
    assert (low.item(), high.item()) == (interval.low.item(), interval.high.item())


def _synced_on_step(**kwargs):
    # A process group of one whose all-gather returns the tensor twice: forward then takes torchmetrics' full-state
    # path (dist_sync_on_step), which updates the accumulated states first and a throwaway copy after.
    return dict(dist_sync_fn=lambda x, group=None: [x, x], distributed_available_fn=lambda: True,
                dist_sync_on_step=True, **kwargs)


@pytest.mark.parametrize("name", ["lwlrap", "lrap"])
def test_forward_with_dist_sync_on_step_draws_what_update_draws(name):
    preds, target, _ = _data()
    cls = torch_lwlrap.MultilabelLWLRAP if name == "lwlrap" else torch_lwlrap.MultilabelLRAP
    synced = cls(20, ignore_index=-1, num_bootstrap=100, bootstrap_seed=3, **_synced_on_step())
    plain = cls(20, ignore_index=-1, num_bootstrap=100, bootstrap_seed=3)
    for start in range(0, 600, 150):
        synced(preds[start:start + 150], target[start:start + 150])
        plain.update(preds[start:start + 150], target[start:start + 150])
    for state in plain._replicate_names() + (plain._counter_name,):
        assert torch.equal(getattr(synced, state), getattr(plain, state)), state


def test_samples_2_to_the_32_apart_draw_independent_weights():
    from torch_lwlrap.stats import _bootstrap

    key = _bootstrap.stream_key(0, 0)
    near = torch.arange(1000, dtype=torch.int64)
    weights = _bootstrap.poisson_weights(key, near, 50)
    far = _bootstrap.poisson_weights(key, near + (1 << 32), 50)
    assert (weights != far).float().mean() > 0.5
    assert torch.equal(_bootstrap.poisson_weights(key, near, 50), weights)  # and the same position, the same weight


def test_updates_after_loading_never_write_into_the_checkpoint():
    preds, target, _ = _data()
    metric = torch_lwlrap.MultilabelLWLRAP(20, ignore_index=-1, num_bootstrap=50, bootstrap_seed=1)
    metric.persistent(True)
    metric.update(preds[:100], target[:100])
    checkpoint = {name: value.clone() for name, value in metric.state_dict().items()}
    held = metric.state_dict()
    resumed = torch_lwlrap.MultilabelLWLRAP(20, ignore_index=-1, num_bootstrap=50, bootstrap_seed=1)
    resumed.persistent(True)
    resumed.load_state_dict(held)
    resumed.update(preds[100:200], target[100:200])
    for name, value in held.items():
        assert torch.equal(value, checkpoint[name]), name


@pytest.mark.parametrize("name", ["MultilabelLWLRAP", "MultilabelTieReport", "MultilabelRankCorrelation"])
def test_a_forward_with_arguments_update_does_not_take_changes_nothing(name):
    """``metric(preds, target, weights)`` on a metric whose update takes no weights: Python's own TypeError, before
    torchmetrics' forward empties the states."""
    metric = getattr(torch_lwlrap, name)(num_labels=4)
    preds = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6]])
    target = torch.tensor([[1, 0, 1, 0], [0, 1, 0, 1]])
    second = target.float() if name == "MultilabelRankCorrelation" else target
    metric.update(preds, second)
    before = {key: value.clone() for key, value in metric.metric_state.items()}
    assert len(before) >= 3
    with pytest.raises(TypeError, match="too many positional arguments|unexpected keyword"):
        metric(preds, second, torch.ones(2))
    with pytest.raises(TypeError):
        metric(preds, second, weights=torch.ones(2))
    after = metric.metric_state
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert metric._update_count == 1


def test_a_forward_that_does_not_fit_update_names_the_metric_and_its_arguments():
    """In a collection the user cannot tell which metric refused a call: the message names it, the arguments its
    ``update`` takes, and a keyword it does not take."""
    from torchmetrics import MetricCollection

    a, b = torch.randn(4, 5), torch.randn(4, 5)
    y = (torch.rand(4, 5) < 0.5).long()
    with pytest.raises(TypeError, match=r"^MultilabelRankCorrelation: `metric\(\.\.\.\)` takes the arguments of "
                                        r"`metric.update\(preds, reference\)`, but this call does not fit them \(it "
                                        r"names `target`, which `update` does not take\)\. Its second argument "
                                        r"is `reference` \(not torchmetrics' `target`\): pass both by position, "
                                        r"`metric\(preds, y\)`"):
        torch_lwlrap.MultilabelRankCorrelation(5)(a, target=b)
    # update itself, as a Lightning step writes it: the same message (it had been Python's bare "missing 1 required
    # positional argument: 'preds_b'"), and nothing counted
    metric = torch_lwlrap.MultilabelKendallDistanceAtK(5, 2)
    with pytest.raises(TypeError, match=r"^MultilabelKendallDistanceAtK: `metric.update\(\.\.\.\)` takes "
                                        r"`metric.update\(preds_a, preds_b\)`, but this call does not fit them \(it "
                                        r"names `target`, which `update` does not take\)\. Its second argument is "
                                        r"`preds_b` \(not torchmetrics' `target`\): pass both by position, "
                                        r"`metric.update\(preds, y\)`"):
        metric.update(a, target=b)
    assert not metric.update_called
    with pytest.raises(TypeError, match="missing a required argument: 'relevance'") as raised:
        torch_lwlrap.MultilabelNDCG(5).update(a, sample_weight=torch.ones(4))  # no `target` in sight: no such hint
    assert "torchmetrics' `target`" not in str(raised.value)
    with pytest.raises(TypeError, match=r"^MultilabelLWLRAP: `metric.update\(\.\.\.\)` takes `metric.update\("
                                        r"preds, target\)`, but this call does not fit them \(too many positional "
                                        r"arguments\)\.$"):
        torch_lwlrap.MultilabelLWLRAP(5).update(a, y, y)
    with pytest.raises(TypeError, match=r"must be a floating point tensor of scores"):  # the gate's own TypeError
        torch_lwlrap.MultilabelLWLRAP(5).update(y, y)
    with pytest.raises(TypeError, match=r"^MultilabelKendallDistanceAtK: .*`metric.update\(preds_a, preds_b\)`.*"
                                        r"\(missing a required argument: 'preds_b'\)\. Its second argument is `preds_b`"):
        torch_lwlrap.MultilabelKendallDistanceAtK(5, 2)(a)
    collection = MetricCollection({"lwlrap": torch_lwlrap.MultilabelLWLRAP(5), "ndcg": torch_lwlrap.MultilabelNDCG(5)})
    with pytest.raises(TypeError, match=r"^MultilabelNDCG: .*`metric.update\(preds, relevance, "
                                        r"sample_weight=None\)`.*missing a required argument: 'relevance'"):
        # (the collection passes each metric only the keywords its update takes)
        collection(a, target=y)


@pytest.mark.parametrize("second", ["target", "relevance"])
def test_classes_in_the_last_dimension_get_the_movedim_hint(second):
    preds = torch.rand(4, 7, 5)
    labels = torch.randint(0, 2, (4, 7, 5))
    call = {
        "target": lambda: torch_lwlrap.multilabel_lwlrap(preds, labels, num_labels=5),
        "relevance": lambda: torch_lwlrap.MultilabelNDCG(5).update(preds, labels),
    }[second]
    with pytest.raises(ValueError, match=rf"Expected 5 labels \(`num_labels`\) in dimension 1 of `preds`, but got "
                                         rf"shape \(4, 7, 5\): the classes look like the last dimension, move them to "
                                         rf"dimension 1 with `preds.movedim\(-1, 1\)` and `{second}.movedim\(-1, 1\)`\."):
        call()
    moved = torch_lwlrap.multilabel_lwlrap(preds.movedim(-1, 1), labels.movedim(-1, 1), num_labels=5)
    flat = torch_lwlrap.multilabel_lwlrap(preds.reshape(-1, 5), labels.reshape(-1, 5))
    assert moved.item() == pytest.approx(flat.item(), rel=1e-12)  # the fix scores every (sample, position) row
    with pytest.raises(ValueError) as info:  # not the hint where the last dimension is not the classes either
        torch_lwlrap.multilabel_lwlrap(torch.rand(4, 7, 6), torch.randint(0, 2, (4, 7, 6)), num_labels=5)
    assert "movedim" not in str(info.value)


NUM_LABELS_FUNCTIONS = {
    "multilabel_lwlrap": lambda p, y, n: torch_lwlrap.multilabel_lwlrap(p, y, num_labels=n),
    "multilabel_lwlrap_per_class": lambda p, y, n: torch_lwlrap.multilabel_lwlrap_per_class(p, y, num_labels=n),
    "multilabel_lrap": lambda p, y, n: torch_lwlrap.multilabel_lrap(p, y, num_labels=n),
    "multilabel_lwlrap_ci": lambda p, y, n: torch_lwlrap.multilabel_lwlrap_ci(p, y, num_labels=n, num_bootstrap=40),
    "multilabel_lrap_ci": lambda p, y, n: torch_lwlrap.multilabel_lrap_ci(p, y, num_labels=n, num_bootstrap=40),
    "compare_lwlrap": lambda p, y, n: torch_lwlrap.compare_lwlrap(p, p * 0.5, y, num_labels=n, num_bootstrap=40),
    "tie_report": lambda p, y, n: torch_lwlrap.tie_report(p, y, num_labels=n),
    "multilabel_ranking_loss": lambda p, y, n: torch_lwlrap.multilabel_ranking_loss(p, y, num_labels=n),
    "multilabel_coverage_error": lambda p, y, n: torch_lwlrap.multilabel_coverage_error(p, y, num_labels=n),
    "multilabel_one_error": lambda p, y, n: torch_lwlrap.multilabel_one_error(p, y, num_labels=n),
    "multilabel_retrieval_at_k": lambda p, y, n: torch_lwlrap.multilabel_retrieval_at_k(p, y, k=1, num_labels=n),
}


@pytest.mark.parametrize("name", sorted(NUM_LABELS_FUNCTIONS))
def test_every_function_refuses_a_num_labels_that_is_no_integer_as_the_classes_do(name):
    # True equals 1: with one class it was taken silently; 1.0 likewise. The metric classes refuse both.
    call = NUM_LABELS_FUNCTIONS[name]
    preds, target = torch.tensor([[0.3], [0.8], [0.1]]), torch.tensor([[1], [0], [1]])
    for bad in (True, 1.0):
        with pytest.raises(ValueError, match=rf"^Argument `num_labels` must be a positive integer, but got {bad!r}\.$"):
            call(preds, target, bad)
    for good in (1, np.int64(1)):  # a Python or numpy integer, as documented
        call(preds, target, good)
    with pytest.raises(ValueError, match=r"Argument `num_labels` must be a positive integer, but got True\."):
        torch_lwlrap.MultilabelLWLRAP(num_labels=True)


# The mistakes a new user makes, each with the message's fix (and the state of a metric left as it was).
MISTAKES = {
    "thresholded predictions": (
        lambda p, y: ((p > 0).long(), y.float()), TypeError, r"look swapped.*thresholded predictions.*before the threshold"
    ),
    "swapped, float labels": (lambda p, y: (y.float(), torch.sigmoid(p)), ValueError, r"`preds` holds only 0 and 1: the arguments look swapped"),
    "-1 for unknown": (lambda p, y: (p, y.masked_fill(torch.eye(*y.shape, dtype=torch.bool), -1)), ValueError,
                       r"found the values \[-1\]: if they mark unknown labels, pass `ignore_index=-1`"),
    "NaN for unknown": (lambda p, y: (p, y.float().masked_fill(torch.eye(*y.shape, dtype=torch.bool), math.nan)),
                        ValueError, r"\[nan\]: if NaN marks unknown labels, pass `ignore_index=-1` after `target.nan_to_num\(-1\)`"),
    "-1 beside 0/1 predictions": (
        lambda p, y: ((p > 0).float(), y.masked_fill(torch.eye(*y.shape, dtype=torch.bool), -1)), ValueError,
        r"found the values \[-1\]: if they mark unknown labels, pass `ignore_index=-1`",
    ),
    "-1 written into uint8 labels": (
        lambda p, y: (p, y.to(torch.uint8).masked_fill(torch.eye(*y.shape, dtype=torch.bool), -1)), ValueError,
        r"found the values \[255\]: `target` is uint8, which holds no negative value: -1 written into it is stored "
        r"as 255\. If these values mark unknown labels, pass `ignore_index=255`, or keep the labels in a signed dtype "
        r"and pass `ignore_index=-1`: `target.to\(torch.int64\).masked_fill\(target == 255, -1\)` \(or convert before "
        r"marking\)",
    ),
    "-100 written into uint8 labels": (
        lambda p, y: (p, y.to(torch.uint8).masked_fill(torch.eye(*y.shape, dtype=torch.bool), -100)), ValueError,
        r"-100 written into it is stored as 156\. If these values mark unknown labels, pass `ignore_index=156`",
    ),
    "uint16 labels": (lambda p, y: (p, y.to(torch.uint16)), TypeError,
                      r"`target` has dtype torch.uint16, which torch cannot compare or reduce yet: convert the labels "
                      r"with `target.long\(\)`"),
    "soft labels": (lambda p, y: (p, y.float() * 0.9), ValueError, r"\[0\.9\]: soft labels .*`target > 0\.5`.*multilabel_ndcg"),
    "numpy scores": (lambda p, y: (p.numpy(), y), TypeError, r"got ndarray: convert it with `torch.as_tensor\(preds\)`"),
    "one sample, 1-D": (lambda p, y: (p[0], y[0]), ValueError, r"shape \(5,\): for a single sample, pass `preds.unsqueeze\(0\)`"),
    "class indices": (lambda p, y: (p, y.argmax(1)), ValueError,
                      r"looks like one class index per sample.*`torch.nn.functional.one_hot\(target, 5\)` makes"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_new_users_mistakes_get_the_fix_and_leave_the_metric_alone(mistake):
    make, error, message = MISTAKES[mistake]
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 5, generator=g, requires_grad=True)  # a model's output, as a training step has it
    labels = (torch.rand(8, 5, generator=g) < 0.4).long()
    labels[:, 0] = 1
    metric = torch_lwlrap.MultilabelLWLRAP(num_labels=5)
    metric.update(logits, labels)
    before = {name: value.clone() for name, value in metric.metric_state.items()}
    preds, target = make(logits.detach(), labels)
    with pytest.raises(error, match=message):
        metric.update(preds, target)
    with pytest.raises(error, match=message):
        torch_lwlrap.multilabel_lwlrap(preds, target)
    assert all(torch.equal(before[name], value) for name, value in metric.metric_state.items())
    assert metric.compute().item() == pytest.approx(torch_lwlrap.multilabel_lwlrap(logits, labels).item(), abs=1e-12)


def test_both_fixes_of_minus_one_written_into_uint8_labels_score_as_the_signed_marks():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(8, 5, generator=g)
    labels = (torch.rand(8, 5, generator=g) < 0.4).long()
    labels[:, 0] = 1
    unknown = torch.rand(8, 5, generator=g) < 0.2
    unknown[:, 0] = False
    expected = torch_lwlrap.multilabel_lwlrap(logits, labels.masked_fill(unknown, -1), ignore_index=-1)
    target = labels.to(torch.uint8).masked_fill(unknown, -1)  # stored as 255
    assert torch_lwlrap.multilabel_lwlrap(logits, target, ignore_index=255) == expected
    signed = target.to(torch.int64).masked_fill(target == 255, -1)  # the message's other fix, as written there
    assert torch_lwlrap.multilabel_lwlrap(logits, signed, ignore_index=-1) == expected


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_labels_and_weights_in_unsigned_dtypes_torch_cannot_compare_get_the_conversion(name):
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(9, NUM_CLASSES, generator=g)
    labels = (torch.rand(9, NUM_CLASSES, generator=g) < 0.4).long()
    labels[:, 0] = 1
    wide = labels.to(getattr(torch, name))
    tl = torch_lwlrap
    takes_labels = [  # every public function and metric taking 0/1 labels
        tl.multilabel_lwlrap, tl.multilabel_lwlrap_per_class, tl.multilabel_lrap, tl.tie_report,
        lambda p, y: tl.multilabel_lwlrap_ci(p, y, num_bootstrap=50), lambda p, y: tl.multilabel_lrap_ci(p, y),
        lambda p, y: tl.compare_lwlrap(p, p * 0.5, y), tl.multilabel_ranking_loss, tl.multilabel_coverage_error,
        tl.multilabel_one_error, lambda p, y: tl.multilabel_retrieval_at_k(p, y, k=3),
        tl.MultilabelLWLRAP(NUM_CLASSES), tl.MultilabelLRAP(NUM_CLASSES), tl.MultilabelTieReport(NUM_CLASSES),
        tl.MultilabelRankingMetrics(NUM_CLASSES), tl.MultilabelRetrievalAtK(NUM_CLASSES, k=2),
    ]
    for call in takes_labels:
        with pytest.raises(TypeError, match=rf"`target` has dtype torch.{name}.*`target.long\(\)`"):
            call(logits, wide)
    weight = torch.arange(1, 10)
    metric = torch_lwlrap.MultilabelLRAP(num_labels=NUM_CLASSES)
    metric.update(logits, labels, sample_weight=weight)
    before = {key: value.clone() for key, value in metric.metric_state.items()}
    message = rf"`sample_weight` has dtype torch.{name}.*convert the weights with `sample_weight.double\(\)`"
    with pytest.raises(TypeError, match=message):
        metric.update(logits, labels, sample_weight=weight.to(getattr(torch, name)))
    with pytest.raises(TypeError, match=message):
        torch_lwlrap.multilabel_ranking_loss(logits, labels, sample_weight=weight.to(getattr(torch, name)))
    assert all(torch.equal(before[key], value) for key, value in metric.metric_state.items())
    # the fixes, as the messages write them, score as the signed labels and float weights
    fixed = torch_lwlrap.multilabel_lrap(logits, wide.long(), sample_weight=weight.to(getattr(torch, name)).double())
    assert fixed.item() == pytest.approx(metric.compute().item(), rel=REL)
    assert torch_lwlrap.multilabel_lwlrap(logits, wide.long()) == torch_lwlrap.multilabel_lwlrap(logits, labels)
    # validate_args=False runs no value check (the only thing torch cannot do on them): taken as given, as before
    unchecked = dict(validate_args=False)
    assert torch_lwlrap.multilabel_lwlrap(logits, wide, **unchecked) == torch_lwlrap.multilabel_lwlrap(logits, labels)
    loose = torch_lwlrap.multilabel_ranking_loss(logits, labels, sample_weight=weight.to(getattr(torch, name)), **unchecked)
    assert loose == torch_lwlrap.multilabel_ranking_loss(logits, labels, sample_weight=weight)


def _ltr_calls(logits, y) -> Dict[str, object]:
    """The rank-agreement functions on ``logits`` (a student) against ``y`` read as another system's scores."""
    other = y.double() + 0.25 * torch.arange(y.shape[1], dtype=torch.float64)
    return {
        "multilabel_ndcg": torch_lwlrap.multilabel_ndcg(logits, y.clamp(min=0), k=3),
        "multilabel_rank_correlation": torch_lwlrap.multilabel_rank_correlation(logits, other, method="kendall"),
        "multilabel_kendall_distance_at_k": torch_lwlrap.multilabel_kendall_distance_at_k(logits, other, 3),
    }


def _public_callables():
    """Every public function and metric class that takes ``validate_args``, with a call of it on a batch."""
    import inspect

    for name in sorted(torch_lwlrap.__all__):
        thing = getattr(torch_lwlrap, name)
        if not callable(thing) or name.startswith("use_") or name[0].isupper() and not name.startswith("Multilabel"):
            continue
        params = inspect.signature(thing.__init__ if inspect.isclass(thing) else thing).parameters
        if "validate_args" in params:
            yield name, thing, params


def test_validate_args_must_be_a_bool_everywhere():
    # None or 0 from a config must not switch the value checks off unseen: a target of 2s was summed before.
    p = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4]])
    t = torch.tensor([[2, 0, 2], [0, 2, 0]])
    names = []
    for name, thing, params in _public_callables():
        names.append(name)
        needs_k = "k" in params and params["k"].default is params["k"].empty
        extra = {"k": 1} if needs_k else {}
        for bad in (None, 0, "false"):
            with pytest.raises(TypeError, match=r"Argument `validate_args` must be True or False, but got "):
                if isinstance(thing, type):
                    thing(3, validate_args=bad, **extra)
                elif name == "compare_lwlrap":
                    thing(p, p, t, validate_args=bad)
                else:
                    thing(p, t, validate_args=bad, **extra)
    assert len(names) == 11 + 14, names  # every metric class and every function with the option
    metric = torch_lwlrap.MultilabelLWLRAP(3, validate_args=np.bool_(False))
    assert metric.validate_args is False
    with pytest.raises(TypeError, match="validate_args"):
        metric.validate_args = None
    assert metric.validate_args is False


def test_lazily_negated_tensors_are_read_as_their_values():
    # torch keeps a negation or conjugation as a bit (`x.conj().imag`, `torch._neg_view`): numpy refused such a
    # tensor, so the numba path raised "Can't call numpy() on Tensor that has negative bit set".
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(30, NUM_CLASSES, generator=g)
    y = (torch.rand(30, NUM_CLASSES, generator=g) < 0.3).long()
    lazy_logits = torch._neg_view(-logits)
    lazy_y = torch.complex(torch.zeros(y.shape, dtype=torch.float64), -y.double()).conj().imag
    assert lazy_logits.is_neg() and lazy_y.is_neg()
    for calls in (_calls, _ltr_calls):
        want = calls(logits, y)
        got = calls(lazy_logits, lazy_y)
        for name, value in got.items():
            torch.testing.assert_close(value, want[name], rtol=0, atol=0, equal_nan=True, msg=name)
    assert torch_lwlrap.multilabel_lwlrap(lazy_logits, lazy_y).item() == pytest.approx(
        naive_lwlrap(logits.double(), y), rel=REL
    )


def test_name_list_options_name_their_argument():
    with pytest.raises(ValueError, match=r"Argument `retrieval_metrics` must be a non-empty subset of .* got \['map'\]"):
        torch_lwlrap.MultilabelRankingMetrics(3, retrieval_metrics=["map"])
    for bad in (None, 3, ()):
        with pytest.raises(ValueError, match=r"Argument `metrics` must be a non-empty subset"):
            torch_lwlrap.MultilabelRankingMetrics(3, metrics=bad)
        with pytest.raises(ValueError, match=r"Argument `metrics` must be a non-empty subset"):
            torch_lwlrap.multilabel_retrieval_at_k(torch.rand(2, 3), torch.ones(2, 3), k=1, metrics=bad)
    # a set or a generator of names is taken, in the documented order
    metric = torch_lwlrap.MultilabelRankingMetrics(3, metrics={"lrap", "coverage_error"})
    metric.update(torch.tensor([[0.9, 0.1, 0.5]]), torch.tensor([[1, 0, 0]]))
    assert list(metric.compute()) == ["coverage_error", "lrap"]


# Dynamo's own warning whenever a graph break leaves a non-leaf tensor in the frame it resumes (any
# torch.compiler.disable'd function called on logits gives it).
@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_every_public_entry_inside_a_torch_compiled_training_step(backend, monkeypatch):
    # Dynamo traced into numba's dispatcher and raised ("exception table entry start instruction has no offset"):
    # every public function and metric method now runs eagerly there, a graph break, and the rest is compiled.
    # The wrappers that run them eagerly had shared one code object, and each took one of its recompiles: past 8 of
    # them in a step dynamo hit its recompile limit, a failure with this setting.
    import torch._dynamo

    monkeypatch.setattr(torch._dynamo.config, "fail_on_recompile_limit_hit", True, raising=False)
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(11)
    net = nn.Linear(5, NUM_CLASSES)
    teacher_net = nn.Linear(5, NUM_CLASSES)
    lwlrap = torch_lwlrap.MultilabelLWLRAP(NUM_CLASSES)
    distance = torch_lwlrap.MultilabelKendallDistanceAtK(NUM_CLASSES, 3)
    correlation = torch_lwlrap.MultilabelRankCorrelation(NUM_CLASSES, method="kendall")
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)

    def step(x, y):
        logits = net(x)
        with torch.no_grad():
            teacher = teacher_net(x)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, y.float())
        batch = (lwlrap(logits, y), distance(logits, teacher), correlation(logits, teacher))
        correlation.update(logits, teacher)  # update as well as forward: the batch counts twice
        return loss, logits, teacher, batch, {**_calls(logits, y), **_ltr_calls(logits, y)}

    compiled = torch.compile(step, backend=backend)
    seen = []
    for _ in range(3):
        x = torch.randn(16, 5, generator=g)
        y = (torch.rand(16, NUM_CLASSES, generator=g) < 0.3).long()
        loss, logits, teacher, batch, got = compiled(x, y)
        optimizer.zero_grad()
        loss.backward()
        assert net.weight.grad is not None and net.weight.grad.abs().sum() > 0
        optimizer.step()
        logits, teacher = logits.detach(), teacher.detach()
        want = {**_calls(logits, y), **_ltr_calls(logits, y)}
        for name, value in got.items():
            torch.testing.assert_close(value, want[name], rtol=0, atol=0, equal_nan=True, msg=name)
        assert batch[0].item() == pytest.approx(naive_lwlrap(logits.double(), y), rel=REL)
        assert batch[1].item() == torch_lwlrap.multilabel_kendall_distance_at_k(logits, teacher, 3).item()
        seen.append((logits, teacher, y))
    logits, teacher, y = (torch.cat(parts) for parts in zip(*seen))
    assert lwlrap.compute().item() == pytest.approx(naive_lwlrap(logits.double(), y), rel=REL)
    assert distance.compute().item() == pytest.approx(
        torch_lwlrap.multilabel_kendall_distance_at_k(logits, teacher, 3).item(), rel=REL
    )
    both = torch_lwlrap.multilabel_rank_correlation(torch.cat([logits, logits]), torch.cat([teacher, teacher]),
                                                    method="kendall")
    assert correlation.compute().item() == pytest.approx(both.item(), rel=REL)


def test_metrics_created_inside_a_compiled_function_work_as_outside():
    # Dynamo traced the constructor and left the object without its states: "'MultilabelLWLRAP' object has no
    # attribute '_defaults'" at the first update. Each metric's constructor now runs eagerly there.
    preds = torch.tensor([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2], [0.9, 0.3, 0.5]])
    target = torch.tensor([[1, 0, 1], [0, 1, 1], [1, 0, 0]])
    makers = {
        "lwlrap": lambda: torch_lwlrap.MultilabelLWLRAP(num_labels=3),
        "lrap": lambda: torch_lwlrap.MultilabelLRAP(num_labels=3, num_bootstrap=20, bootstrap_seed=1),
        "coverage": lambda: torch_lwlrap.MultilabelCoverageError(3),
        "ndcg": lambda: torch_lwlrap.MultilabelNDCG(3, k=2),
    }

    def step(p, y):
        values = {}
        for name, make in makers.items():
            metric = make()
            metric.update(p * 1.0, y)
            values[name] = metric.compute()
        return values

    got = torch.compile(step, backend="eager")(preds, target)
    want = step(preds, target)
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
    assert want["lwlrap"].item() == pytest.approx(naive_lwlrap(preds.double(), target), rel=REL)


@pytest.mark.parametrize("bad", ["10", 1.5, True, 0, -3])
def test_use_engine_takes_a_positive_integer_chunk_size(bad):
    # '10' was taken and failed at the first call inside the block; 1.5 and True were taken as sizes.
    with pytest.raises(ValueError, match=r"Argument `chunk_elements` must be a positive integer or None, but got "):
        with use_engine("sort", chunk_elements=bad):
            pass
    with use_engine("sort", chunk_elements=np.int64(50)):
        assert torch_lwlrap.multilabel_lwlrap(torch.tensor([[0.9, 0.1]]), torch.tensor([[1, 0]])).item() == 1.0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -2.0])
@pytest.mark.parametrize("call", ["multilabel_coverage_error", "multilabel_lrap_ci", "multilabel_ndcg",
                                  "MultilabelRankingLoss"])
def test_sample_weight_errors_name_the_values_and_the_first_place(bad, call):
    preds = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4], [0.3, 0.6, 0.1], [0.5, 0.4, 0.7]])
    target = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]])
    weights = torch.tensor([1.0, 1.0, bad, bad])
    calls = {
        "multilabel_coverage_error": lambda: torch_lwlrap.multilabel_coverage_error(preds, target, sample_weight=weights),
        "multilabel_lrap_ci": lambda: torch_lwlrap.multilabel_lrap_ci(preds, target, sample_weight=weights,
                                                                      num_bootstrap=20),
        "multilabel_ndcg": lambda: torch_lwlrap.multilabel_ndcg(preds, target, sample_weight=weights),
        "MultilabelRankingLoss": lambda: torch_lwlrap.MultilabelRankingLoss(3).update(preds, target, weights),
    }
    shown = "nan" if math.isnan(bad) else repr(bad)
    with pytest.raises(ValueError, match=rf"^Argument `sample_weight` must be non-negative and finite, but found the "
                                         rf"values \[{shown}\] \(first at index \(2,\)\): give each sample a weight "
                                         rf"of 0 or more \(0 leaves it out\)\.(\n\(raised by .*\))?$"):
        calls[call]()


def test_integer_options_may_be_tensors_of_no_dimension():
    """Hyperparameters are often kept as tensors: ``k=torch.tensor(2)`` had been refused as not an integer."""
    preds = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4], [0.3, 0.6, 0.1]])
    target = torch.tensor([[1, 0, 0], [0, 1, 1], [0, 0, 1]])
    want = torch_lwlrap.multilabel_retrieval_at_k(preds, target, k=2)
    got = torch_lwlrap.multilabel_retrieval_at_k(preds, target, k=torch.tensor(2))
    assert got.keys() == want.keys() and all(torch.equal(got[name], want[name]) for name in want)
    metric = torch_lwlrap.MultilabelRetrievalAtK(torch.tensor(3, dtype=torch.int32), k=torch.tensor(2))
    metric.update(preds, target)
    assert metric.num_labels == 3 and type(metric.num_labels) is int
    assert all(torch.equal(value, want[name]) for name, value in metric.compute().items())
    assert torch_lwlrap.multilabel_kendall_distance_at_k(preds, target.float(), torch.tensor(2)).item() == \
        torch_lwlrap.multilabel_kendall_distance_at_k(preds, target.float(), 2).item()
    several = torch_lwlrap.multilabel_retrieval_at_k(preds, target, k=torch.tensor([1, 2]))  # a sequence of cut-offs
    assert several.keys() == torch_lwlrap.multilabel_retrieval_at_k(preds, target, k=(1, 2)).keys()
    for bad in (torch.tensor(2.0), torch.tensor(True), torch.tensor(0)):
        with pytest.raises(ValueError, match=r"Argument `k` must be a positive integer"):
            torch_lwlrap.multilabel_retrieval_at_k(preds, target, k=bad)


def test_messages_name_the_argument_the_user_passed():
    p = torch.rand(2, 3)
    with pytest.raises(ValueError, match=r"Argument `num_labels` must be a positive integer, but got 0"):
        torch_lwlrap.multilabel_lwlrap(p, torch.ones(2, 3), num_labels=0)  # was "Expected 0 labels"
    with pytest.raises(TypeError, match=r"convert it with `torch.as_tensor\(relevance\)`"):
        torch_lwlrap.multilabel_ndcg(p, np.ones((2, 3)))
    with pytest.raises(TypeError, match=r"convert them with `reference.float\(\)`"):
        torch_lwlrap.multilabel_rank_correlation(p, torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match=r"convert them with `preds_b.float\(\)`"):
        torch_lwlrap.multilabel_kendall_distance_at_k(p, torch.ones(2, 3, dtype=torch.long), 1)
    metric = torch_lwlrap.MultilabelKendallDistanceAtK(3, 1)
    with pytest.raises(ValueError, match=r"Argument `preds_a` is on meta but the state of MultilabelKendallDistanceAtK"):
        metric.update(p.to("meta"), p)
    with pytest.raises(ValueError, match=r"Argument `preds_a` is on meta"):
        metric.update(preds_a=p.to("meta"), preds_b=p)


def test_compare_without_positive_labels_warns_once():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = torch_lwlrap.compare_lwlrap(torch.rand(3, 4), torch.rand(3, 4), torch.zeros(3, 4, dtype=torch.long),
                                             num_bootstrap=10, seed=0)
    assert torch.isnan(result.value_a) and torch.isnan(result.value_b)
    undefined = [str(w.message) for w in caught if "undefined" in str(w.message)]
    assert undefined == ["lwlrap is undefined without any positive label: no target was 1 (returning NaN)."]


def test_warnings_point_at_the_user_s_line():
    # eager_only's wrapper (and torchmetrics' around a metric's methods) sit between the user and the warning:
    # a fixed stacklevel filed it under the package's own files, where filters by module no longer matched.
    p = torch.rand(4, 3)
    none = torch.zeros(4, 3, dtype=torch.long)
    metric = torch_lwlrap.MultilabelLWLRAP(3)
    metric.update(p, none)
    calls = {
        "multilabel_lwlrap": lambda: torch_lwlrap.multilabel_lwlrap(p, none),
        "multilabel_lrap": lambda: torch_lwlrap.multilabel_lrap(p[:0], none[:0]),
        "multilabel_lwlrap_ci": lambda: torch_lwlrap.multilabel_lwlrap_ci(p, none + torch.eye(4, 3, dtype=torch.long),
                                                                          num_bootstrap=5, seed=0),
        "compute": lambda: metric.compute(),
        "per_class": lambda: torch_lwlrap.MultilabelLWLRAP(3).per_class(),
        "MultilabelRankingMetrics": lambda: torch_lwlrap.MultilabelRankingMetrics(3, metrics="lrap", k=3),
    }
    for name, call in calls.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call()
        assert caught, name
        assert {w.filename for w in caught} == {__file__}, (name, [(w.filename, str(w.message)) for w in caught])


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
def test_errors_inside_a_compiled_step_name_the_user_s_call():
    p = torch.rand(4, 3)
    t = torch.eye(4, 3, dtype=torch.long)
    metric = torch_lwlrap.MultilabelLWLRAP(3)
    cases = {
        "`metric.update(preds=scores, target=labels)` on your MultilabelLWLRAP": lambda x, y: metric.update(y, x),
        "`metric(preds=scores, target=labels)` on your MultilabelLWLRAP": lambda x, y: metric(y, x),
        "`multilabel_lwlrap(preds=scores, target=labels)`": lambda x, y: torch_lwlrap.multilabel_lwlrap(y, x),
    }
    for words, step in cases.items():
        with pytest.raises(TypeError, match="look swapped") as error:
            torch.compile(step, backend="eager")(p, t)
        assert words in str(error.value), str(error.value)
    distance = torch_lwlrap.MultilabelKendallDistanceAtK(3, 2)
    with pytest.raises(ValueError, match=r"Argument `preds_a` is on meta"):
        distance(p.to("meta"), p.to("meta"))  # forward names the metric's own argument too


def test_an_lrap_interval_counts_frames_of_per_frame_weights_once():
    # (N, T) weights already hold one weight per sample: the count multiplied the frames in a second time.
    g = torch.Generator().manual_seed(2)
    preds = torch.rand(1, 4, 3, generator=g)
    target = (torch.rand(1, 4, 3, generator=g) < 0.5).long()
    lrap_ci = torch_lwlrap.multilabel_lrap_ci
    lone = lrap_ci(preds, target, sample_weight=torch.tensor([[1.0, 0.0, 0.0]]), num_bootstrap=200, seed=0)
    assert torch.isnan(lone.low) and torch.isnan(lone.high)  # one sample of non-zero weight
    two = lrap_ci(preds, target, sample_weight=torch.tensor([[1.0, 2.0, 0.0]]), num_bootstrap=200, seed=0)
    assert not torch.isnan(two.low)
    frames = lrap_ci(preds, target, sample_weight=torch.tensor([1.0]), num_bootstrap=200, seed=0)
    assert not torch.isnan(frames.low)  # (N,) weights weigh each of the sample's 3 frames


@pytest.mark.filterwarnings("ignore:The .grad attribute of a Tensor that is not a leaf Tensor:UserWarning")
def test_the_metrics_reading_methods_inside_a_compiled_step_give_their_eager_values():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(40, NUM_CLASSES, generator=g)
    y = (torch.rand(40, NUM_CLASSES, generator=g) < 0.3).long()
    lwlrap = torch_lwlrap.MultilabelLWLRAP(NUM_CLASSES, num_bootstrap=50, bootstrap_seed=0)
    ties = torch_lwlrap.MultilabelTieReport(NUM_CLASSES)
    correlation = torch_lwlrap.MultilabelRankCorrelation(NUM_CLASSES)
    lwlrap.update(logits, y)
    ties.update(logits.round(), y)
    correlation.update(logits, torch.cat([logits[:5].clamp(max=0) * 0, logits[5:]]))  # 5 constant rows

    def read():
        return (lwlrap.per_class(), lwlrap.confidence_interval(), lwlrap.bootstrap_samples(),
                correlation.constant_rows(), ties.report())

    got, want = torch.compile(read, backend="eager")(), read()
    # each runs eagerly there (a graph break), as update, forward and compute do: dynamo never traces its reads
    from torch_lwlrap._engine_config import eager_only

    wrapper = eager_only(len).__code__  # the wrapper's code, a copy of its own for each function wrapped
    for method in (lwlrap.per_class, lwlrap.confidence_interval, lwlrap.bootstrap_samples,
                   correlation.constant_rows, ties.report, lwlrap.forward, lwlrap.update, lwlrap.compute):
        code = method.__code__
        assert code.co_code == wrapper.co_code and code.co_filename == wrapper.co_filename, method
        assert code.co_qualname.startswith("eager_only.<") and code.co_name == method.__name__, method
    for a, b in zip(got[:4], want[:4]):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    assert got[4] == want[4] and int(got[3]) == 5
