"""The metric classes' shared machinery as a user drives it: the learning-to-rank metrics' options in their
checkpoints and compute groups, value checks that survive a training step's forward, sample weights in every
metric's sums, the bootstrap stream (a refused batch, forward, two processes), a checkpoint of synced states and a
run resumed from it, sums kept across inference mode. References independent of the metric classes: scikit-learn,
scipy, the suite's naive loops written from the formulas, and the bootstrap's Poisson weights drawn directly and
applied to each sample's naive LRAP.
"""

from __future__ import annotations

import io
import math
import os
from datetime import timedelta

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torchmetrics import MetricCollection

from tests.reference import naive_lrap
from tests.reference_ranking import naive_coverage_error, naive_distance, scipy_mean
from tests.test_ltr_metrics import naive_ndcg
from torch_lwlrap import (
    MultilabelCoverageError,
    MultilabelKendallDistanceAtK,
    MultilabelLRAP,
    MultilabelLWLRAP,
    MultilabelNDCG,
    MultilabelRankCorrelation,
    MultilabelRankingMetrics,
)
from torch_lwlrap.stats._bootstrap import poisson_weights, stream_key

C = 6


def _labels(seed, n=11, c=C):
    g = torch.Generator().manual_seed(seed)
    preds = torch.randint(0, 5, (n, c), generator=g).double() / 4  # ties
    target = (torch.rand(n, c, generator=g) < 0.4).long()
    target[0] = 0
    target[0, 0] = 1
    return preds, target


def _pairs(seed, n=9, c=C):
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 4, (n, c), generator=g).double()
    b = torch.randint(0, 4, (n, c), generator=g).double()
    grades = torch.randint(0, 3, (n, c), generator=g).double()
    return a, b, grades


def _roundtrip(state_dict):
    """A checkpoint as the user writes and reads it: torch.save / torch.load."""
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


# --- the learning-to-rank metrics' options in their tags ---

LTR_CHANGES = [
    (MultilabelNDCG, dict(num_labels=C, k=3, gain="exponential"), ("gain", "linear"), "grades"),
    (MultilabelNDCG, dict(num_labels=C, k=3), ("k", 2), "grades"),
    (MultilabelNDCG, dict(num_labels=C, k=3), ("ties", "index"), "grades"),
    (MultilabelRankCorrelation, dict(num_labels=C, method="spearman"), ("method", "kendall"), "b"),
    (MultilabelKendallDistanceAtK, dict(num_labels=C, k=2), ("k", 3), "b"),
]
LTR_IDS = [f"{cls.__name__}-{name}" for cls, _, (name, _v), _ in LTR_CHANGES]


@pytest.mark.parametrize("cls, options, change, second", LTR_CHANGES, ids=LTR_IDS)
def test_an_ltr_checkpoint_made_with_other_options_is_refused(cls, options, change, second):
    # A checkpoint of NDCG, the rank correlation or the Kendall distance made with other options than the metric it
    # is loaded into: refused by name, the metric's states unchanged.
    name, value = change
    a, b, grades = _pairs(0)
    saved = cls(**options)
    saved.persistent(True)
    saved.update(a, grades if second == "grades" else b)
    other = cls(**{**options, name: value})
    other.persistent(True)
    before = {n: getattr(other, n).clone() for n in other._defaults}
    with pytest.raises(RuntimeError, match=rf"was made with {name}="):
        other.load_state_dict(_roundtrip(saved.state_dict()))
    assert all(torch.equal(getattr(other, n), v) for n, v in before.items())


@pytest.mark.parametrize("cls, options, change, second", LTR_CHANGES, ids=LTR_IDS)
def test_a_collection_never_groups_ltr_metrics_whose_options_differ(cls, options, change, second):
    # One compute group = one member's states and the first member's options for every batch: each member must
    # still give its own value, checked against scipy / the naive formulas over all samples at once.
    name, value = change
    first, other = cls(**options), cls(**{**options, name: value})
    collection = MetricCollection({"first": first, "other": other})
    batches = [_pairs(seed) for seed in (1, 2)]
    for a, b, grades in batches:
        collection.update(a, grades if second == "grades" else b)
    assert len(collection.compute_groups) == 2
    a = torch.cat([x[0] for x in batches])
    b = torch.cat([x[1] for x in batches])
    grades = torch.cat([x[2] for x in batches])
    for metric in (first, other):
        if cls is MultilabelNDCG:
            want = naive_ndcg(a, grades, metric.k, metric.gain, metric.ties)
        elif cls is MultilabelRankCorrelation:
            want = scipy_mean(a, b, metric.method)[0]
        else:
            want = naive_distance(a, b, metric.k)
        assert metric.compute().item() == pytest.approx(want, rel=1e-12, abs=1e-12)


