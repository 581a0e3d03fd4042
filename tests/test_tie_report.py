"""``tie_report``: counts of tied positives and lwlrap's exact range over tie orders, against brute force."""

from __future__ import annotations

import importlib.util
import math
from fractions import Fraction

import pytest
import torch

from tests.conftest import ENGINE_PATHS
from tests.reference import naive_lwlrap
from tests.test_ties_expected import heavy_ties, orders_of_row
from torch_lwlrap import multilabel_lwlrap, tie_report
from torch_lwlrap._ranking import use_engine

HAS_NUMBA = importlib.util.find_spec("numba") is not None


def brute_force_range(preds, target, ignore_index=None):
    """(min, max) of weighted lwlrap over every order of tied labels, rows chosen independently, as fractions."""
    low = high = Fraction(0)
    count = 0
    for scores, labels in zip(preds, target):
        known = [k for k in range(len(scores)) if ignore_index is None or labels[k] != ignore_index]
        positives = {k for k in known if labels[k] == 1}
        count += len(positives)
        totals = []
        for order in orders_of_row(scores, known):
            hits, total = 0, Fraction(0)
            for rank, k in enumerate(order, 1):
                if k in positives:
                    hits += 1
                    total += Fraction(hits, rank)
            totals.append(total)
        low += min(totals)
        high += max(totals)
    return low / count, high / count


def tied_positives(preds, target, ignore_index=None):
    tied = count = 0
    for scores, labels in zip(preds, target):
        known = [k for k in range(len(scores)) if ignore_index is None or labels[k] != ignore_index]
        for j in known:
            if labels[j] == 1:
                count += 1
                tied += any(scores[k] == scores[j] for k in known if k != j)
    return tied, count


@pytest.mark.parametrize("engine", ENGINE_PATHS)
@pytest.mark.parametrize("seed,num_classes,levels,ignore", [(0, 7, 1, False), (1, 7, 2, True), (2, 6, 3, True),
                                                            (4, 7, 5, True)])
def test_range_counts_and_values_against_brute_force(engine, seed, num_classes, levels, ignore):
    preds, target = heavy_ties(seed, 10, num_classes, levels, ignore)
    ignore_index = -1 if ignore else None
    rows, labels = preds.tolist(), target.tolist()
    low, high = brute_force_range(rows, labels, ignore_index)
    tied, count = tied_positives(rows, labels, ignore_index)
    with use_engine(engine, 3 * num_classes):
        report = tie_report(preds, target, ignore_index=ignore_index)
    assert (report.tied_label_count, report.label_count) == (tied, count)
    assert report.tied_share == tied / count
    assert abs(Fraction(report.lwlrap_worst) - low) <= low * Fraction(1, 10**12)
    assert abs(Fraction(report.lwlrap_best) - high) <= high * Fraction(1, 10**12)
    assert report.lwlrap_max == pytest.approx(naive_lwlrap(rows, labels, "max", ignore_index), abs=1e-12)
    assert report.lwlrap_expected == pytest.approx(naive_lwlrap(rows, labels, "expected", ignore_index), abs=1e-12)
    assert report.lwlrap_worst <= report.lwlrap_expected <= report.lwlrap_best
    assert report.lwlrap_worst <= report.lwlrap_max  # and possibly above the best: the test below
    assert report.has_ties == (tied > 0)


def test_max_is_never_below_the_worst_order_but_may_be_above_the_best():
    # the docstring's example: a negative first, two tied positives; 2/3 each under "max", 1/2 and 2/3 by order
    report = tie_report(torch.tensor([[0.9, 0.5, 0.5]]), torch.tensor([[0, 1, 1]]))
    assert report.lwlrap_max == pytest.approx(2 / 3, abs=1e-15)
    assert report.lwlrap_best == report.lwlrap_worst == pytest.approx(7 / 12, abs=1e-15)
    above = 0
    for seed in range(60):
        preds, target = heavy_ties(seed, 1, 6, 3, False)  # one row: a whole batch averages the effect away
        rows, labels = preds.tolist(), target.tolist()
        if not any(1 in row for row in labels):
            continue
        low, high = brute_force_range(rows, labels, None)
        report = tie_report(preds, target)
        assert Fraction(report.lwlrap_max) >= low * (1 - Fraction(1, 10**12))
        above += Fraction(report.lwlrap_max) > high * (1 + Fraction(1, 10**12))
    assert above > 0  # cases where it is above every order occur among these


