"""Distributed accumulation: two gloo processes on CPU agree with one process over all the data.

One spawn of two processes runs every scenario (uneven shards, a rank that never updates, ``dist_sync_on_step``)
for both metrics and every average; each rank writes its results to a file that the test compares with a
single-process run and with the naive references.
"""

from __future__ import annotations

import os
import time
import warnings
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.reference import naive_lrap, naive_lwlrap
from tests.test_tie_report import brute_force_range, tied_positives
from torch_lwlrap import (
    MultilabelCoverageError,
    MultilabelLRAP,
    MultilabelLWLRAP,
    MultilabelOneError,
    MultilabelTieReport,
    tie_report,
)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORLD_SIZE = 2
NUM_LABELS = 5
IGNORE = -1
TIMEOUT_S = 120

METRICS = {
    "lwlrap-weighted": dict(average="weighted", ties="max"),
    "lwlrap-macro": dict(average="macro", ties="index"),
    "lwlrap-none": dict(average="none", ties="max"),
    "lrap": dict(ties="max"),
    "lrap-index": dict(ties="index"),
    "tie-report": dict(),
}

# batch indices per rank: uneven shards, and each rank in turn without any batch
SHARDS = {
    "uneven": {0: [0, 1, 2], 1: [3]},
    "rank 1 idle": {0: [0, 1, 2, 3], 1: []},
    "rank 0 idle": {0: [], 1: [0, 1, 2, 3]},
}
# dist_sync_on_step: every rank calls forward at every step; None is an empty batch (the end of an uneven epoch)
STEPS = [(0, 1), (2, 3), (4, None)]


def make_metric(name: str, **kwargs):
    options = dict(METRICS[name], ignore_index=IGNORE, **kwargs)
    if name == "tie-report":
        return MultilabelTieReport(NUM_LABELS, **options)
    if name.startswith("lwlrap"):
        return MultilabelLWLRAP(NUM_LABELS, **options)
    return MultilabelLRAP(NUM_LABELS, **options)


def make_batches():
    """Five batches of different sizes (all larger than the number of labels), with ties and ignored labels."""
    g = torch.Generator().manual_seed(17)
    batches = []
    for n in (7, 12, 9, 30, 11):
        preds = torch.randint(0, 4, (n, NUM_LABELS), generator=g).double() / 4
        target = (torch.rand(n, NUM_LABELS, generator=g) < 0.35).long()
        target[torch.rand(n, NUM_LABELS, generator=g) < 0.1] = IGNORE
        target[0] = 1  # every class has a positive in every batch
        weight = torch.rand(n, generator=g).double() * 2
        batches.append((preds, target, weight))
    return batches


def empty_batch():
    return (
        torch.zeros(0, NUM_LABELS, dtype=torch.float64),
        torch.zeros(0, NUM_LABELS, dtype=torch.long),
        torch.zeros(0, dtype=torch.float64),
    )


def as_tensor(value):
    """A metric's value as one float64 tensor: the tie report's values stacked in order."""
    return torch.stack(list(value.values())) if isinstance(value, dict) else value


def step(metric, batch, *, forward=False):
    preds, target, weight = batch
    call = metric if forward else metric.update
    if isinstance(metric, MultilabelLRAP):
        return call(preds, target, sample_weight=weight)
    return as_tensor(call(preds, target))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60)
    )
    gathered_shapes = []
    all_gather = dist.all_gather

    def recording_all_gather(tensor_list, tensor, *args, **kwargs):
        gathered_shapes.append(tuple(tensor.shape))
        return all_gather(tensor_list, tensor, *args, **kwargs)

    dist.all_gather = recording_all_gather
    batches = make_batches()
    results = {"gathered": {}, "synced_states": {}, "value": {}, "steps": {}, "report": {}, "per_class": {},
               "warnings": []}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for scenario, shards in SHARDS.items():
            for name in METRICS:
                metric = make_metric(name)
                for index in shards[rank]:
                    step(metric, batches[index])
                gathered_shapes.clear()
                results["value"][scenario, name] = as_tensor(metric.compute())
                results["gathered"][scenario, name] = list(gathered_shapes)
                if name == "tie-report":  # read outside compute, synced as compute is
                    results["report"][scenario] = metric.report().as_dict()
                if name == "lwlrap-weighted":  # likewise
                    results["per_class"][scenario] = metric.per_class()
                metric.sync()
                results["synced_states"][scenario, name] = {
                    key: (tuple(value.shape), str(value.dtype)) for key, value in metric.metric_state.items()
                }
                metric.unsync()
                step(metric, batches[4])  # still accumulating locally after compute, sync and unsync
                results["value"][scenario + " then batch 4 on both ranks", name] = as_tensor(metric.compute())
        for name in METRICS:
            metric = make_metric(name, dist_sync_on_step=True)
            values = []
            for pair in STEPS:
                index = pair[rank]
                values.append(step(metric, empty_batch() if index is None else batches[index], forward=True))
            results["steps"][name] = values
            results["value"]["dist_sync_on_step", name] = as_tensor(metric.compute())
    results["warnings"] = [str(w.message) for w in caught]
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def single_process(name, batches):
    metric = make_metric(name)
    for batch in batches:
        step(metric, batch)
    return as_tensor(metric.compute())


