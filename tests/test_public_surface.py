"""What a user meets first: the names the package exports, the errors that tell them how to call it, the plots of
every metric and the warnings of an interval that cannot mean anything yet."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings

import pytest
import torch

import torch_lwlrap
from tests.reference import make_case, naive_lwlrap
from torch_lwlrap import _dispatch, _ranking

plt = pytest.importorskip("matplotlib.pyplot", reason="needs matplotlib (pip install matplotlib)")


# --- names -----------------------------------------------------------------------------------------------------


def test_engine_setting_is_exported():
    from torch_lwlrap import get_engine, use_engine

    assert use_engine is _ranking.use_engine and get_engine is _ranking.get_engine
    preds, target = make_case(3, 30, 6)
    with use_engine("sort"):
        assert get_engine() == "sort"
        value = torch_lwlrap.multilabel_lwlrap(preds, target)
    assert value.item() == pytest.approx(naive_lwlrap(preds, target), rel=1e-12)


def test_dir_lists_every_public_name_and_each_resolves():
    listed = dir(torch_lwlrap)
    assert set(torch_lwlrap.__all__) <= set(listed)
    for name in torch_lwlrap.__all__:
        assert getattr(torch_lwlrap, name) is not None, name


def test_dir_stays_lazy_in_a_fresh_process():
    # Tab completion lists the names without importing torch (the command line pays for torch only when it ranks).
    code = "import sys, torch_lwlrap; names = dir(torch_lwlrap); print('torch' in sys.modules, 'use_engine' in names)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


# --- swapped arguments name the call the user made ---------------------------------------------------------------

FUNCTIONS = {
    "multilabel_lwlrap": lambda p, t: torch_lwlrap.multilabel_lwlrap(p, t),
    "multilabel_lwlrap_per_class": lambda p, t: torch_lwlrap.multilabel_lwlrap_per_class(p, t),
    "multilabel_lrap": lambda p, t: torch_lwlrap.multilabel_lrap(p, t),
    "multilabel_ranking_loss": lambda p, t: torch_lwlrap.multilabel_ranking_loss(p, t),
    "multilabel_coverage_error": lambda p, t: torch_lwlrap.multilabel_coverage_error(p, t),
    "multilabel_one_error": lambda p, t: torch_lwlrap.multilabel_one_error(p, t),
    "multilabel_retrieval_at_k": lambda p, t: torch_lwlrap.multilabel_retrieval_at_k(p, t, k=2),
    "tie_report": lambda p, t: torch_lwlrap.tie_report(p, t),
    "multilabel_lwlrap_ci": lambda p, t: torch_lwlrap.multilabel_lwlrap_ci(p, t, num_bootstrap=50),
    "multilabel_lrap_ci": lambda p, t: torch_lwlrap.multilabel_lrap_ci(p, t, num_bootstrap=50),
}


def _swapped():
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(6, 4, generator=g)
    labels = (torch.rand(6, 4, generator=g) < 0.5).long()
    return labels, scores  # in the wrong order


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_swapped_arguments_name_the_function_called(name):
    labels, scores = _swapped()
    with pytest.raises(TypeError, match="look swapped") as error:
        FUNCTIONS[name](labels, scores)
    assert f"`{name}(preds=scores, target=labels)`" in str(error.value)


def test_swapped_arguments_of_compare_name_its_three_arguments():
    labels, scores = _swapped()
    with pytest.raises(TypeError, match=r"`compare_lwlrap\(preds_a=scores_a, preds_b=scores_b, target=labels\)`"):
        torch_lwlrap.compare_lwlrap(labels, labels, scores, num_bootstrap=50)


CLASSES = {
    "MultilabelLWLRAP": lambda: torch_lwlrap.MultilabelLWLRAP(num_labels=4),
    "MultilabelLRAP": lambda: torch_lwlrap.MultilabelLRAP(num_labels=4),
    "MultilabelTieReport": lambda: torch_lwlrap.MultilabelTieReport(num_labels=4),
    "MultilabelRankingLoss": lambda: torch_lwlrap.MultilabelRankingLoss(num_labels=4),
    "MultilabelCoverageError": lambda: torch_lwlrap.MultilabelCoverageError(num_labels=4),
    "MultilabelOneError": lambda: torch_lwlrap.MultilabelOneError(num_labels=4),
    "MultilabelRetrievalAtK": lambda: torch_lwlrap.MultilabelRetrievalAtK(num_labels=4, k=2),
    "MultilabelRankingMetrics": lambda: torch_lwlrap.MultilabelRankingMetrics(num_labels=4),
}


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_swapped_arguments_name_the_metric_and_its_method(name):
    labels, scores = _swapped()
    metric = CLASSES[name]()
    with pytest.raises(TypeError, match="look swapped") as error:
        metric.update(labels, scores)
    assert f"`metric.update(preds=scores, target=labels)` on your {name}" in str(error.value)
    with pytest.raises(TypeError, match="look swapped") as error:
        metric(labels, scores)  # forward, as a training step calls it
    assert f"`metric(preds=scores, target=labels)` on your {name}" in str(error.value)


# --- plots of every metric -----------------------------------------------------------------------------------------


def _bars(ax):
    """``{label: width}`` of a horizontal bar chart."""
    labels = [tick.get_text() for tick in ax.get_yticklabels()]
    return dict(zip(labels, [patch.get_width() for patch in ax.patches[: len(labels)]]))


@pytest.mark.parametrize("name", ["MultilabelRankingMetrics", "MultilabelRetrievalAtK"])
def test_dict_valued_metrics_plot_a_bar_per_value(name):
    preds, target = make_case(5, 40, 4)
    metric = CLASSES[name]()
    metric.update(preds, target)
    values = metric.compute()
    fig, ax = metric.plot()
    bars = _bars(ax)
    assert list(bars) == list(values)
    for key, value in values.items():
        assert bars[key] == pytest.approx(value.item() if math.isfinite(value.item()) else 0.0, abs=1e-12), key
    steps = [metric(preds[:20], target[:20]), metric(preds[20:], target[20:])]
    fig2, ax2 = metric.plot(steps)  # several steps: one line per value, as torchmetrics draws them
    assert len(ax2.get_lines()) >= len(values)
    plt.close(fig)
    plt.close(fig2)


@pytest.mark.parametrize("name", ["MultilabelRankingLoss", "MultilabelCoverageError", "MultilabelOneError"])
def test_scalar_ranking_metrics_plot_like_torchmetrics(name):
    preds, target = make_case(6, 30, 4)
    metric = CLASSES[name]()
    values = [metric(preds[:15], target[:15]), metric(preds[15:], target[15:])]
    fig, ax = metric.plot()
    assert ax.get_lines()[0].get_ydata()[0] == pytest.approx(metric.compute().item(), abs=1e-12)
    fig2, _ = metric.plot(values)
    plt.close(fig)
    plt.close(fig2)


def test_tie_report_plot_draws_each_rule_and_the_range_over_tie_orders():
    metric = torch_lwlrap.MultilabelTieReport(num_labels=4)
    metric.update(torch.tensor([[1.0, 1.0, 1.0, 0.2]]), torch.tensor([[1, 0, 1, 0]]))
    values = metric.compute()
    fig, ax = metric.plot()
    bars = _bars(ax)
    assert list(bars) == ["tied_share", "lwlrap_max", "lwlrap_expected", "lwlrap_best", "lwlrap_worst"]
    for key, value in values.items():
        assert bars[key] == pytest.approx(value.item(), abs=1e-12)
    # The shaded range: from the worst order (1/2 + 2/3) / 2 to the best (1 + 1) / 2, over the lwlrap rows only.
    (band,) = [c for c in ax.collections if c.get_label().startswith("lwlrap over tie orders")]
    xs, ys = band.get_paths()[0].vertices.T
    assert (xs.min(), xs.max()) == pytest.approx((7 / 12, 1.0), abs=1e-12)
    assert ys.min() > 0.5  # below the tied_share row (row 0)
    plt.close(fig)


# --- intervals that cannot mean anything yet warn -----------------------------------------------------------------


def test_interval_before_any_update_warns_as_compute_does():
    metric = torch_lwlrap.MultilabelLWLRAP(num_labels=4, num_bootstrap=100, bootstrap_seed=0)
    with pytest.warns(UserWarning, match=r"confidence_interval\(\) is undefined, \(nan, nan\)"):
        low, high = metric.confidence_interval()
    assert math.isnan(low.item()) and math.isnan(high.item())
    lrap = torch_lwlrap.MultilabelLRAP(num_labels=4, num_bootstrap=100, bootstrap_seed=0)
    with pytest.warns(UserWarning, match="no bootstrap replicate holds"):
        lrap.confidence_interval()


def test_per_class_before_any_update_warns_as_compute_does():
    metric = torch_lwlrap.MultilabelLWLRAP(num_labels=4)
    with pytest.warns(UserWarning, match=r"``per_class`` method of metric MultilabelLWLRAP was called before"):
        per_class, weights = metric.per_class()
    assert torch.isnan(per_class).all() and not weights.any()
    metric.update(*make_case(3, 10, 4))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.per_class()


def test_too_few_replicates_warn_and_say_how_many_the_level_needs():
    preds, target = make_case(7, 200, 6)
    metric = torch_lwlrap.MultilabelLWLRAP(num_labels=6, num_bootstrap=1, bootstrap_seed=0)
    metric.update(preds, target)
    with pytest.warns(UserWarning, match=r"from 1 bootstrap replicate\(s\) is degenerate.*at least 40 replicates"):
        low, high = metric.confidence_interval()
    assert low.item() == high.item()  # why it warns: one replicate, an interval of width 0
    with pytest.warns(UserWarning, match=r"at least 200 replicates"):
        torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=100, level=0.99)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=40, level=0.95)  # enough: no warning


def test_a_level_beyond_the_largest_replicate_count_asks_for_a_lower_level_not_for_more_replicates():
    from torch_lwlrap._options import MAX_REPLICATES
    from torch_lwlrap.stats._bootstrap import _MAX_LEVEL, min_replicates

    # 2 / (1 - level) with the level as written: 1 - 0.9999999 is 1e-7 (the float below it had asked for one more).
    assert min_replicates(0.9999999) == 20_000_000
    assert min_replicates(0.999) == 2000
    # the advised level is the highest of 7 decimals that the most replicates allowed can serve
    assert min_replicates(float(_MAX_LEVEL)) <= MAX_REPLICATES < min_replicates(float(_MAX_LEVEL) + 1e-7)
    preds, target = make_case(8, 60, 5)
    with pytest.warns(UserWarning, match=r"more than the 2\*\*24 \(16777216\).*level of at most 0\.9999998") as caught:
        torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=1000, level=0.9999999, seed=0)
    assert "Use at least" not in str(caught[0].message)  # no advice the argument check would refuse
    with pytest.raises(ValueError, match="at most 2\\*\\*24"):
        torch_lwlrap.multilabel_lwlrap_ci(preds, target, num_bootstrap=20_000_000, level=0.9999999, seed=0)


# --- a forced engine that cannot serve the tensors says so --------------------------------------------------------


def test_triton_forced_on_cpu_tensors_warns_once_naming_the_path_used(monkeypatch):
    from torch_lwlrap import _triton_kernel

    if _triton_kernel.is_available("cpu"):
        pytest.skip("Triton's interpreter ranks CPU tensors in this process")
    monkeypatch.setattr(_dispatch, "_warned", set())
    monkeypatch.setenv("TORCH_LWLRAP_ENGINE", "triton")
    metric = torch_lwlrap.MultilabelLWLRAP(num_labels=6)
    batches = [make_case(20 + i, 16, 6) for i in range(3)]
    with pytest.warns(torch_lwlrap.EngineFallbackWarning) as record:
        for preds, target in batches:
            metric.update(preds.requires_grad_(), target)
    assert len(record) == 1
    message = str(record[0].message)
    assert "triton engine cannot rank cpu tensors" in message and "torch sort path" in message
    assert "TORCH_LWLRAP_ENGINE=auto" in message
    all_preds = torch.cat([p.detach() for p, _ in batches])
    all_target = torch.cat([t for _, t in batches])
    assert metric.compute().item() == pytest.approx(naive_lwlrap(all_preds, all_target), rel=1e-12)
    # forced by a use_engine block (which takes precedence over the variable): the fix names the block
    monkeypatch.setattr(_dispatch, "_warned", set())
    monkeypatch.delenv("TORCH_LWLRAP_ENGINE")
    with torch_lwlrap.use_engine("triton"), pytest.warns(torch_lwlrap.EngineFallbackWarning) as record:
        torch_lwlrap.multilabel_lwlrap(*batches[0])
    message = str(record[0].message)
    assert 'use `use_engine("auto")` (or leave the `use_engine("triton")` block)' in message
    assert "TORCH_LWLRAP_ENGINE" not in message


def test_the_packages_export_what_the_top_level_loads_from_them():
    import torch_lwlrap.functional
    import torch_lwlrap.metrics

    for package in (torch_lwlrap.functional, torch_lwlrap.metrics):
        assert set(package.__all__) == set(torch_lwlrap._HOMES[package.__name__]), package.__name__
        for name in package.__all__:
            assert getattr(torch_lwlrap, name) is getattr(package, name)


def test_integer_arguments_may_be_numpy_integers():
    # k, num_labels, ignore_index, num_bootstrap and seeds often come from a config or an array as numpy integers:
    # taken as the Python ints they equal (the same values, options and checkpoint tags); bools stay refused.
    import numpy as np

    from tests.reference import make_case
    from torch_lwlrap import (
        MultilabelKendallDistanceAtK,
        MultilabelLWLRAP,
        MultilabelNDCG,
        MultilabelRetrievalAtK,
        multilabel_kendall_distance_at_k,
        multilabel_lwlrap,
        multilabel_lwlrap_ci,
        multilabel_ndcg,
        multilabel_retrieval_at_k,
    )

    preds, target = make_case(3, 30, 6, ignore_index=-1)
    other = make_case(4, 30, 6)[0]
    n = np.int64
    calls = [
        lambda i: multilabel_lwlrap(preds, target, ignore_index=i(-1)),
        lambda i: multilabel_retrieval_at_k(preds, target, i(2), ignore_index=i(-1)),
        lambda i: multilabel_retrieval_at_k(preds, target, (i(1), i(3)), ignore_index=np.int32(-1)),
        lambda i: multilabel_kendall_distance_at_k(preds, other, i(3)),
        lambda i: multilabel_ndcg(preds, target.clamp(min=0), k=i(2)),
        lambda i: tuple(multilabel_lwlrap_ci(preds, target, ignore_index=i(-1), num_bootstrap=i(40), seed=i(5))),
    ]
    for call in calls:
        want, got = call(int), call(n)
        if isinstance(want, dict):
            assert want.keys() == got.keys() and all(torch.equal(want[key], got[key]) for key in want)
        elif isinstance(want, tuple):
            assert all(torch.equal(a, b) for a, b in zip(want, got))
        else:
            assert torch.equal(want, got)
    for make in (
        lambda i: MultilabelLWLRAP(i(6), ignore_index=i(-1), num_bootstrap=i(4), bootstrap_seed=i(2)),
        lambda i: MultilabelRetrievalAtK(i(6), i(2), ignore_index=i(-1)),
        lambda i: MultilabelKendallDistanceAtK(i(6), i(3)),
        lambda i: MultilabelNDCG(np.uint8(6), k=i(2), ignore_index=i(-1)),
    ):
        plain, numpy_made = make(int), make(n)
        assert torch.equal(plain.options_tag, numpy_made.options_tag)
        assert all(type(value) in (int, str, tuple, type(None)) for value in numpy_made._option_values().values())
    with pytest.raises(ValueError, match=r"`k` must be a positive integer, but got True"):
        multilabel_kendall_distance_at_k(preds, other, True)
    with pytest.raises(ValueError, match=r"`num_labels` must be a positive integer, but got np.float64\(6.0\)|"
                                         r"`num_labels` must be a positive integer, but got 6.0"):
        MultilabelLWLRAP(np.float64(6))


def test_use_engine_reads_a_name_as_the_environment_variable_does_and_complex_scores_are_not_called_swapped():
    with torch_lwlrap.use_engine(" Sort "):
        assert torch_lwlrap.get_engine() == "sort"
    with pytest.raises(ValueError, match=r"Argument `engine` must be one of .* but got 'bogus'"):
        with torch_lwlrap.use_engine("bogus"):
            pass
    preds, target = make_case(1, 6, 4)
    with pytest.raises(TypeError, match=r"got dtype torch.complex64\. Ranking is done on the raw scores") as caught:
        torch_lwlrap.multilabel_lwlrap(preds.to(torch.complex64), target.float())
    assert "swapped" not in str(caught.value)
