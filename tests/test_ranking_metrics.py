"""Coverage error, ranking loss, one-error, retrieval at k and the one-pass collection: against scikit-learn, the
naive references of ``tests/reference_ranking.py`` (every metric, tie rule, ``ignore_index``, sample weights), batch
accumulation, checkpoints, bad input and a Lightning module."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from torchmetrics import MetricCollection

from tests.reference import naive_lrap, naive_lwlrap
from tests.reference_ranking import (
    naive_coverage_error,
    naive_lwlrap_lrap_expected,
    naive_one_error,
    naive_ranking_loss,
    naive_retrieval,
)
from torch_lwlrap import (
    MultilabelCoverageError,
    MultilabelLRAP,
    MultilabelLWLRAP,
    MultilabelOneError,
    MultilabelRankingLoss,
    MultilabelRankingMetrics,
    MultilabelRetrievalAtK,
    multilabel_coverage_error,
    multilabel_lrap,
    multilabel_lwlrap,
    multilabel_one_error,
    multilabel_ranking_loss,
    multilabel_retrieval_at_k,
)
from torch_lwlrap._ranking import use_engine

sklearn_metrics = pytest.importorskip("sklearn.metrics")

RETRIEVAL = ("hit", "precision", "recall", "ap", "rr", "ndcg")
KS = (1, 2, 3, 6, 9)  # 9 > C


def tie_heavy(seed, n=40, c=6, *, levels=3, density=0.35, ignore_index=None, extra=()):
    """Scores from a few levels (many ties, +-inf too), rows with no positive and rows with only positives."""
    g = torch.Generator().manual_seed(seed)
    shape = (n, c) + tuple(extra)
    preds = torch.randint(0, levels, shape, generator=g).double()
    preds[torch.rand(shape, generator=g) < 0.05] = math.inf
    preds[torch.rand(shape, generator=g) < 0.05] = -math.inf
    target = (torch.rand(shape, generator=g) < density).long()
    target[0] = 0
    target[1] = 1
    if ignore_index is not None:
        target[torch.rand(shape, generator=g) < 0.15] = ignore_index
        target[2] = ignore_index  # a sample without any label
    weight = torch.rand(n, generator=g).double() * 2
    return preds, target, weight


def close(actual, expected, what=""):
    assert actual.dtype == torch.float64, what
    np.testing.assert_allclose(actual.item(), expected, rtol=1e-12, atol=1e-12, err_msg=what)


# ---------------------------------------------------------------------------------------------------------------
# scikit-learn


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("weighted", [False, True])
def test_coverage_error_and_ranking_loss_equal_scikit_learn(seed, weighted):
    preds, target, weight = tie_heavy(seed, n=60, c=4 + seed)
    w = weight if weighted else None
    y, s = target.numpy(), preds.numpy()
    # scikit-learn does not take infinite scores: compare on finite ones, where its ties are the same.
    s = np.where(np.isinf(s), np.sign(s) * 1e9, s)
    finite = torch.from_numpy(s)
    sw = None if w is None else w.numpy()
    close(
        multilabel_coverage_error(finite, target, sample_weight=w),
        sklearn_metrics.coverage_error(y, s, sample_weight=sw),
    )
    close(
        multilabel_ranking_loss(finite, target, sample_weight=w),
        sklearn_metrics.label_ranking_loss(y, s, sample_weight=sw),
    )


# ---------------------------------------------------------------------------------------------------------------
# naive references: every metric, tie rule, ignore_index, weights, extra dimensions


CASES = [
    dict(seed=0),
    dict(seed=1, ignore_index=-1),
    dict(seed=2, ignore_index=255, levels=2),
    dict(seed=3, extra=(2,)),
    dict(seed=4, ignore_index=-1, extra=(3,), n=10),
    dict(seed=5, c=1),
    dict(seed=6, c=12, levels=20, density=0.2),
]


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
@pytest.mark.parametrize("case", CASES, ids=lambda case: str(case))
@pytest.mark.parametrize("weighted", [False, True])
def test_every_metric_equals_the_naive_reference(case, ties, weighted):
    case = dict(case)
    ignore_index = case.get("ignore_index")
    preds, target, weight = tie_heavy(case.pop("seed"), **case)
    w = weight if weighted else None
    options = dict(ties=ties, ignore_index=ignore_index, sample_weight=w)
    nw = None if w is None else w.numpy()
    p, t = preds.numpy(), target.numpy()
    close(multilabel_coverage_error(preds, target, **options), naive_coverage_error(p, t, ties, ignore_index, nw))
    close(multilabel_ranking_loss(preds, target, **options), naive_ranking_loss(p, t, ties, ignore_index, nw))
    close(multilabel_one_error(preds, target, **options), naive_one_error(p, t, ties, ignore_index, nw))
    for empty_target in ("zero", "skip"):
        got = multilabel_retrieval_at_k(preds, target, KS, empty_target=empty_target, **options)
        want = naive_retrieval(p, t, KS, ties, ignore_index, nw, empty_target)
        assert list(got) == [f"{name}@{k}" for name in RETRIEVAL for k in KS]
        for name, value in got.items():
            close(value, want[name], f"{name}, empty_target={empty_target}")


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_retrieval_at_the_largest_k_equals_the_naive_reference(ties):
    """k may be as large as int64 holds: every label is retrieved, and a sample without a positive is never a hit
    (its best rank, int64's largest, read as a float, equals 2**63 and would reach such a k)."""
    k = 2**63 - 1
    preds, target, weight = tie_heavy(34, n=12, c=5, ignore_index=-1)
    target[0] = 0  # no positive
    p, t = preds.numpy(), target.numpy()
    for empty_target in ("zero", "skip"):
        want = naive_retrieval(p, t, (k,), ties, -1, weight.numpy(), empty_target)
        got = multilabel_retrieval_at_k(preds, target, k, ties=ties, ignore_index=-1, sample_weight=weight,
                                        empty_target=empty_target)
        metric = MultilabelRetrievalAtK(5, k, ties=ties, ignore_index=-1, empty_target=empty_target)
        metric.update(preds[:7], target[:7], sample_weight=weight[:7])
        metric.update(preds[7:], target[7:], sample_weight=weight[7:])
        for name, value in got.items():
            close(value, want[name], f"{name}, empty_target={empty_target}")
        for name, value in metric.compute().items():
            close(value, want[name], f"{name} of the metric, empty_target={empty_target}")


@pytest.mark.parametrize("ties", ["max", "index"])
def test_worked_example_of_each_tie_rule(ties):
    # One sample: scores [3, 2, 2, 2, 1], positives at columns 2 and 4.
    preds = torch.tensor([[3.0, 2.0, 2.0, 2.0, 1.0]])
    target = torch.tensor([[0, 0, 1, 0, 1]])
    # "max": positions 1, 4, 4, 4, 5; "index": 1, 2, 3, 4, 5.
    rank_2, rank_4 = (4, 5) if ties == "max" else (3, 5)
    assert multilabel_coverage_error(preds, target, ties=ties).item() == 5
    # negatives at or above: column 2 has 0, 1 (and 3 with "max"), column 4 has all three
    wrong = (3 if ties == "max" else 2) + 3
    assert multilabel_ranking_loss(preds, target, ties=ties).item() == wrong / 6
    got = multilabel_retrieval_at_k(preds, target, (3, 5), ties=ties)
    in_top_3 = int(rank_2 <= 3)
    assert got["hit@3"].item() == in_top_3 and got["precision@3"].item() == in_top_3 / 3
    assert got["rr@5"].item() == 1 / rank_2
    assert got["ap@5"].item() == pytest.approx((1 / rank_2 + 2 / rank_4) / 2, abs=1e-15)
    ideal = 1 + 1 / math.log2(3)
    assert got["ndcg@5"].item() == pytest.approx((1 / math.log2(rank_2 + 1) + 1 / math.log2(rank_4 + 1)) / ideal)


def test_one_error_tie_rules():
    preds = torch.tensor([[2.0, 2.0, 0.0], [2.0, 2.0, 0.0], [1.0, 2.0, 2.0]])
    target = torch.tensor([[1, 1, 0], [0, 1, 0], [0, 1, 1]])
    # "max": a shared top score is never right; "index": the lowest tied column is the top label.
    assert multilabel_one_error(preds, target).item() == 1.0
    assert multilabel_one_error(preds, target, ties="index").item() == pytest.approx(1 / 3)  # row 1 only


def test_the_collection_equals_each_function_and_lwlrap_lrap():
    preds, target, weight = tie_heavy(7, n=50, c=7, ignore_index=-1)
    for ties in ("max", "index"):
        metric = MultilabelRankingMetrics(7, k=(1, 3), ties=ties, ignore_index=-1)
        metric.update(preds, target, sample_weight=weight)
        got = metric.compute()
        options = dict(ties=ties, ignore_index=-1)
        close(got["lwlrap"], multilabel_lwlrap(preds, target, **options).item())
        close(got["lwlrap"], naive_lwlrap(preds.numpy(), target.numpy(), ties, -1))
        close(got["lrap"], multilabel_lrap(preds, target, sample_weight=weight, **options).item())
        close(got["lrap"], naive_lrap(preds.numpy(), target.numpy(), ties, -1, weight.numpy()))
        close(got["coverage_error"], multilabel_coverage_error(preds, target, sample_weight=weight, **options).item())
        close(got["ranking_loss"], multilabel_ranking_loss(preds, target, sample_weight=weight, **options).item())
        close(got["one_error"], multilabel_one_error(preds, target, sample_weight=weight, **options).item())
        for name, value in multilabel_retrieval_at_k(preds, target, (1, 3), sample_weight=weight, **options).items():
            close(got[name], value.item(), name)


def test_the_collection_with_expected_ties_equals_every_tie_order_enumerated():
    preds, target, _ = tie_heavy(16, n=30, c=6, ignore_index=-1)
    metric = MultilabelRankingMetrics(6, k=(1, 4), ties="expected", ignore_index=-1)
    metric.update(preds[:13], target[:13])
    metric.update(preds[13:], target[13:])
    got = metric.compute()
    p, t = preds.numpy(), target.numpy()
    lwlrap, lrap = naive_lwlrap_lrap_expected(p, t, -1)
    close(got["lwlrap"], lwlrap)
    close(got["lrap"], lrap)
    close(got["coverage_error"], naive_coverage_error(p, t, "expected", -1))
    close(got["one_error"], naive_one_error(p, t, "expected", -1))
    for name, value in naive_retrieval(p, t, (1, 4), "expected", -1).items():
        close(got[name], value, name)


def test_the_collection_ranks_each_batch_once(monkeypatch):
    from torch_lwlrap.functional import _ranking_family as ranking_functional

    calls = []
    original = ranking_functional.positive_counts_chunks

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(ranking_functional, "positive_counts_chunks", counting)
    preds, target, _ = tie_heavy(8)
    MultilabelRankingMetrics(6).update(preds, target)
    assert len(calls) == 1


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_masked_cells_give_the_sums_of_gathered_positives(monkeypatch, ties):
    """Off the CPU the reductions mask every cell instead of gathering the positives (no host-device sync)."""
    from torch_lwlrap import _rank_reductions

    preds, target, weight = tie_heavy(15, n=60, c=7, ignore_index=-1)
    options = dict(k=(1, 3, 8), ignore_index=-1, ties=ties)
    compact = MultilabelRankingMetrics(7, **options)  # the numba path's compact counts where numba is installed
    compact.update(preds, target, sample_weight=weight)
    with use_engine("sort"):  # dense counts
        gathered = MultilabelRankingMetrics(7, **options)
        gathered.update(preds, target, sample_weight=weight)
        monkeypatch.setattr(_rank_reductions, "GATHER_DEVICES", ())
        masked = MultilabelRankingMetrics(7, **options)
        masked.update(preds, target, sample_weight=weight)
    want = compact.compute()
    assert want["one_error"] > 0 and want["coverage_error"] > 0
    for name, value in want.items():
        close(gathered.compute()[name], value.item(), name)
        close(masked.compute()[name], value.item(), name)


@pytest.mark.parametrize("engine", ["sort", "count", "numba"])
def test_chunks_and_engine_paths_give_the_same_sums(engine):
    preds, target, weight = tie_heavy(9, n=70, c=5, ignore_index=-1, extra=(2,))
    whole = MultilabelRankingMetrics(5, k=(1, 4), ignore_index=-1)
    whole.update(preds, target, sample_weight=weight)
    with use_engine(engine, chunk_elements=12):  # a few samples per chunk
        chunked = MultilabelRankingMetrics(5, k=(1, 4), ignore_index=-1)
        chunked.update(preds, target, sample_weight=weight)
    for name, value in whole.compute().items():
        close(chunked.compute()[name], value.item(), name)


# ---------------------------------------------------------------------------------------------------------------
# metric classes: accumulation, forward, checkpoints, bad input, collections


def make_classes(ignore_index=-1):
    return {
        "coverage_error": MultilabelCoverageError(6, ignore_index=ignore_index),
        "ranking_loss": MultilabelRankingLoss(6, ties="index", ignore_index=ignore_index),
        "one_error": MultilabelOneError(6, ignore_index=ignore_index),
        "retrieval": MultilabelRetrievalAtK(6, (1, 3), empty_target="skip", ignore_index=ignore_index),
        "all": MultilabelRankingMetrics(6, k=2, ignore_index=ignore_index),
    }


def reference_value(name, preds, target, weight):
    p, t, w = preds.numpy(), target.numpy(), weight.numpy()
    if name == "coverage_error":
        return naive_coverage_error(p, t, "max", -1, w)
    if name == "ranking_loss":
        return naive_ranking_loss(p, t, "index", -1, w)
    if name == "one_error":
        return naive_one_error(p, t, "max", -1, w)
    if name == "retrieval":
        return naive_retrieval(p, t, (1, 3), "max", -1, w, "skip")
    out = {
        "coverage_error": naive_coverage_error(p, t, "max", -1, w),
        "ranking_loss": naive_ranking_loss(p, t, "max", -1, w),
        "one_error": naive_one_error(p, t, "max", -1, w),
        "lwlrap": naive_lwlrap(p, t, "max", -1),
        "lrap": naive_lrap(p, t, "max", -1, w),
    }
    out.update(naive_retrieval(p, t, (2,), "max", -1, w))
    return out


def assert_value(got, want, what):
    if isinstance(want, dict):
        assert sorted(got) == sorted(want), what
        for key in want:
            close(got[key], want[key], f"{what}: {key}")
    else:
        close(got, want, what)


def test_batches_accumulate_to_the_value_over_all_samples():
    preds, target, weight = tie_heavy(10, n=45, ignore_index=-1)
    for name, metric in make_classes().items():
        values = []
        for part in (slice(0, 10), slice(10, 11), slice(11, 11), slice(11, 45)):
            values.append(metric(preds[part], target[part], sample_weight=weight[part]))
        assert_value(metric.compute(), reference_value(name, preds, target, weight), name)
        # forward returns the batch's own value
        assert_value(values[0], reference_value(name, preds[:10], target[:10], weight[:10]), f"{name} forward")


def test_a_rejected_batch_leaves_the_state_as_it_was():
    preds, target, weight = tie_heavy(11, ignore_index=-1)
    for name, metric in make_classes().items():
        metric.update(preds, target, sample_weight=weight)
        before = {key: value.clone() for key, value in metric.metric_state.items()}
        bad_target = target.clone()
        bad_target[3, 2] = 2
        bad_preds = preds.clone()
        bad_preds[5, 1] = math.nan
        for call in (metric.update, metric):
            with pytest.raises(ValueError, match="`target` must contain only"):
                call(preds, bad_target, sample_weight=weight)
            with pytest.raises(ValueError, match="NaN"):
                call(bad_preds, target)
            with pytest.raises(ValueError, match="sample_weight"):
                call(preds, target, sample_weight=weight[:3])
            with pytest.raises(ValueError, match="num_labels"):
                call(preds[:, :4], target[:, :4])
        for key, value in metric.metric_state.items():
            assert torch.equal(value, before[key]), f"{name}: {key}"


def test_bad_options_name_the_argument():
    with pytest.raises(ValueError, match="`k`"):
        MultilabelRetrievalAtK(5, 0)
    with pytest.raises(ValueError, match="`k`"):
        multilabel_retrieval_at_k(torch.rand(2, 3), torch.ones(2, 3), (2, 2))
    with pytest.raises(ValueError, match="`metrics`"):
        multilabel_retrieval_at_k(torch.rand(2, 3), torch.ones(2, 3), 1, metrics=("map",))
    with pytest.raises(ValueError, match="`metrics`"):
        MultilabelRankingMetrics(3, metrics=("coverage",))
    with pytest.raises(ValueError, match="`empty_target`"):
        MultilabelRetrievalAtK(5, 1, empty_target="neg")
    with pytest.raises(ValueError, match="`ties`"):
        multilabel_coverage_error(torch.rand(2, 3), torch.ones(2, 3), ties="min")
    with pytest.raises(ValueError, match="`ignore_index`"):
        MultilabelOneError(3, ignore_index=1)


def test_retrieval_options_are_checked_and_flagged_when_retrieval_is_not_chosen():
    # A bad k or retrieval_metrics was accepted silently when `metrics` left out "retrieval"; a good one was ignored
    # without a word, so a user who forgot "retrieval" got no retrieval metrics and no hint why.
    with pytest.raises(ValueError, match="`k`"):
        MultilabelRankingMetrics(5, metrics=("lwlrap",), k=-3)
    with pytest.raises(ValueError, match="`retrieval_metrics`"):
        MultilabelRankingMetrics(5, metrics=("lwlrap",), retrieval_metrics=("bogus",))
    with pytest.warns(UserWarning, match=r"k=5 apply to the 'retrieval' metrics, .* add 'retrieval' to `metrics`"):
        metric = MultilabelRankingMetrics(5, metrics=("lwlrap", "lrap"), k=5)
    metric.update(torch.tensor([[0.9, 0.1, 0.5, 0.3, 0.2]]), torch.tensor([[0, 0, 1, 0, 0]]))
    assert list(metric.compute()) == ["lwlrap", "lrap"]
    with pytest.warns(UserWarning, match=r"retrieval_metrics='ap' apply"):
        MultilabelRankingMetrics(5, metrics="lwlrap", retrieval_metrics="ap")
    # empty_target only changes the retrieval metrics: a sample without a positive still counts in one_error
    with pytest.warns(UserWarning, match=r"empty_target='skip' apply to the 'retrieval' metrics"):
        metric = MultilabelRankingMetrics(5, metrics=("one_error",), empty_target="skip")
    metric.update(torch.tensor([[0.9, 0.1, 0.5, 0.3, 0.2], [0.1, 0.2, 0.3, 0.4, 0.5]]),
                  torch.tensor([[1, 0, 1, 0, 0], [0, 0, 0, 0, 0]]))
    assert metric.compute()["one_error"].item() == 0.5  # the row without a positive counts (skipped, it would be 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MultilabelRankingMetrics(5, metrics=("lwlrap",), empty_target="zero")  # the defaults say nothing
        MultilabelRankingMetrics(5, k=5, retrieval_metrics="ap")


def test_states_are_sums_with_distinct_names_and_survive_checkpoints_and_half():
    preds, target, weight = tie_heavy(12, ignore_index=-1)
    names = set()
    for name, metric in make_classes().items():
        own = [key for key in metric._defaults if key not in ("options_tag", "retrieval_k", "ranking_metrics_tag")]
        assert all(metric._reductions[key] is not None for key in own)
        if name != "all":
            assert not names & set(own), f"{name} reuses a state name"
            names |= set(own)
        metric.update(preds[:20], target[:20], sample_weight=weight[:20])
        metric.persistent(True)
        fresh = type(metric)(**_init_args(metric))
        fresh.persistent(True)
        fresh.load_state_dict(metric.state_dict())
        for m in (metric, fresh):
            m.to(torch.bfloat16)  # a mixed-precision model moves its metrics: sums stay float64
            m.update(preds[20:], target[20:], sample_weight=weight[20:])
        assert_value(fresh.compute(), reference_value(name, preds, target, weight), f"{name} after a checkpoint")
        assert_value(metric.compute(), reference_value(name, preds, target, weight), name)


def _init_args(metric):
    args = dict(num_labels=metric.num_labels, ties=metric.ties, ignore_index=metric.ignore_index)
    if isinstance(metric, MultilabelRetrievalAtK):
        args.update(k=metric._spec.ks, metrics=metric._spec.retrieval, empty_target=metric.empty_target)
    if isinstance(metric, MultilabelRankingMetrics):
        args.update(metrics=metric._spec.metrics, k=metric._spec.ks)
    return args


def test_metric_collection_keeps_metrics_with_different_options_apart():
    preds, target, _ = tie_heavy(13)
    collection = MetricCollection(
        {
            "r1": MultilabelRetrievalAtK(6, 1, metrics=("precision",)),
            "r2": MultilabelRetrievalAtK(6, 2, metrics=("precision",)),
            "cov": MultilabelCoverageError(6),
            "cov_index": MultilabelCoverageError(6, ties="index"),
            "lwlrap": MultilabelLWLRAP(6),
            "lrap": MultilabelLRAP(6),
            "all": MultilabelRankingMetrics(6, metrics=("coverage_error",)),
        }
    )
    for part in (slice(0, 20), slice(20, 40)):
        collection.update(preds[part], target[part])
    got = collection.compute()
    p, t = preds.numpy(), target.numpy()
    # MetricCollection flattens dict values under their own keys
    close(got["precision@1"], naive_retrieval(p, t, (1,))["precision@1"])
    close(got["precision@2"], naive_retrieval(p, t, (2,))["precision@2"])
    close(got["cov"], naive_coverage_error(p, t))
    close(got["cov_index"], naive_coverage_error(p, t, "index"))
    close(got["coverage_error"], naive_coverage_error(p, t))
    close(got["lwlrap"], naive_lwlrap(p, t))


def test_without_samples_every_score_is_nan():
    metric = MultilabelRankingMetrics(4)
    metric.update(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.long))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics warns that compute ran before any update
        values = metric.compute()
    assert values and all(torch.isnan(value) for value in values.values())


