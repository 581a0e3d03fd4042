"""CPU inputs are scored on the CPU whatever torch's default device is.

A training script often starts with ``torch.set_default_device("cuda")`` (or builds its model under ``with
torch.device("cuda"):``) and then scores predictions gathered on the CPU. Every tensor the library allocates for a
batch must follow the inputs, not the default device: the compiled CPU passes read their work tensors through
numpy, and the bootstrap adds into the inputs' sums. The ``meta`` device stands in for a GPU here (any device other
than the inputs' shows a tensor allocated on the wrong one), and CUDA is used as well where there is one.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score as sklearn_lrap

import torch_lwlrap as T
from tests.conftest import engine_paths_for
from torch_lwlrap.plot import plot_values

OTHER_DEVICES = ["meta"] + (["cuda"] if torch.cuda.is_available() else [])

_g = torch.Generator().manual_seed(0)
PREDS = torch.randn(40, 7, generator=_g)
TARGET = torch.rand(40, 7, generator=_g) < 0.35
TARGET[0] = True
RELEVANCE = torch.randint(0, 4, (40, 7), generator=_g)
OTHER = PREDS + 0.5 * torch.randn(40, 7, generator=_g)
WEIGHT = torch.rand(40, generator=_g) + 0.5

# Every public function, called as a user calls it.
FUNCTIONS = {
    "multilabel_lwlrap": lambda: T.multilabel_lwlrap(PREDS, TARGET),
    "multilabel_lwlrap_per_class": lambda: T.multilabel_lwlrap_per_class(PREDS, TARGET),
    "multilabel_lrap": lambda: T.multilabel_lrap(PREDS, TARGET.long(), ignore_index=-1, sample_weight=WEIGHT),
    "multilabel_coverage_error": lambda: T.multilabel_coverage_error(PREDS, TARGET),
    "multilabel_ranking_loss": lambda: T.multilabel_ranking_loss(PREDS, TARGET),
    "multilabel_one_error": lambda: T.multilabel_one_error(PREDS, TARGET),
    "multilabel_retrieval_at_k": lambda: T.multilabel_retrieval_at_k(PREDS, TARGET, k=3),
    "multilabel_ndcg": lambda: T.multilabel_ndcg(PREDS, RELEVANCE, k=5),
    "multilabel_rank_correlation": lambda: T.multilabel_rank_correlation(PREDS, OTHER, method="kendall"),
    "multilabel_kendall_distance_at_k": lambda: T.multilabel_kendall_distance_at_k(PREDS, OTHER, k=3),
    "tie_report": lambda: T.tie_report(PREDS.round(decimals=0), TARGET),
    "multilabel_lwlrap_ci": lambda: T.multilabel_lwlrap_ci(PREDS, TARGET, num_bootstrap=50, seed=3),
    "multilabel_lrap_ci": lambda: T.multilabel_lrap_ci(PREDS, TARGET, num_bootstrap=50, seed=3),
    "compare_lwlrap": lambda: T.compare_lwlrap(PREDS, OTHER, TARGET, num_bootstrap=50, seed=3),
}
EXPECTED_TIES = {"multilabel_lwlrap_ties_expected": lambda: T.multilabel_lwlrap(PREDS.round(), TARGET, ties="expected")}


def _tensors(value):
    """The tensors of a result (a tensor, a dict, a named tuple or a dataclass of them), in a fixed order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value) for t in _tensors(value[key])]
    if isinstance(value, tuple):
        return [t for item in value for t in _tensors(item)]
    if hasattr(value, "__dataclass_fields__"):
        return [t for name in value.__dataclass_fields__ for t in _tensors(getattr(value, name))]
    if isinstance(value, (int, float)):  # a report's counts and values
        return [torch.tensor(value, dtype=torch.float64, device="cpu")]
    return []


def _assert_same(got, expected, name):
    got, expected = _tensors(got), _tensors(expected)
    assert expected and len(got) == len(expected), name
    for a, b in zip(got, expected):
        assert a.device.type == "cpu", f"{name}: a result on {a.device}"
        torch.testing.assert_close(a, b, rtol=1e-12, atol=0, equal_nan=True, msg=name)