# --- validate_args survives forward ---

@pytest.mark.parametrize(
    "make, good, bad",
    [
        (lambda: MultilabelLWLRAP(C), lambda: _labels(3), lambda: _labels(4)),
        (lambda: MultilabelLRAP(C), lambda: _labels(3), lambda: _labels(4)),
        (lambda: MultilabelCoverageError(C), lambda: _labels(3), lambda: _labels(4)),
        (lambda: MultilabelKendallDistanceAtK(C, k=2), lambda: _pairs(3)[:2], lambda: _pairs(4)[:2]),
    ],
    ids=["lwlrap", "lrap", "coverage", "distance"],
)
def test_a_training_step_s_forward_keeps_the_checks_of_later_updates(make, good, bad):
    # The Lightning pattern: self.metric(preds, target) in training_step (forward), self.metric.update(...) in
    # validation_step. Forward skips update's re-check of the batch it already checked; it must not switch the
    # checks off for good: a NaN score later must still be refused, not silently ranked.
    metric = make()
    metric(*good())
    assert metric.validate_args is True
    preds, second = bad()
    preds = preds.clone()
    preds[1, 2] = math.nan
    before = {n: getattr(metric, n).clone() for n in metric._defaults}
    with pytest.raises(ValueError, match="NaN"):
        metric.update(preds, second)
    assert all(torch.equal(getattr(metric, n), v) for n, v in before.items())


# --- reset keeps the run settings in the tag ---

def test_a_metric_switched_to_no_checks_stays_apart_from_a_checking_one_after_reset():
    # validate_args set after construction re-tags the metric; reset() restores the states' defaults, which must
    # hold the new tag, or a collection built after the reset groups the metric with a checking one, and the
    # checking member (grouped behind it) takes a NaN batch silently.
    switched = MultilabelLWLRAP(C)
    switched.validate_args = False
    switched.reset()
    assert torch.equal(switched.options_tag, MultilabelLWLRAP(C, validate_args=False).options_tag)
    cast = MultilabelLWLRAP(C).set_dtype(torch.float32)
    cast.reset()
    assert torch.equal(cast.options_tag, MultilabelLWLRAP(C).set_dtype(torch.float32).options_tag)
    collection = MetricCollection({"fast": switched, "strict": MultilabelLWLRAP(C)})
    collection.update(*_labels(5))
    preds, target = _labels(6)
    preds[1, 2] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        collection.update(preds, target)


# --- sample_weight reaches every metric's sums ---

def test_lrap_with_replicates_weights_its_samples():
    from sklearn.metrics import label_ranking_average_precision_score

    batches = [_labels(seed) for seed in (7, 8)]
    weights = [torch.rand(len(b[0]), generator=torch.Generator().manual_seed(i), dtype=torch.float64) * 2 + 0.1
               for i, b in enumerate(batches)]
    for num_bootstrap in (0, 16):
        metric = MultilabelLRAP(C, num_bootstrap=num_bootstrap, bootstrap_seed=3)
        for (preds, target), weight in zip(batches, weights):
            metric.update(preds, target, sample_weight=weight)
        preds = torch.cat([b[0] for b in batches]).numpy()
        target = torch.cat([b[1] for b in batches]).numpy()
        weight = torch.cat(weights).numpy()
        want = label_ranking_average_precision_score(target, preds, sample_weight=weight)
        assert metric.compute().item() == pytest.approx(want, rel=1e-12), num_bootstrap