def naive(name, batches):
    preds = torch.cat([b[0] for b in batches]).numpy()
    target = torch.cat([b[1] for b in batches]).numpy()
    options = METRICS[name]
    if name == "tie-report":  # tied share, lwlrap under max and expected, and its range over every tie order
        low, high = brute_force_range(preds.tolist(), target.tolist(), IGNORE)
        tied, count = tied_positives(preds.tolist(), target.tolist(), IGNORE)
        max_value, expected_value = (naive_lwlrap(preds, target, rule, IGNORE) for rule in ("max", "expected"))
        return [tied / count, max_value, expected_value, float(high), float(low)]
    if name.startswith("lrap"):
        weight = torch.cat([b[2] for b in batches]).numpy()
        return naive_lrap(preds, target, options["ties"], IGNORE, weight)
    return naive_lwlrap(preds, target, options["ties"], IGNORE, options["average"])


def assert_same(actual, expected, what):
    assert actual.dtype == torch.float64, what
    np.testing.assert_allclose(
        actual.numpy(), np.asarray(expected, dtype=np.float64), rtol=1e-12, atol=1e-12, err_msg=what
    )


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    """Spawn the two ranks once and load what each wrote."""
    return run_ranks(_worker, tmp_path_factory.mktemp("distributed"))


def run_ranks(worker, out_dir, world_size: int = WORLD_SIZE, timeout_s: float = TIMEOUT_S):
    """Spawn ``worker(rank, init_file, out_dir)`` on ``world_size`` gloo ranks and load what each wrote to
    ``out_dir/rank<r>.pt``; fail (killing the ranks) after ``timeout_s``."""
    context = mp.start_processes(
        worker, args=(str(out_dir / "init"), str(out_dir)), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {world_size} ranks did not finish within {timeout_s} s")
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(world_size)]


@pytest.mark.parametrize("scenario", list(SHARDS))
@pytest.mark.parametrize("name", list(METRICS))
def test_every_rank_computes_the_value_over_all_shards(rank_results, scenario, name):
    batches = make_batches()
    everything = [batches[i] for rank in range(WORLD_SIZE) for i in SHARDS[scenario][rank]]
    expected = single_process(name, everything)
    assert_same(expected, naive(name, everything), f"{scenario}/{name}: single process vs naive")
    then = everything + [batches[4]] * WORLD_SIZE
    expected_then = single_process(name, then)
    assert_same(expected_then, naive(name, then), f"{scenario}/{name}: single process vs naive")
    for rank, results in enumerate(rank_results):
        assert_same(results["value"][scenario, name], expected, f"rank {rank}, {scenario}, {name}")
        assert_same(results["value"][scenario + " then batch 4 on both ranks", name], expected_then, f"rank {rank}")


@pytest.mark.parametrize("scenario", list(SHARDS))
def test_every_rank_reports_the_ties_of_all_shards(rank_results, scenario):
    batches = make_batches()
    everything = [batches[i] for rank in range(WORLD_SIZE) for i in SHARDS[scenario][rank]]
    want = tie_report(torch.cat([b[0] for b in everything]), torch.cat([b[1] for b in everything]), ignore_index=IGNORE)
    for rank, results in enumerate(rank_results):
        got = results["report"][scenario]
        assert (got["label_count"], got["tied_label_count"]) == (want.label_count, want.tied_label_count), rank
        for key in ("tied_share", "lwlrap_max", "lwlrap_expected", "lwlrap_best", "lwlrap_worst"):
            assert got[key] == pytest.approx(getattr(want, key), rel=1e-12), (rank, key)


