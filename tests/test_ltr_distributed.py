"""The learning-to-rank metrics across processes and in a Lightning loop: two gloo ranks with uneven shards (one with
an empty batch) agree with one process over all the data, a ``validation_step`` logs the Kendall distance at 10
between a student's and a teacher's logits, and a distillation ``training_step`` logs Spearman, Kendall and the
distance at 5 of each batch from logits that carry gradients (float32, and bfloat16 under "bf16-mixed")."""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from tests.reference_ranking import naive_distance, scipy_mean
from tests.test_distributed import run_ranks
from tests.test_ltr_metrics import naive_ndcg
from torch_lwlrap import (
    MultilabelKendallDistanceAtK,
    MultilabelNDCG,
    MultilabelRankCorrelation,
    multilabel_kendall_distance_at_k,
)

WORLD_SIZE = 2
NUM_LABELS = 6
TIMEOUT_S = 120

#: batches per rank: uneven, and an empty batch on rank 1
SHARDS = {0: [0, 1, 2], 1: [3, "empty"]}


def make_metrics():
    return {
        "ndcg": MultilabelNDCG(NUM_LABELS, k=3, ties="expected", ignore_index=-1),
        "spearman": MultilabelRankCorrelation(NUM_LABELS),
        "kendall": MultilabelRankCorrelation(NUM_LABELS, method="kendall"),
        "distance": MultilabelKendallDistanceAtK(NUM_LABELS, k=2),
        # float32 sums (set_dtype), int64 counts: the ranks' counts add up exactly
        "kendall float32": MultilabelRankCorrelation(NUM_LABELS, method="kendall").set_dtype(torch.float32),
    }


def make_batches():
    g = torch.Generator().manual_seed(23)
    batches = []
    for n in (7, 12, 9, 15):
        a = torch.randint(0, 4, (n, NUM_LABELS), generator=g).double()
        b = torch.randint(0, 4, (n, NUM_LABELS), generator=g).double()
        a[0] = 1.0  # a constant row in every batch
        grades = torch.randint(0, 3, (n, NUM_LABELS), generator=g).double()
        grades[torch.rand(n, NUM_LABELS, generator=g) < 0.1] = -1
        batches.append((a, b, grades))
    return batches


def _step(name, metric, batch):
    a, b, grades = batch
    metric.update(a, grades if name == "ndcg" else b)


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60)
    )
    batches = make_batches()
    empty = tuple(x[:0] for x in batches[0])
    results = {}
    for name, metric in make_metrics().items():
        for index in SHARDS[rank]:
            _step(name, metric, empty if index == "empty" else batches[index])
        results[name] = metric.compute()
        if name.startswith(("spearman", "kendall")):
            results[name + " constant rows"] = metric.constant_rows()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_two_ranks_compute_the_value_over_all_shards(tmp_path):
    ranks = run_ranks(_worker, tmp_path, WORLD_SIZE, TIMEOUT_S)
    batches = make_batches()
    a = torch.cat([b[0] for b in batches])
    b = torch.cat([b[1] for b in batches])
    grades = torch.cat([b[2] for b in batches])
    want = {
        "ndcg": naive_ndcg(a, grades, 3, "exponential", "expected", ignore_index=-1),
        "distance": naive_distance(a, b, 2),
    }
    for method in ("spearman", "kendall"):
        want[method], want[method + " constant rows"] = scipy_mean(a, b, method)
    assert want["spearman constant rows"] >= 4
    for rank, results in enumerate(ranks):
        single = make_metrics()
        for name, metric in single.items():
            for batch in batches:
                _step(name, metric, batch)
            exact = name != "kendall float32"  # float32 sums added in another order across the ranks
            torch.testing.assert_close(results[name], metric.compute(), rtol=1e-13 if exact else 1e-6, atol=1e-15)
        for key, value in want.items():
            assert results[key].item() == pytest.approx(value, rel=1e-12, abs=1e-12), (rank, key)
        assert results["kendall float32"].item() == pytest.approx(want["kendall"], rel=1e-6)
        assert results["kendall float32 constant rows"].dtype == torch.int64
        assert results["kendall float32 constant rows"].item() == want["kendall constant rows"]


def _features_and_teacher(rows, num_labels, seeds):
    """Eight features per clip and a frozen linear teacher over them (seeds: the features', the teacher's)."""
    features = torch.randn(rows, 8, generator=torch.Generator().manual_seed(seeds[0]))
    torch.manual_seed(seeds[1])
    return features, torch.nn.Linear(8, num_labels).requires_grad_(False)