def test_ndcg_and_the_ranking_family_weight_their_samples():
    from sklearn.metrics import coverage_error

    a, _, grades = _pairs(9, n=14)
    weight = torch.linspace(0.1, 3.0, len(a), dtype=torch.float64)
    ndcg = MultilabelNDCG(C, k=3)
    ndcg.update(a[:6], grades[:6], sample_weight=weight[:6])
    ndcg.update(a[6:], grades[6:], sample_weight=weight[6:])
    want = naive_ndcg(a, grades, 3, "exponential", "max", weight=weight.tolist())
    assert ndcg.compute().item() == pytest.approx(want, rel=1e-12)

    preds, target = _labels(10, n=14)
    for metric in (MultilabelCoverageError(C), MultilabelRankingMetrics(C, metrics=("coverage_error",))):
        metric.update(preds[:6], target[:6], sample_weight=weight[:6])
        metric.update(preds[6:], target[6:], sample_weight=weight[6:])
        value = metric.compute()
        value = value["coverage_error"] if isinstance(value, dict) else value
        want = coverage_error(target.numpy(), preds.numpy(), sample_weight=weight.numpy())
        assert value.item() == pytest.approx(want, rel=1e-12)
        assert value.item() == pytest.approx(naive_coverage_error(preds, target, sample_weight=weight), rel=1e-12)


# --- a refused batch does not move the bootstrap stream ---

def _replicates_from_formula(preds, target, weight, seed, num_bootstrap):
    """Replicate b = sum_i w_bi s_i lrap_i / sum_i w_bi s_i, with w_bi the Poisson weight of stream position i
    (process 0) and lrap_i the naive LRAP of sample i alone."""
    per_sample = torch.tensor(
        [naive_lrap(preds[i : i + 1].numpy(), target[i : i + 1].numpy()) for i in range(len(preds))],
        dtype=torch.float64,
    )
    w = poisson_weights(stream_key(seed, 0), torch.arange(len(preds)), num_bootstrap).double()
    return (w * (per_sample * weight)).sum(1) / (w * weight).sum(1)


def test_a_refused_batch_leaves_the_bootstrap_stream_where_it_was():
    batches = [_labels(seed, n=8) for seed in (11, 12, 13)]
    weights = [torch.full((8,), 1.0, dtype=torch.float64), torch.linspace(0.5, 2, 8, dtype=torch.float64),
               torch.full((8,), 2.0, dtype=torch.float64)]
    metric = MultilabelLRAP(C, num_bootstrap=32, bootstrap_seed=5)
    metric.update(*batches[0], sample_weight=weights[0])
    bad = batches[1][0].clone()
    bad[0, 0] = math.nan
    with pytest.raises(ValueError, match="NaN"):
        metric.update(bad, batches[1][1], sample_weight=weights[1])
    metric.update(*batches[1], sample_weight=weights[1])
    metric.update(*batches[2], sample_weight=weights[2])
    preds = torch.cat([b[0] for b in batches])
    target = torch.cat([b[1] for b in batches])
    want = _replicates_from_formula(preds, target, torch.cat(weights), 5, 32)
    torch.testing.assert_close(metric.bootstrap_samples(), want, rtol=1e-12, atol=1e-12)


# --- processes' sums are added, for every metric family ---

WORLD_SIZE = 2
SHARDS = {0: [0, 1, 2], 1: [3]}


def _ddp_batches():
    return [_labels(20 + i, n=n) for i, n in enumerate((7, 12, 9, 30))]


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD_SIZE,
                            timeout=timedelta(seconds=60))
    batches = _ddp_batches()
    metrics = {
        "coverage": MultilabelCoverageError(C),
        "family": MultilabelRankingMetrics(C, metrics=("coverage_error", "lrap", "retrieval"), k=2),
        "bootstrap": MultilabelLRAP(C, num_bootstrap=16, bootstrap_seed=9),
    }
    results = {}
    for name, metric in metrics.items():
        for index in SHARDS[rank]:
            metric.update(*batches[index])
        value = metric.compute()
        results[name] = value
        if name == "coverage":  # rank 0 saves the synced metric, as torchmetrics' docs suggest before a checkpoint
            metric.persistent(True)
            metric.sync()
            results["synced state"] = {key: value.clone() for key, value in metric.state_dict().items()}
            metric.unsync()
        if name == "bootstrap":
            results["bootstrap samples"] = metric.bootstrap_samples()
            results["bootstrap local sums"] = metric.bootstrap_lrap_sum.clone()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")