@pytest.mark.parametrize("engine", ENGINE_PATHS)
def test_without_ties_every_value_is_the_same(engine):
    generator = torch.Generator().manual_seed(4)
    preds = torch.randn(40, 25, generator=generator, dtype=torch.float64)
    target = torch.randint(2, (40, 25), generator=generator)
    with use_engine(engine):
        report = tie_report(preds, target)
    assert not report.has_ties and report.tied_share == 0
    value = multilabel_lwlrap(preds, target).item()
    for got in (report.lwlrap_max, report.lwlrap_expected, report.lwlrap_best, report.lwlrap_worst):
        assert got == pytest.approx(value, rel=1e-15)


def test_saturated_sigmoid_report_and_logits():
    """The user's case: sigmoid probabilities in float32 tie at 1.0; the logits they came from do not."""
    generator = torch.Generator().manual_seed(1)
    target = (torch.rand(200, 20, generator=generator) < 0.1).long()
    logits = 30 * torch.randn(200, 20, generator=generator) + 20 * target
    report = tie_report(torch.sigmoid(logits), target)
    assert report.has_ties and report.lwlrap_worst < report.lwlrap_best
    assert not tie_report(logits, target).has_ties
    assert set(report.as_dict()) == {"label_count", "tied_label_count", "tied_share", "lwlrap_max",
                                     "lwlrap_expected", "lwlrap_best", "lwlrap_worst"}


def test_no_positive_and_bad_input():
    report = tie_report(torch.zeros(2, 3), torch.zeros(2, 3))
    assert report.label_count == 0 and math.isnan(report.tied_share) and math.isnan(report.lwlrap_best)
    with pytest.raises(ValueError, match="NaN"):
        tie_report(torch.tensor([[0.5, float("nan")]]), torch.tensor([[1, 0]]))
    with pytest.raises(ValueError, match="target"):
        tie_report(torch.zeros(2, 3), torch.full((2, 3), 2))


# ---------------------------------------------------------------------------------------------------------------
# MultilabelTieReport: the same report accumulated over batches, as sum-only states

from torch_lwlrap import MultilabelTieReport  # noqa: E402

VALUE_NAMES = ["tied_share", "lwlrap_max", "lwlrap_expected", "lwlrap_best", "lwlrap_worst"]


def brute_force_values(preds, target, ignore_index=None):
    """The metric's compute() from the definitions: counts and max/expected from the naive loops, the range from
    every tie order."""
    rows, labels = preds.tolist(), target.tolist()
    low, high = brute_force_range(rows, labels, ignore_index)
    tied, count = tied_positives(rows, labels, ignore_index)
    return {
        "tied_share": tied / count,
        "lwlrap_max": naive_lwlrap(rows, labels, "max", ignore_index),
        "lwlrap_expected": naive_lwlrap(rows, labels, "expected", ignore_index),
        "lwlrap_best": float(high),
        "lwlrap_worst": float(low),
    }


def assert_values(got, want):
    assert list(got) == VALUE_NAMES
    for name in VALUE_NAMES:
        assert got[name].dtype == torch.float64 and got[name].ndim == 0, name
        assert got[name].item() == pytest.approx(float(want[name]), rel=1e-12, abs=1e-12), name


@pytest.mark.parametrize("engine", ENGINE_PATHS)
@pytest.mark.parametrize("ignore", [False, True])
def test_metric_over_batches_equals_the_report_of_all_and_brute_force(engine, ignore):
    preds, target = heavy_ties(5, 24, 6, 3, ignore)
    ignore_index = -1 if ignore else None
    metric = MultilabelTieReport(6, ignore_index=ignore_index)
    with use_engine(engine, 18):
        for start, stop in [(0, 5), (5, 5), (5, 17), (17, 24)]:  # uneven batches, one of them empty
            metric.update(preds[start:stop], target[start:stop])
        whole = tie_report(preds, target, ignore_index=ignore_index)
    assert_values(metric.compute(), brute_force_values(preds, target, ignore_index))
    report = metric.report()
    assert (report.label_count, report.tied_label_count) == (whole.label_count, whole.tied_label_count)
    for name in VALUE_NAMES:
        assert getattr(report, name) == pytest.approx(getattr(whole, name), rel=1e-12, abs=1e-12)