# Lightning's own advice (workers, logging intervals) and its deprecation notices; the library's warnings still fail.
@pytest.mark.filterwarnings("ignore::UserWarning:lightning")
@pytest.mark.filterwarnings("ignore::FutureWarning:lightning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:lightning")
def test_lightning_validation_step_logs_the_kendall_distance_between_student_and_teacher(tmp_path):
    L = pytest.importorskip("lightning")
    from torch import nn

    num_labels = 30
    features, teacher = _features_and_teacher(90, num_labels, seeds=(31, 3))
    seen = []

    class Student(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, num_labels)
            self.agreement = MultilabelKendallDistanceAtK(num_labels, k=10)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            return nn.functional.mse_loss(self.net(x), teacher(x))

        def validation_step(self, batch, batch_idx):
            (x,) = batch
            with torch.enable_grad():
                student_logits = self.net(x)
                assert student_logits.requires_grad
                self.agreement(student_logits, teacher(x))
            seen.append((student_logits.detach(), teacher(x)))
            self.log("val_kendall_distance_at_10", self.agreement, on_epoch=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)  # the weights stay put: logits seen == logits scored

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features), batch_size=32)  # 32, 32, 26
    trainer = L.Trainer(
        max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Student(), loader, loader)
    logged = trainer.callback_metrics["val_kendall_distance_at_10"].item()
    student_logits = torch.cat([s for s, _ in seen])
    teacher_logits = torch.cat([t for _, t in seen])
    assert len(student_logits) == 90
    assert logged == pytest.approx(naive_distance(student_logits, teacher_logits, 10), abs=1e-6)
    assert 0.05 < logged < 0.95  # an untrained student neither agrees with its teacher nor reverses it
    assert multilabel_kendall_distance_at_k(student_logits, teacher_logits, 10).item() == pytest.approx(logged, abs=1e-6)


# Lightning's own advice (workers, logging intervals) and its deprecation notices; the library's warnings still fail.
@pytest.mark.filterwarnings("ignore::UserWarning:lightning")
@pytest.mark.filterwarnings("ignore::FutureWarning:lightning")
@pytest.mark.filterwarnings("ignore::DeprecationWarning:lightning")
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_lightning_training_step_logs_the_agreement_of_a_distilled_student_on_grad_carrying_logits(
    tmp_path, precision
):
    # Distillation: each training step scores the student's logits (which carry gradients, bfloat16 under
    # "bf16-mixed", so with ties) against the teacher's and logs the batch's values, then steps the optimizer.
    L = pytest.importorskip("lightning")
    from torch import nn

    num_labels = 40
    features, teacher = _features_and_teacher(96, num_labels, seeds=(41, 4))
    seen, logged = [], []

    class Student(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, num_labels)
            self.spearman = MultilabelRankCorrelation(num_labels)
            self.kendall = MultilabelRankCorrelation(num_labels, method="kendall")
            self.agreement = MultilabelKendallDistanceAtK(num_labels, k=5)

        def training_step(self, batch, batch_idx):
            (x,) = batch
            student_logits, teacher_logits = self.net(x), teacher(x)
            assert student_logits.requires_grad and not teacher_logits.requires_grad
            seen.append((student_logits.detach().clone(), teacher_logits.clone()))
            self.log("train_spearman", self.spearman(student_logits, teacher_logits))
            self.log("train_kendall", self.kendall(student_logits, teacher_logits))
            self.log("train_kendall_distance_at_5", self.agreement(student_logits, teacher_logits))
            return nn.functional.mse_loss(student_logits.float(), teacher_logits.float())

        def on_train_batch_end(self, outputs, batch, batch_idx):
            metrics = self.trainer.callback_metrics
            logged.append(tuple(metrics[name].item() for name in
                                ("train_spearman", "train_kendall", "train_kendall_distance_at_5")))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.3)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features), batch_size=32)
    trainer = L.Trainer(
        max_epochs=2, accelerator="cpu", devices=1, precision=precision, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
    )
    student = Student()
    start = student.net.weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(student, loader)
    assert not torch.equal(start, student.net.weight), "the optimizer never stepped: the loss lost its graph"
    assert len(seen) == len(logged) == 6
    for (student_logits, teacher_logits), (spearman, kendall, distance) in zip(seen, logged):
        assert student_logits.dtype == (torch.bfloat16 if precision == "bf16-mixed" else torch.float32)
        assert spearman == pytest.approx(scipy_mean(student_logits, teacher_logits, "spearman")[0], abs=1e-6)
        assert kendall == pytest.approx(scipy_mean(student_logits, teacher_logits, "kendall")[0], abs=1e-6)
        assert distance == pytest.approx(naive_distance(student_logits, teacher_logits, 5), abs=1e-6)
    assert logged[0] != logged[-1]  # the student moved towards its teacher