# ---------------------------------------------------------------------------------------------------------------
# the user's own form: a Lightning module


def test_lightning_validation_and_training_steps_on_grad_carrying_logits(tmp_path):
    L = pytest.importorskip("lightning")
    from torch import nn

    g = torch.Generator().manual_seed(14)
    features = torch.randn(96, 8, generator=g)
    target = (torch.rand(96, 5, generator=g) < 0.3).long()
    seen = {"train": [], "val": []}

    class Tagger(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 5)
            self.train_ranking = MultilabelRankingMetrics(5, k=(1, 3))
            self.val_retrieval = MultilabelRetrievalAtK(5, k=(1, 3), metrics=("ap", "ndcg"))
            self.val_coverage = MultilabelCoverageError(5)

        def training_step(self, batch, batch_idx):
            x, y = batch
            logits = self.net(x)
            assert logits.requires_grad
            self.train_ranking.update(logits, y)
            seen["train"].append((logits.detach(), y))
            return nn.functional.binary_cross_entropy_with_logits(logits, y.float())

        def validation_step(self, batch, batch_idx):
            x, y = batch
            with torch.enable_grad():
                logits = self.net(x)
                assert logits.requires_grad
                self.val_retrieval.update(logits, y)
                self.val_coverage.update(logits, y)
            seen["val"].append((logits.detach(), y))
            self.log("val_coverage", self.val_coverage, on_epoch=True)  # a scalar metric: logged as an object

        # Dict-valued metrics: log what compute returns at the end of the epoch, then reset.
        def on_train_epoch_end(self):
            self.log_dict(self.train_ranking.compute())
            self.train_ranking.reset()

        def on_validation_epoch_end(self):
            self.log_dict(self.val_retrieval.compute())
            self.val_retrieval.reset()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)  # the weights stay put: logits seen == logits scored

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(features, target), batch_size=32)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        num_sanity_val_steps=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Tagger(), loader, loader)
    logged = trainer.callback_metrics
    p = torch.cat([l for l, _ in seen["val"]]).double().numpy()
    t = torch.cat([y for _, y in seen["val"]]).numpy()
    want = naive_retrieval(p, t, (1, 3))
    for name in ("ap@1", "ap@3", "ndcg@1", "ndcg@3"):
        assert logged[name].item() == pytest.approx(want[name], abs=1e-6), name
    assert logged["val_coverage"].item() == pytest.approx(naive_coverage_error(p, t), abs=1e-6)
    p = torch.cat([l for l, _ in seen["train"]]).double().numpy()
    t = torch.cat([y for _, y in seen["train"]]).numpy()
    assert logged["lwlrap"].item() == pytest.approx(naive_lwlrap(p, t), abs=1e-6)
    assert logged["ranking_loss"].item() == pytest.approx(naive_ranking_loss(p, t), abs=1e-6)
    assert logged["precision@3"].item() == pytest.approx(naive_retrieval(p, t, (3,))["precision@3"], abs=1e-6)