def test_metric_forward_returns_the_batch_and_keeps_the_rest():
    preds, target = heavy_ties(6, 20, 5, 2, False)
    metric = MultilabelTieReport(5)
    first = metric(preds[:8], target[:8])
    assert_values(first, brute_force_values(preds[:8], target[:8]))
    assert_values(metric(preds[8:], target[8:]), brute_force_values(preds[8:], target[8:]))
    assert_values(metric.compute(), brute_force_values(preds, target))
    metric.reset()
    metric.update(preds[:0], target[:0])
    assert metric.label_count.item() == 0 and math.isnan(metric.compute()["lwlrap_max"].item())


def test_metric_rejects_a_bad_batch_without_touching_its_state():
    preds, target = heavy_ties(7, 12, 5, 2, False)
    metric = MultilabelTieReport(5)
    metric.update(preds, target)
    before = {name: value.clone() for name, value in metric.metric_state.items()}
    bad = [
        (torch.full((2, 5), float("nan")), target[:2], "NaN"),
        (preds[:2], torch.full((2, 5), 3), "target"),
        (preds[:2, :4], target[:2, :4], "num_labels"),
    ]
    for bad_preds, bad_target, message in bad:
        for call in (metric.update, metric):
            with pytest.raises(ValueError, match=message):
                call(bad_preds, bad_target)
            for name, value in metric.metric_state.items():
                assert torch.equal(value, before[name]), (message, name)


def test_metric_on_training_outputs_and_inference_mode_states():
    """The user's forms: sigmoid of logits that carry gradients, bfloat16 autocast outputs, and states made under
    inference_mode (a validation loop) updated outside it and back."""
    generator = torch.Generator().manual_seed(8)
    net = torch.nn.Linear(6, 10)
    features = torch.randn(32, 6, generator=generator)
    target = (torch.rand(32, 10, generator=generator) < 0.2).long()
    probabilities = torch.sigmoid(40 * net(features))  # saturates at exactly 1.0 in float32
    assert probabilities.requires_grad
    with torch.inference_mode():
        metric = MultilabelTieReport(10)
        metric.update(probabilities[:16], target[:16])
    metric.update(probabilities[16:], target[16:])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low_precision = torch.sigmoid(net(features))
    with torch.inference_mode():
        metric.update(low_precision, target)
    want = tie_report(torch.cat([probabilities.detach(), low_precision.detach().float()]), torch.cat([target] * 2))
    got = metric.report()
    assert got.has_ties and (got.label_count, got.tied_label_count) == (want.label_count, want.tied_label_count)
    assert got.lwlrap_expected == pytest.approx(want.lwlrap_expected, rel=1e-12)
    assert probabilities.grad_fn is not None  # still attached: nothing was done to it in place


def test_metric_keeps_float64_sums_when_the_model_is_cast():
    metric = MultilabelTieReport(3)
    metric.update(torch.tensor([[1.0, 1.0, 0.5]]), torch.tensor([[1, 0, 1]]))  # sums 1/2, 1/2, 2/3 per rule
    before = metric.precision_sum.clone()
    metric.to(torch.bfloat16)
    assert metric.precision_sum.dtype == torch.float64 and torch.equal(metric.precision_sum, before)