def test_two_ranks_add_the_ranking_family_and_bootstrap_sums(tmp_path):
    from sklearn.metrics import coverage_error, label_ranking_average_precision_score

    from tests.test_distributed import run_ranks

    ranks = run_ranks(_ddp_worker, tmp_path, WORLD_SIZE, 120)
    batches = _ddp_batches()
    preds = torch.cat([b[0] for b in batches]).numpy()
    target = torch.cat([b[1] for b in batches]).numpy()
    want_coverage = coverage_error(target, preds)
    want_lrap = label_ranking_average_precision_score(target, preds)
    # replicates over both ranks: each rank's own stream (key of its rank), positions counted per rank
    lrap_sums, weight_sums = 0, 0
    for rank, shard in SHARDS.items():
        p = torch.cat([batches[i][0] for i in shard])
        t = torch.cat([batches[i][1] for i in shard])
        per_sample = torch.tensor([naive_lrap(p[i : i + 1].numpy(), t[i : i + 1].numpy()) for i in range(len(p))],
                                  dtype=torch.float64)
        w = poisson_weights(stream_key(9, rank), torch.arange(len(p)), 16).double()
        lrap_sums = lrap_sums + (w * per_sample).sum(1)
        weight_sums = weight_sums + w.sum(1)
    for rank, results in enumerate(ranks):
        assert results["coverage"].item() == pytest.approx(want_coverage, rel=1e-12), rank
        family = results["family"]
        assert family["coverage_error"].item() == pytest.approx(want_coverage, rel=1e-12), rank
        assert family["lrap"].item() == pytest.approx(want_lrap, rel=1e-12), rank
        assert results["bootstrap"].item() == pytest.approx(want_lrap, rel=1e-12), rank
        torch.testing.assert_close(results["bootstrap samples"], lrap_sums / weight_sums, rtol=1e-12, atol=1e-12)
        # the synced checkpoint: the tag as it was (never summed), and a metric elsewhere loads it to the global value
        assert torch.equal(results["synced state"]["options_tag"], MultilabelCoverageError(C).options_tag)
        elsewhere = MultilabelCoverageError(C)
        elsewhere.persistent(True)
        elsewhere.load_state_dict(results["synced state"])
        assert elsewhere.compute().item() == pytest.approx(want_coverage, rel=1e-12), rank
        # ... and goes on from it: the loaded sums weigh every sample of both ranks once (a "mean" reduction of the
        # sums keeps every ratio but halves the sums, so the resumed run under-weighs the old samples)
        extra_preds, extra_target = _labels(99, n=20)
        elsewhere.update(extra_preds, extra_target)
        want_all = coverage_error(np.concatenate([target, extra_target.numpy()]),
                                  np.concatenate([preds, extra_preds.numpy()]))
        assert elsewhere.compute().item() == pytest.approx(want_all, rel=1e-12), rank


# --- forward with replicates ---

def test_a_training_step_s_forward_adds_each_batch_once_to_the_replicates():
    # self.metric(preds, target, sample_weight=w) in training_step: the returned value is the batch's LRAP, and the
    # accumulated replicates must be those of the whole stream, each sample once (Poisson weights from the formula).
    from sklearn.metrics import label_ranking_average_precision_score

    batches = [_labels(seed, n=8) for seed in (31, 32, 33)]
    weights = [torch.linspace(0.5, 2, 8, dtype=torch.float64) * (i + 1) for i in range(3)]
    metric = MultilabelLRAP(C, num_bootstrap=32, bootstrap_seed=4)
    for (preds, target), weight in zip(batches, weights):
        value = metric(preds, target, sample_weight=weight)
        want = label_ranking_average_precision_score(target.numpy(), preds.numpy(), sample_weight=weight.numpy())
        assert value.item() == pytest.approx(want, rel=1e-12)
    preds = torch.cat([b[0] for b in batches])
    target = torch.cat([b[1] for b in batches])
    want = _replicates_from_formula(preds, target, torch.cat(weights), 4, 32)
    torch.testing.assert_close(metric.bootstrap_samples(), want, rtol=1e-12, atol=1e-12)
    weight = torch.cat(weights).numpy()
    assert metric.compute().item() == pytest.approx(
        label_ranking_average_precision_score(target.numpy(), preds.numpy(), sample_weight=weight), rel=1e-12)


# --- sums accumulated under inference_mode survive an update outside it ---