# ---------------------------------------------------------------------------------------------------------------
# DDP: two gloo processes agree with one process over all the data

DDP_SHARDS = {"uneven": {0: [0, 1, 2], 1: [3]}, "rank 1 idle": {0: [0, 1, 2, 3], 1: []}}


def ddp_batches():
    return [tie_heavy(20 + i, n=n, ignore_index=-1) for i, n in enumerate((9, 14, 7, 25))]


def ddp_metrics():
    return {
        "all": MultilabelRankingMetrics(6, k=(1, 3), ignore_index=-1),
        "retrieval-skip": MultilabelRetrievalAtK(6, (2, 7), empty_target="skip", ties="index", ignore_index=-1),
        "ranking_loss": MultilabelRankingLoss(6, ignore_index=-1),
    }


def _ddp_worker(rank: int, init_file: str, out_dir: str) -> None:
    import os
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=2, timeout=timedelta(seconds=60)
    )
    batches = ddp_batches()
    results = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an idle rank's compute warns that update was never called
        for scenario, shards in DDP_SHARDS.items():
            for name, metric in ddp_metrics().items():
                for index in shards[rank]:
                    preds, target, weight = batches[index]
                    metric.update(preds, target, sample_weight=weight)
                results[scenario, name] = metric.compute()
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    import time

    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("needs gloo")
    out_dir = tmp_path_factory.mktemp("ranking_ddp")
    context = mp.start_processes(
        _ddp_worker, args=(str(out_dir / "init"), str(out_dir)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120
    while not context.join(timeout=1):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the two ranks did not finish within 120 s")
    return [torch.load(out_dir / f"rank{rank}.pt", weights_only=True) for rank in range(2)]


@pytest.mark.parametrize("scenario", list(DDP_SHARDS))
def test_ddp_every_rank_computes_the_value_over_all_shards(ddp_results, scenario):
    batches = ddp_batches()
    used = [batches[i] for rank in range(2) for i in DDP_SHARDS[scenario][rank]]
    preds = torch.cat([b[0] for b in used]).numpy()
    target = torch.cat([b[1] for b in used]).numpy()
    weight = torch.cat([b[2] for b in used]).numpy()
    want = {
        "all": {
            "coverage_error": naive_coverage_error(preds, target, "max", -1, weight),
            "ranking_loss": naive_ranking_loss(preds, target, "max", -1, weight),
            "one_error": naive_one_error(preds, target, "max", -1, weight),
            "lwlrap": naive_lwlrap(preds, target, "max", -1),
            "lrap": naive_lrap(preds, target, "max", -1, weight),
            **naive_retrieval(preds, target, (1, 3), "max", -1, weight),
        },
        "retrieval-skip": naive_retrieval(preds, target, (2, 7), "index", -1, weight, "skip"),
        "ranking_loss": naive_ranking_loss(preds, target, "max", -1, weight),
    }
    for rank, results in enumerate(ddp_results):
        for name, expected in want.items():
            assert_value(results[scenario, name], expected, f"rank {rank}, {scenario}, {name}")


# ---------------------------------------------------------------------------------------------------------------
# no host-device sync in update (checked on the meta device, as tests/test_sync.py does for lwlrap and LRAP)


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
@pytest.mark.parametrize("target_dtype", [torch.bool, torch.int64], ids=str)
@pytest.mark.parametrize("ignore_index", [None, -1], ids=["all-known", "ignore"])
@pytest.mark.parametrize("validate_args", [False, True], ids=["unchecked", "checked"])
def test_update_reads_the_host_only_for_value_checks(ties, target_dtype, ignore_index, validate_args):
    from tests.test_sync import META, HostReads, _batch

    preds, target, weight = _batch("cpu", target_dtype, extra=(2,), ignore_index=ignore_index)
    num_labels = preds.shape[1]
    preds, target, weight = preds.to(META), target.to(META), weight.to(META)
    options = dict(ties=ties, ignore_index=ignore_index, validate_args=validate_args)
    for metric in (
        MultilabelRankingMetrics(num_labels, k=(1, 3), **options),
        MultilabelRetrievalAtK(num_labels, 2, **options),
        MultilabelRankingLoss(num_labels, **options),
    ):
        metric = metric.to(META)
        if ties == "expected":
            # lwlrap's exact "expected" precision copies its tables of harmonic sums to a device once, on first use
            MultilabelRankingMetrics(num_labels, ties=ties, validate_args=False).to(META).update(preds, target)
        with HostReads() as mode:
            metric.update(preds, target, sample_weight=weight)
        assert mode.reads == (["aten._local_scalar_dense.default"] if validate_args else []), type(metric).__name__
        assert all(getattr(metric, name).device == META for name in metric._defaults)


def test_benchmark_script_times_every_entry(tmp_path):
    from benchmarks import ranking_metrics

    assert ranking_metrics.main(["--sizes", "200x12", "--min-run-time", "0.01", "--no-anchors", "--out",
                                 str(tmp_path)]) == 0
    table = (tmp_path / "ranking_metrics.md").read_text()
    for name in ranking_metrics.entries(12, anchors=False):
        assert f"| {name} |" in table


def test_grad_carrying_scores_and_states_made_in_inference_mode():
    preds, target, weight = tie_heavy(17, ignore_index=-1)
    logits = preds.clone().requires_grad_(True) * 1.0  # a non-leaf that carries gradients, as a model's output
    p, t = preds.numpy(), target.numpy()
    close(multilabel_ranking_loss(logits, target, ignore_index=-1), naive_ranking_loss(p, t, "max", -1))
    with torch.inference_mode():  # Lightning's validation loop creates or resets metrics there
        metric = MultilabelRankingMetrics(6, k=2, ignore_index=-1)
    metric.update(logits, target, sample_weight=weight)
    assert_value(metric.compute(), reference_value("all", preds, target, weight), "after inference mode")


@pytest.mark.parametrize("engine", ["sort", "count", "numba"])
@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_ranking_loss_of_a_row_with_more_wrong_pairs_than_an_int32_holds(engine, ties):
    """100,000 labels, half positive: up to 2.5e9 (positive, negative) pairs in one row, past 2**31 - 1."""
    num_labels = 100_000
    rng = np.random.default_rng(24)
    worst = -np.arange(num_labels, dtype=np.float32)  # every positive below every negative
    y = np.zeros((2, num_labels), dtype=np.int64)
    y[:, num_labels // 2 :] = 1
    # no ties (positives' scores end in .5), so every tie rule is scikit-learn's; positives pushed down
    mixed = (rng.permutation(num_labels) - 60_000.5 * y[1]).astype(np.float32)
    s = np.stack([worst, mixed])
    preds, target = torch.from_numpy(s), torch.from_numpy(y)
    want = sklearn_metrics.label_ranking_loss(y, s)
    assert sklearn_metrics.label_ranking_loss(y[:1], s[:1]) == 1.0  # the reference itself, on the worst row
    assert sklearn_metrics.label_ranking_loss(y[1:], s[1:]) * (num_labels // 2) ** 2 > 2**31  # the mixed row too
    with use_engine(engine):
        close(multilabel_ranking_loss(preds, target, ties=ties), want)
        metric = MultilabelRankingMetrics(num_labels, ties=ties)
        metric.update(preds, target)
        close(metric.compute()["ranking_loss"], want)