def test_every_public_function_is_covered():
    public = {name for name in T.__all__ if name[0].islower() and callable(getattr(T, name))}
    assert public - {"get_engine", "use_engine"} == set(FUNCTIONS)


@pytest.mark.parametrize("how", ["set_default_device", "context"])
@pytest.mark.parametrize("device", OTHER_DEVICES)
@pytest.mark.parametrize("engine", ["auto", *engine_paths_for("cpu")])
def test_functions_score_cpu_inputs_on_the_cpu(engine, device, how):
    calls = {**FUNCTIONS, **EXPECTED_TIES}
    with T.use_engine(engine), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate-interval and compile notices: not what this test is about
        expected = {name: call() for name, call in calls.items()}
        if how == "context":
            with torch.device(device):
                got = {name: call() for name, call in calls.items()}
        else:
            torch.set_default_device(device)
            try:
                got = {name: call() for name, call in calls.items()}
            finally:
                torch.set_default_device(None)
    for name in calls:
        _assert_same(got[name], expected[name], name)
    # and the values themselves: scikit-learn's LRAP of the same rows
    reference = sklearn_lrap(TARGET.long().numpy(), PREDS.double().numpy(), sample_weight=WEIGHT.double().numpy())
    assert got["multilabel_lrap"].item() == pytest.approx(reference, rel=1e-12)


@pytest.mark.parametrize("device", OTHER_DEVICES)
def test_metrics_made_on_the_cpu_update_and_compute_under_another_default_device(device):
    # The training loop's form: the metrics built on the CPU, the default device set afterwards, the batches on the CPU.
    metrics = {
        "lwlrap": T.MultilabelLWLRAP(7, num_bootstrap=20, bootstrap_seed=1),
        "lrap": T.MultilabelLRAP(7, num_bootstrap=20, bootstrap_seed=1),
        "family": T.MultilabelRankingMetrics(7),
        "retrieval": T.MultilabelRetrievalAtK(7, k=3),
        "ties": T.MultilabelTieReport(7),
        "ndcg": T.MultilabelNDCG(7, k=5),
        "kendall": T.MultilabelRankCorrelation(7, method="kendall"),
        "distance": T.MultilabelKendallDistanceAtK(7, k=3),
    }
    second = {name: metric.clone() for name, metric in metrics.items()}

    def feed(bank):
        for rows in (slice(0, 13), slice(13, 40)):
            for name, metric in bank.items():
                if name in ("ndcg",):
                    metric.update(PREDS[rows], RELEVANCE[rows])
                elif name in ("kendall", "distance"):
                    metric.update(PREDS[rows], OTHER[rows])
                else:
                    metric.update(PREDS[rows], TARGET[rows])
        return {name: metric.compute() for name, metric in bank.items()}

    expected = feed(metrics)
    with torch.device(device):
        got = feed(second)
        # what a loop does beside update: merge another process's or loader's metric, keep the sums in float32
        merged = {name: metric.clone() for name, metric in second.items()}
        for name, metric in merged.items():
            if name not in ("lwlrap", "lrap"):  # a bootstrap metric refuses to merge (its replicates would repeat)
                metric.merge_state(second[name])
            metric.set_dtype(torch.float32)
    for name in metrics:
        _assert_same(got[name], expected[name], name)
    merged_values = {name: metric.compute() for name, metric in merged.items()}
    twice = {name: metric.clone() for name, metric in second.items()}
    twice = {**feed({name: m for name, m in twice.items() if name not in ("lwlrap", "lrap")}),
             "lwlrap": got["lwlrap"], "lrap": got["lrap"]}  # every batch seen twice; the bootstrap ones once
    for name in metrics:
        for a, b in zip(_tensors(merged_values[name]), _tensors(twice[name])):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-9, equal_nan=True, msg=name)


@pytest.mark.parametrize("device", OTHER_DEVICES)
def test_plot_values_takes_python_numbers_under_another_default_device(device):
    plt = pytest.importorskip("matplotlib.pyplot", reason="needs matplotlib (pip install matplotlib)")
    with torch.device(device):
        fig, ax = plot_values({"lwlrap": 0.79, "coverage_error": torch.tensor(2.5, device="cpu")})
    assert [round(bar.get_width(), 6) for bar in ax.patches] == [0.79, 2.5]
    plt.close(fig)