@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP, MultilabelCoverageError])
def test_sums_accumulated_in_a_validation_loop_under_inference_mode_keep_growing_outside_it(cls):
    # Lightning validates under torch.inference_mode(): states reset there are inference tensors. A later update
    # outside it (a test loop under no_grad, a manual evaluation) must add to them, not replace them.
    from sklearn.metrics import coverage_error, label_ranking_average_precision_score

    from tests.reference import naive_lwlrap

    batches = [_labels(seed) for seed in (41, 42, 43)]
    metric = cls(C)
    with torch.inference_mode():  # Lightning resets logged metrics at the epoch's end, inside the loop's context
        metric.reset()
        metric.update(*batches[0])
        metric.update(*batches[1])
    with torch.no_grad():
        metric.update(*batches[2])
    preds = torch.cat([b[0] for b in batches]).numpy()
    target = torch.cat([b[1] for b in batches]).numpy()
    if cls is MultilabelLWLRAP:
        want = naive_lwlrap(preds, target)
    elif cls is MultilabelLRAP:
        want = label_ranking_average_precision_score(target, preds)
    else:
        want = coverage_error(target, preds)
    assert metric.compute().item() == pytest.approx(want, rel=1e-12)


# --- a tag with entries after its options is no tag ---


@pytest.mark.parametrize("extra", [[7, 7], [0], [1999, 1, 0, 1999]], ids=["garbage", "one-more", "settings-twice"])
def test_a_checkpoint_whose_tag_has_entries_after_its_options_is_refused_and_changes_nothing(extra):
    """A tag is ``[layout, class, options..., settings]``: entries after the options other than the run settings are
    no tag any version wrote (a damaged or hand-edited state dict): refused, as every other unknown tag is."""
    gen = torch.Generator().manual_seed(4)
    saved = MultilabelLWLRAP(4)
    saved.persistent(True)
    saved.update(torch.rand(5, 4, generator=gen), torch.tensor([[1, 0, 1, 0], [0, 1, 0, 0]] * 2 + [[0, 0, 0, 1]]))
    state = dict(saved.state_dict())
    tag = state["options_tag"].tolist()
    assert tag[-3] == 1999  # the run settings end the tag
    state["options_tag"] = torch.tensor(tag[:-3] + extra, dtype=torch.int64)
    target = MultilabelLWLRAP(4)
    target.persistent(True)
    target.update(torch.tensor([[0.9, 0.1, 0.2, 0.3]]), torch.tensor([[1, 0, 0, 0]]))
    before = {name: getattr(target, name).clone() for name in ("precision_sum", "label_count")}
    with pytest.raises(RuntimeError, match=r"an unknown options_tag"):
        target.load_state_dict(state)
    assert all(torch.equal(getattr(target, name), kept) for name, kept in before.items())


# --- a forward by keyword checks the device as one by position does ---


@pytest.mark.parametrize(
    "make, keywords",
    [
        (lambda: MultilabelLWLRAP(3), ("preds", "target")),
        (lambda: MultilabelRankingMetrics(num_labels=3), ("preds", "target")),
        (lambda: MultilabelKendallDistanceAtK(3, 1), ("preds_a", "preds_b")),
    ],
    ids=["lwlrap", "ranking", "kendall"],
)
def test_a_forward_by_keyword_on_another_device_names_the_metric_s_device(make, keywords):
    """``metric(preds=..., target=...)`` as a training step may write it: a batch on another device than the
    metric's states is refused naming both devices, as the same call by position is, and nothing changes."""
    gen = torch.Generator().manual_seed(6)
    preds = torch.rand(4, 3, generator=gen)
    second = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]])
    second = second if keywords[1] == "target" else torch.rand(4, 3, generator=gen)
    metric = make()
    metric.update(preds, second)
    before = {name: getattr(metric, name).clone() for name in metric._defaults}
    moved = {keywords[0]: preds.to("meta"), keywords[1]: second.to("meta")}
    message = rf"Argument `{keywords[0]}` is on meta but the state of {type(metric).__name__} is on cpu"
    with pytest.raises(ValueError, match=message):
        metric(*moved.values())  # by position
    with pytest.raises(ValueError, match=message):
        metric(**moved)  # by keyword: the same refusal
    assert all(torch.equal(getattr(metric, name), kept) for name, kept in before.items())