@pytest.mark.parametrize("scenario", list(SHARDS))
def test_every_rank_reads_the_per_class_scores_of_all_shards(rank_results, scenario):
    batches = make_batches()
    everything = [batches[i] for rank in range(WORLD_SIZE) for i in SHARDS[scenario][rank]]
    preds = torch.cat([b[0] for b in everything]).numpy()
    target = torch.cat([b[1] for b in everything]).numpy()
    counts = (target == 1).sum(0)
    for rank, results in enumerate(rank_results):
        per_class, weights = results["per_class"][scenario]
        assert_same(per_class, naive_lwlrap(preds, target, "max", IGNORE, "none"), f"rank {rank}")
        assert_same(weights, counts / counts.sum(), f"rank {rank}")


@pytest.mark.parametrize("name", list(METRICS))
def test_dist_sync_on_step_gives_the_batch_value_over_both_ranks(rank_results, name):
    batches = make_batches()
    seen = []
    for i, pair in enumerate(STEPS):
        step_batches = [batches[index] for index in pair if index is not None]
        seen += step_batches
        expected = single_process(name, step_batches)
        assert_same(expected, naive(name, step_batches), f"step {i}: single process vs naive")
        for rank, results in enumerate(rank_results):
            assert_same(results["steps"][name][i], expected, f"rank {rank}, step {i}, {name}")
    expected = single_process(name, seen)
    assert_same(expected, naive(name, seen), "single process vs naive")
    for rank, results in enumerate(rank_results):
        assert_same(results["value"]["dist_sync_on_step", name], expected, f"rank {rank}, {name}")


@pytest.mark.parametrize("name", list(METRICS))
def test_only_fixed_size_sums_are_synced(rank_results, name):
    """Nothing that grows with the data crosses processes: after sync every state is (C,), (3,) or a scalar."""
    largest_batch = max(len(b[0]) for b in make_batches())
    for results in rank_results:
        for scenario in SHARDS:
            states = results["synced_states"][scenario, name]
            if name == "tie-report":
                assert states["precision_sum"] == ((4,), "torch.float64")
                assert states["label_count"] == states["tied_label_count"] == ((), "torch.int64")
            elif name.startswith("lwlrap"):
                assert states["precision_sum"] == ((NUM_LABELS,), "torch.float64")
                assert states["label_count"] == ((NUM_LABELS,), "torch.int64")
            else:
                assert states["lrap_sum"] == ((), "torch.float64")
                assert states["weight_sum"] == ((), "torch.float64")
            # The options tag is a constant of the options (its size is that of the metric before any batch).
            tag = tuple(make_metric(name).options_tag.shape)
            assert states["options_tag"] == (tag, "torch.int64")
            for key, (shape, _) in states.items():
                if key != "options_tag":
                    assert int(np.prod(shape)) <= NUM_LABELS, f"{key} synced with shape {shape}"
            gathered = results["gathered"][scenario, name]
            assert gathered, "compute did not sync"
            # one gather of sizes and one of values per state at most, and the options tag's first, alone: processes
            # with other options are refused before their sums are gathered
            assert len(gathered) <= 2 * (len(states) + 1)
            assert gathered[:2] == [(1,), tag]
            sums = [shape for shape in gathered if shape != tag]
            assert len(sums) < len(gathered) and all(int(np.prod(shape)) <= NUM_LABELS < largest_batch for shape in sums)


def test_no_unexpected_warning_in_the_ranks(rank_results):
    """Not even torchmetrics' "compute before update" on a rank that saw no batch: it computes the value over every
    rank's sums (a false warning there, and an error on that rank alone under ``-W error``)."""
    for results in rank_results:
        assert not results["warnings"]