@pytest.mark.filterwarnings("ignore::UserWarning:lightning")
@pytest.mark.filterwarnings("ignore::FutureWarning:lightning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:lightning")
def test_metric_in_lightning_steps(tmp_path):
    """training_step logs the report of each batch of sigmoid outputs; the validation epoch logs the accumulated
    one with log_dict. Both equal tie_report over the same outputs."""
    L = pytest.importorskip("lightning")
    from lightning.pytorch.callbacks import Callback
    from torch.utils.data import DataLoader, TensorDataset

    generator = torch.Generator().manual_seed(9)
    features = torch.randn(40, 6, generator=generator)
    labels = (torch.rand(40, 8, generator=generator) < 0.25).long()

    class Tagger(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(6, 8)
            self.train_ties = MultilabelTieReport(num_labels=8)
            self.val_ties = MultilabelTieReport(num_labels=8)
            self.seen = {"train": [], "val": []}

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            probabilities = torch.sigmoid(30 * logits)
            self.seen["train"].append((probabilities.detach().clone(), y.clone()))
            self.log_dict({f"train_{k}": v for k, v in self.train_ties(probabilities, y).items()})
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, y.float())

        def validation_step(self, batch, batch_idx):
            x, y = batch
            probabilities = torch.sigmoid(30 * self.net(x))
            if not self.trainer.sanity_checking:
                self.seen["val"].append((probabilities.clone(), y.clone()))
            self.val_ties.update(probabilities, y)

        def on_validation_epoch_end(self):
            self.log_dict({f"val_{k}": v for k, v in self.val_ties.compute().items()})
            self.val_ties.reset()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Record(Callback):
        def __init__(self):
            self.train, self.val = [], None

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.train.append(trainer.callback_metrics["train_lwlrap_expected"].item())

        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                self.val = {k: trainer.callback_metrics[f"val_{k}"].item() for k in VALUE_NAMES}

    data = DataLoader(TensorDataset(features, labels), batch_size=10)
    model, record = Tagger(), Record()
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, callbacks=[record],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=1, default_root_dir=tmp_path)
    trainer.fit(model, data, data)
    assert len(record.train) == len(model.seen["train"]) == 4
    for logged, (probabilities, y) in zip(record.train, model.seen["train"]):
        assert logged == pytest.approx(tie_report(probabilities, y).lwlrap_expected, rel=1e-6)  # logged as float32
    want = tie_report(torch.cat([p for p, _ in model.seen["val"]]), torch.cat([y for _, y in model.seen["val"]]))
    assert want.has_ties
    for name in VALUE_NAMES:
        assert record.val[name] == pytest.approx(getattr(want, name), rel=1e-6)


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
def test_sorted_rows_and_several_blocks_end_to_end(monkeypatch):
    """ties="expected" and the tie report with every row sorted and blocks of a few positives: the numba pass's
    other branches (all positives of sorted rows handed over; untied sums from several blocks) give the references."""
    from torch_lwlrap import _numba_counts, _numba_kernel

    preds, target = heavy_ties(12, 30, 6, 3, True)
    rows, labels = preds.tolist(), target.tolist()
    want_expected = naive_lwlrap(rows, labels, "expected", -1)
    low, high = brute_force_range(rows, labels, -1)
    monkeypatch.setattr(_numba_kernel, "SORT_POSITIVES_PER_LOG2", 0)  # every row with a positive is sorted
    monkeypatch.setitem(_numba_counts.label_counts_numba.__kwdefaults__, "max_positives", 4)
    with use_engine("numba"):
        got = multilabel_lwlrap(preds, target, ignore_index=-1, ties="expected").item()
        report = tie_report(preds, target, ignore_index=-1)
        blocks = list(_numba_counts.label_counts_numba(preds, target == 1, target != -1, defer_untied=True)[1])
    assert len(blocks) > 3 and all(block.rows.numel() == block.untied.sample_label_count.sum() for block in blocks)
    assert got == pytest.approx(want_expected, rel=1e-12)
    assert report.lwlrap_expected == pytest.approx(want_expected, rel=1e-12)
    assert report.lwlrap_worst == pytest.approx(float(low), rel=1e-12)
    assert report.lwlrap_best == pytest.approx(float(high), rel=1e-12)


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed")
def test_report_does_not_depend_on_the_number_of_threads():
    """Sums of more than 32768 precisions: torch would split them between its threads."""
    generator = torch.Generator().manual_seed(13)
    preds = torch.randint(50, (2000, 527), generator=generator).float()
    target = torch.rand(2000, 527, generator=generator) < 0.05
    threads = torch.get_num_threads()
    try:
        reports = []
        for count in (1, 2):
            torch.set_num_threads(count)
            reports.append(tie_report(preds, target))
    finally:
        torch.set_num_threads(threads)
    assert reports[0].tied_label_count > 32768
    assert reports[0] == reports[1]