def _mismatch_worker(rank: int, init_file: str, out_dir: str) -> None:
    """Rank 1 builds its metrics with other options than rank 0 (a config that differs per process); then both
    build them alike, one with other run settings (validate_args), which is no mismatch."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE, timeout=timedelta(seconds=60)
    )
    batches = [(preds, target.clamp(min=0)) for preds, target, _ in make_batches()]  # valid for any ignore_index
    results = {}
    made = {
        "ties": lambda: MultilabelLWLRAP(NUM_LABELS, ties="max" if rank == 0 else "index"),
        "ignore_index": lambda: MultilabelLRAP(NUM_LABELS, ignore_index=IGNORE if rank == 0 else -2),
        "step": lambda: MultilabelLWLRAP(NUM_LABELS, ties="max" if rank == 0 else "expected", dist_sync_on_step=True),
        "settings only": lambda: MultilabelLWLRAP(NUM_LABELS, validate_args=rank == 0, ignore_index=IGNORE),
        "drawn seeds": lambda: MultilabelLWLRAP(NUM_LABELS, num_bootstrap=50),  # torch seeded differently below
        # tags of other lengths; other states (whose gathers would not line up, or hang)
        "tag lengths": lambda: MultilabelLRAP(NUM_LABELS, ignore_index=None if rank == 0 else -1),
        "states": lambda: MultilabelLWLRAP(NUM_LABELS, num_bootstrap=0 if rank == 0 else 20, bootstrap_seed=1),
        # sums in two dtypes: gloo had aborted the process on the gather of unequal sizes
        "dtypes": lambda: MultilabelLRAP(NUM_LABELS).set_dtype(torch.float64 if rank == 0 else torch.float32),
        # another class on each process (a dict of metrics computed in another order): states of the same shapes
        # had been summed into a value of neither, states of other shapes had failed inside the gather
        "classes": lambda: (MultilabelCoverageError if rank == 0 else MultilabelOneError)(NUM_LABELS),
        "classes, states": lambda: (MultilabelLWLRAP if rank == 0 else MultilabelLRAP)(NUM_LABELS),
    }
    torch.manual_seed(rank)
    for name, make in made.items():
        metric = make()
        try:
            if name == "step":
                metric(*batches[rank])
            else:
                metric.update(*batches[rank])
            results[name] = ("value", metric.compute())
            if name == "drawn seeds":
                results["drawn seeds interval"] = (metric.bootstrap_seed, metric.confidence_interval())
        except ValueError as error:
            results[name] = ("error", str(error))
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


def test_processes_with_different_options_are_refused_not_summed(tmp_path):
    ranks = run_ranks(_mismatch_worker, tmp_path)
    for rank, results in enumerate(ranks):
        kind, message = results["ties"]
        assert kind == "error", (rank, message)
        assert "MultilabelLWLRAP was created with ties='max'" in message and "ties='index' on process 1" in message
        assert "the same options on every process" in message
        kind, message = results["ignore_index"]
        assert kind == "error" and "ignore_index=-1" in message and "ignore_index=-2 on process 1" in message
        kind, message = results["step"]  # dist_sync_on_step: refused at the step's sync
        assert kind == "error" and "ties='expected' on process 1" in message
        kind, message = results["tag lengths"]
        assert kind == "error" and "ignore_index=None on process 0 and ignore_index=-1 on process 1" in message
        kind, message = results["states"]
        assert kind == "error" and "num_bootstrap=0" in message and "num_bootstrap=20" in message
        kind, message = results["dtypes"]
        assert kind == "error", (rank, message)
        assert "torch.float64 on process 0 and in torch.float32 on process 1" in message and "set_dtype" in message
        for name, first, other in (("classes", "MultilabelCoverageError", "MultilabelOneError"),
                                   ("classes, states", "MultilabelLWLRAP", "MultilabelLRAP")):
            kind, message = results[name]
            assert kind == "error", (rank, name, message)
            assert f"met a {first} on process 0 and a {other} on process 1" in message, message
            assert "in the same order on every process" in message
        preds = torch.cat([b[0] for b in make_batches()[:2]]).numpy()
        target = torch.cat([b[1].clamp(min=0) for b in make_batches()[:2]]).numpy()
        for name in ("settings only", "drawn seeds"):  # run settings, or seeds drawn per process, may differ
            kind, value = results[name]
            assert kind == "value", (rank, name, value)
            assert_same(value, naive_lwlrap(preds, target, "max"), f"rank {rank}, {name}")
        low, high = results["drawn seeds interval"][1]
        assert low < results["drawn seeds"][1] < high
    assert ranks[0]["drawn seeds interval"][0] != ranks[1]["drawn seeds interval"][0]
