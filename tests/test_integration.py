"""torchmetrics conventions (collections, Metric options, forward, copies, state dicts) and plots.

Every value is checked against the naive formula loops of :mod:`tests.reference`.
"""

from __future__ import annotations

import copy
import math
import warnings
import pickle

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torchmetrics import MetricCollection  # noqa: E402

from tests.reference import naive_lrap, naive_lwlrap, naive_lwlrap_per_class  # noqa: E402
from torch_lwlrap import MultilabelLRAP, MultilabelLWLRAP, MultilabelTieReport  # noqa: E402
from torch_lwlrap.plot import plot_per_class  # noqa: E402

NUM_LABELS = 6
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_batches(seed, sizes=(7, 12, 5), num_labels=NUM_LABELS):
    """Scores k/4 (many ties, exact in float16) and labels with about a third positive."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for n in sizes:
        preds = torch.randint(0, 5, (n, num_labels), generator=g).float() / 4
        target = (torch.rand(n, num_labels, generator=g) < 0.35).long()
        batches.append((preds, target))
    return batches


def cat(batches):
    return torch.cat([p for p, _ in batches]), torch.cat([t for _, t in batches])


def naive(metric, preds, target):
    """The naive value of what ``metric`` (a MultilabelLWLRAP or MultilabelLRAP) computes over the given data."""
    if isinstance(metric, MultilabelLWLRAP):
        return naive_lwlrap(preds, target, ties=metric.ties, ignore_index=metric.ignore_index, average=metric.average)
    return naive_lrap(preds, target, ties=metric.ties, ignore_index=metric.ignore_index)


def assert_value(value, expected):
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert value.dtype == torch.float64
    assert torch.allclose(value, expected, rtol=0, atol=1e-12, equal_nan=True), (value, expected)


def assert_state_dtypes(metric):
    if isinstance(metric, MultilabelLWLRAP):
        assert metric.precision_sum.dtype == torch.float64 and metric.label_count.dtype == torch.int64
    else:
        assert metric.lrap_sum.dtype == torch.float64 and metric.weight_sum.dtype == torch.float64


METRICS = {
    "lwlrap": lambda **kw: MultilabelLWLRAP(NUM_LABELS, **kw),
    "lwlrap-macro-index": lambda **kw: MultilabelLWLRAP(NUM_LABELS, average="macro", ties="index", **kw),
    "lwlrap-none": lambda **kw: MultilabelLWLRAP(NUM_LABELS, average="none", **kw),
    "lrap": lambda **kw: MultilabelLRAP(NUM_LABELS, **kw),
    "lrap-index": lambda **kw: MultilabelLRAP(NUM_LABELS, ties="index", **kw),
}


# ---------------------------------------------------------------------------------------------------------------
# MetricCollection


def test_collection_keeps_the_two_metrics_in_separate_compute_groups():
    batches = make_batches(0)
    collection = MetricCollection([MultilabelLWLRAP(NUM_LABELS), MultilabelLRAP(NUM_LABELS)])
    for preds, target in batches:
        collection.update(preds, target)
    groups = sorted(sorted(members) for members in collection.compute_groups.values())
    assert groups == [["MultilabelLRAP"], ["MultilabelLWLRAP"]]
    values = collection.compute()
    preds, target = cat(batches)
    assert_value(values["MultilabelLWLRAP"], naive_lwlrap(preds, target))
    assert_value(values["MultilabelLRAP"], naive_lrap(preds, target))


def test_collection_with_the_tie_report_beside_lwlrap_expected():
    # Both tagged with "expected" and the same options: their states differ in names, so they never share a group.
    batches = make_batches(5)
    collection = MetricCollection(
        {"lwlrap": MultilabelLWLRAP(NUM_LABELS, ties="expected"), "ties": MultilabelTieReport(NUM_LABELS)}
    )
    for preds, target in batches:
        collection.update(preds, target)
    assert sorted(sorted(members) for members in collection.compute_groups.values()) == [["lwlrap"], ["ties"]]
    preds, target = cat(batches)
    values = collection.compute()
    expected = naive_lwlrap(preds, target, ties="expected")
    assert_value(values["lwlrap"], expected)
    # The report's dict is flattened into the collection's (key names differ across torchmetrics versions).
    [report_expected] = [value for key, value in values.items() if key.endswith("lwlrap_expected")]
    assert_value(report_expected, expected)
    [report_max] = [value for key, value in values.items() if key.endswith("lwlrap_max")]
    assert_value(report_max, naive_lwlrap(preds, target, ties="max"))


def test_collection_forward_returns_batch_values_and_accumulates():
    batches = make_batches(1)
    collection = MetricCollection({"lwlrap": MultilabelLWLRAP(NUM_LABELS), "lrap": MultilabelLRAP(NUM_LABELS)})
    for preds, target in batches:
        step = collection(preds, target)
        assert_value(step["lwlrap"], naive_lwlrap(preds, target))
        assert_value(step["lrap"], naive_lrap(preds, target))
    preds, target = cat(batches)
    values = collection.compute()
    assert_value(values["lwlrap"], naive_lwlrap(preds, target))
    assert_value(values["lrap"], naive_lrap(preds, target))
    collection.reset()
    collection.update(*batches[0])
    assert_value(collection.compute()["lwlrap"], naive_lwlrap(*batches[0]))


def test_collection_passes_sample_weight_to_lrap_only():
    batches = make_batches(2)
    weights = [torch.rand(len(p), generator=torch.Generator().manual_seed(i)) for i, (p, _) in enumerate(batches)]
    collection = MetricCollection({"lwlrap": MultilabelLWLRAP(NUM_LABELS), "lrap": MultilabelLRAP(NUM_LABELS)})
    for (preds, target), weight in zip(batches, weights):
        collection.update(preds, target, sample_weight=weight)
    preds, target = cat(batches)
    values = collection.compute()
    assert_value(values["lwlrap"], naive_lwlrap(preds, target))
    assert_value(values["lrap"], naive_lrap(preds, target, sample_weight=torch.cat(weights).tolist()))


def test_collection_shares_the_state_of_lwlrap_averages():
    # the three averages keep the same sums: one compute group, each average still right
    batches = make_batches(3)
    collection = MetricCollection(
        {average: MultilabelLWLRAP(NUM_LABELS, average=average) for average in ("weighted", "macro", "none")}
    )
    for preds, target in batches:
        collection.update(preds, target)
    assert len(collection.compute_groups) == 1
    preds, target = cat(batches)
    values = collection.compute()
    for average in ("weighted", "macro", "none"):
        assert_value(values[average], naive_lwlrap(preds, target, average=average))


def test_collection_with_different_tie_rules_without_compute_groups():
    # a first batch without ties, then ties: the two tie rules only differ from the second batch on
    first = (torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.tensor([[1, 0, 1, 0]]))
    second = (torch.tensor([[0.5, 0.5, 0.5, 0.5]]), torch.tensor([[0, 1, 1, 0]]))
    collection = MetricCollection(
        {"max": MultilabelLWLRAP(4, ties="max"), "index": MultilabelLWLRAP(4, ties="index")}, compute_groups=False
    )
    collection.update(*first)
    collection.update(*second)
    preds, target = cat([first, second])
    values = collection.compute()
    assert_value(values["max"], naive_lwlrap(preds, target, ties="max"))
    assert_value(values["index"], naive_lwlrap(preds, target, ties="index"))
    # the two must not have been merged into one compute group, whatever their states after the first batch
    assert not any({"max", "index"} <= set(group) for group in collection.compute_groups.values())
    assert values["max"] != values["index"]


def test_collection_with_different_tie_rules_and_compute_groups():
    first = (torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.tensor([[1, 0, 1, 0]]))
    second = (torch.tensor([[0.5, 0.5, 0.5, 0.5]]), torch.tensor([[0, 1, 1, 0]]))
    collection = MetricCollection({"max": MultilabelLWLRAP(4, ties="max"), "index": MultilabelLWLRAP(4, ties="index")})
    collection.update(*first)
    collection.update(*second)
    preds, target = cat([first, second])
    values = collection.compute()
    assert_value(values["max"], naive_lwlrap(preds, target, ties="max"))
    assert_value(values["index"], naive_lwlrap(preds, target, ties="index"))
    # the two must not have been merged into one compute group, whatever their states after the first batch
    assert not any({"max", "index"} <= set(group) for group in collection.compute_groups.values())


def first_state_equal(metric1, metric2):
    """How torchmetrics before 1.7 decides whether two metrics can share one compute group: its state comparison
    returns after the *first* tensor state (a ``return`` inside the loop over ``_defaults``)."""
    if metric1._defaults.keys() != metric2._defaults.keys():
        return False
    key = next(iter(metric1._defaults))
    state1, state2 = getattr(metric1, key), getattr(metric2, key)
    return state1.shape == state2.shape and torch.allclose(state1.double(), state2.double())


@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP])
@pytest.mark.parametrize(
    "other",
    [{"ties": "index"}, {"ignore_index": -1}, {"ignore_index": 2}, {"num_labels": 5}],
    ids=["ties", "ignore_index", "another_ignore_index", "num_labels"],
)
def test_metrics_with_different_options_never_look_equal_to_older_torchmetrics(cls, other):
    # a batch without ties or ignored labels: every option gives the same sums, only the options tell them apart
    preds, target = torch.tensor([[0.1, 0.2, 0.3, 0.4]]), torch.tensor([[1, 0, 1, 0]])
    kwargs = {"num_labels": 4, "ignore_index": 3}
    base, changed = cls(**kwargs), cls(**{**kwargs, **other})
    if "num_labels" not in other:
        base.update(preds, target)
        changed.update(preds, target)
    assert not first_state_equal(base, changed)
    assert first_state_equal(base, cls(**kwargs))  # same options: still one compute group


# ---------------------------------------------------------------------------------------------------------------
# Metric options and conventions


@pytest.mark.parametrize("name", sorted(METRICS))
@pytest.mark.parametrize(
    "kwargs",
    [{}, {"compute_on_cpu": True}, {"sync_on_compute": False}, {"dist_sync_on_step": True}],
    ids=["default", "compute_on_cpu", "no_sync_on_compute", "dist_sync_on_step"],
)
def test_forward_returns_batch_value_while_accumulating(name, kwargs, device):
    metric = METRICS[name](**kwargs).to(device)
    batches = make_batches(4)
    for preds, target in batches:
        assert_value(metric(preds.to(device), target.to(device)).cpu(), naive(metric, preds, target))
        assert_state_dtypes(metric)
    assert_value(metric.compute().cpu(), naive(metric, *cat(batches)))
    metric.reset()
    assert_state_dtypes(metric)
    if isinstance(metric, MultilabelLWLRAP):
        assert not metric.precision_sum.any() and not metric.label_count.any()
    else:
        assert metric.lrap_sum == 0 and metric.weight_sum == 0
    metric.update(batches[1][0].to(device), batches[1][1].to(device))
    assert_value(metric.compute().cpu(), naive(metric, *batches[1]))


@pytest.mark.parametrize("name", sorted(METRICS))
def test_to_cpu_and_half_keep_states_and_values(name):
    metric = METRICS[name]()
    batches = make_batches(5)
    metric.update(*batches[0])
    metric = metric.to("cpu").half()
    assert_state_dtypes(metric)
    # scores k/4 are exact in float16: half-precision scores rank the same
    for preds, target in batches[1:]:
        metric.update(preds.half(), target)
    assert_state_dtypes(metric)
    assert_value(metric.compute(), naive(metric, *cat(batches)))


@pytest.mark.parametrize("name", sorted(METRICS))
def test_state_dict_round_trip(name):
    batches = make_batches(6)
    metric = METRICS[name]()
    assert metric.state_dict() == {}  # torchmetrics default: states are not persistent
    metric.persistent(True)
    metric.update(*batches[0])
    state = metric.state_dict()
    if isinstance(metric, MultilabelLWLRAP):
        assert set(state) == {"precision_sum", "label_count", "options_tag"}
    else:
        assert set(state) == {"lrap_sum", "weight_sum", "options_tag"}

    restored = METRICS[name]()
    restored.persistent(True)
    restored.load_state_dict(state)
    assert_state_dtypes(restored)
    # the loaded states count as an update: compute gives their value without torchmetrics' "called before the
    # update method" warning (warnings are errors here)
    assert_value(restored.compute(), naive(metric, *batches[0]))
    for preds, target in batches[1:]:
        restored.update(preds, target)
    assert_value(restored.compute(), naive(metric, *cat(batches)))


@pytest.mark.parametrize("name", sorted(METRICS))
@pytest.mark.parametrize("how", ["pickle", "deepcopy", "clone"])
def test_copies_mid_accumulation_continue_independently(name, how):
    batches = make_batches(7)
    metric = METRICS[name]()
    metric.update(*batches[0])
    if how == "pickle":
        other = pickle.loads(pickle.dumps(metric))
    elif how == "deepcopy":
        other = copy.deepcopy(metric)
    else:
        other = metric.clone()
    assert type(other) is type(metric)
    assert (other.ties, other.ignore_index) == (metric.ties, metric.ignore_index)
    for preds, target in batches[1:]:
        other.update(preds, target)
    assert_value(other.compute(), naive(metric, *cat(batches)))
    # the original is untouched by the copy's updates
    assert_value(metric.compute(), naive(metric, *batches[0]))


def test_ignore_index_in_collection_and_forward():
    batches = make_batches(8)
    masked = []
    for i, (preds, target) in enumerate(batches):
        unknown = torch.rand(target.shape, generator=torch.Generator().manual_seed(100 + i)) < 0.2
        masked.append((preds, target.masked_fill(unknown, -1)))
    collection = MetricCollection(
        {"lwlrap": MultilabelLWLRAP(NUM_LABELS, ignore_index=-1), "lrap": MultilabelLRAP(NUM_LABELS, ignore_index=-1)}
    )
    for preds, target in masked:
        step = collection(preds, target)
        assert_value(step["lwlrap"], naive_lwlrap(preds, target, ignore_index=-1))
        assert_value(step["lrap"], naive_lrap(preds, target, ignore_index=-1))
    preds, target = cat(masked)
    values = collection.compute()
    assert_value(values["lwlrap"], naive_lwlrap(preds, target, ignore_index=-1))
    assert_value(values["lrap"], naive_lrap(preds, target, ignore_index=-1))


# ---------------------------------------------------------------------------------------------------------------
# Plots


def _save_png(fig, path):
    fig.savefig(path)
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 1000


@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP])
def test_plot_scalar_value(cls, tmp_path):
    metric = cls(NUM_LABELS)
    batches = make_batches(9)
    for preds, target in batches:
        metric.update(preds, target)
    fig, ax = metric.plot()
    try:
        (line,) = ax.lines[:1]
        assert list(line.get_ydata()) == pytest.approx([naive(metric, *cat(batches))], abs=1e-12)
        _save_png(fig, tmp_path / "scalar.png")
    finally:
        plt.close(fig)


@pytest.mark.parametrize("cls", [MultilabelLWLRAP, MultilabelLRAP])
def test_plot_forward_values(cls, tmp_path):
    metric = cls(NUM_LABELS)
    batches = make_batches(10, sizes=(6, 9, 4, 8))
    values = [metric(preds, target) for preds, target in batches]
    fig, ax = metric.plot(values)
    try:
        expected = [naive(metric, preds, target) for preds, target in batches]
        assert list(ax.lines[0].get_ydata()) == pytest.approx(expected, abs=1e-12)
        _save_png(fig, tmp_path / "steps.png")
    finally:
        plt.close(fig)


def _bars(ax):
    return [patch.get_width() for patch in ax.patches]


def _tick_labels(ax):
    return [label.get_text() for label in ax.get_yticklabels()]


def test_plot_per_class_bars(tmp_path):
    names = ["dog", "cat", "bird", "car", "rain", "siren"]
    metric = MultilabelLWLRAP(NUM_LABELS, average="none")
    batches = make_batches(11)
    batches = [(preds, target.clone()) for preds, target in batches]
    for _, target in batches:
        target[:, 4] = 0  # a class without positive: an empty row
    for preds, target in batches:
        metric.update(preds, target)
    per_class, weights, _ = naive_lwlrap_per_class(*cat(batches))
    assert math.isnan(per_class[4])

    fig, ax = metric.plot(class_names=names)
    try:
        assert _tick_labels(ax) == names
        expected = [0.0 if math.isnan(v) else v for v in per_class]
        assert _bars(ax) == pytest.approx(expected, abs=1e-12)
        texts = [text.get_text() for text in ax.texts]
        assert texts[4] == "no positive"
        assert texts[0] == f"{per_class[0]:.3f}  (w={weights[0]:.3f})"
        _save_png(fig, tmp_path / "per_class.png")
    finally:
        plt.close(fig)


def test_plot_per_class_of_527_classes_is_split_into_panels(tmp_path):
    """The challenge's 527 classes had been one column 0.3 inch a bar (about 16,000 pixels high): the metric's plot
    splits them into side-by-side panels of at most 110 bars, the classes in order, each bar its class's score."""
    num_labels = 527
    names = [f"tag_{j}" for j in range(num_labels)]
    gen = torch.Generator().manual_seed(5)
    preds = torch.randn(300, num_labels, generator=gen, requires_grad=True)
    target = (torch.rand(300, num_labels, generator=gen) < 0.01).long()
    target[:, 7] = 0  # a class without positive
    metric = MultilabelLWLRAP(num_labels, average="none")
    metric.update(preds, target)  # as a training step does, on logits that carry gradients
    per_class, weights, _ = naive_lwlrap_per_class(preds.detach(), target)
    fig, axes = metric.plot(class_names=names)
    try:
        assert isinstance(axes, list) and len(axes) == 5 and fig.axes == axes
        assert all(len(ax.patches) <= 110 for ax in axes)
        assert sum((_tick_labels(ax) for ax in axes), []) == names
        expected = [0.0 if math.isnan(v) else v for v in per_class]
        assert sum((_bars(ax) for ax in axes), []) == pytest.approx(expected, abs=1e-12)
        texts = sum(([text.get_text() for text in ax.texts] for ax in axes), [])
        assert texts[7] == "no positive" and texts[0] == f"{per_class[0]:.3f}  (w={weights[0]:.3f})"
        assert fig._suptitle.get_text() == "MultilabelLWLRAP"
        width, height = fig.get_size_inches() * 100
        assert width < 4000 and height < 2500, (width, height)
        _save_png(fig, tmp_path / "many.png")
    finally:
        plt.close(fig)
    # sorted, worst first across the panels; into a given axes: one column, as asked
    per_class_tensor = torch.tensor(per_class, dtype=torch.float64)
    fig, axes = plot_per_class(per_class_tensor, sort=True, class_names=names)
    try:
        heights = sum((_bars(ax) for ax in axes), [])
        ranked = sorted(v for v in per_class if not math.isnan(v))
        assert len(heights) == num_labels and heights[: len(ranked)] == pytest.approx(ranked, abs=1e-12)
        assert heights[len(ranked):] == [0.0] * (num_labels - len(ranked))  # classes without positive last
        assert "tag_7" in sum((_tick_labels(ax) for ax in axes), [])[len(ranked):]
    finally:
        plt.close(fig)
    fig, ax = plt.subplots()
    try:
        out_fig, out_ax = plot_per_class(per_class_tensor, ax=ax)
        assert out_ax is ax and len(ax.patches) == num_labels
    finally:
        plt.close(fig)


def test_plot_per_class_into_a_figure_without_agg_and_of_no_class_warns_nothing():
    # The title layout had asked the canvas for Agg's renderer: a bare Figure (or the pdf backend's canvas) has none,
    # and the plot raised AttributeError; no class had set the y limits to one point (a matplotlib warning).
    from matplotlib.figure import Figure

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = Figure()
        fig.suptitle("the user's title")
        ax = fig.add_subplot()
        out_fig, out_ax = plot_per_class(torch.tensor([0.5, 1.0, 0.25], dtype=torch.float64), ax=ax)
        assert out_fig is fig and out_ax is ax and _bars(ax) == [0.5, 1.0, 0.25]
        fig, ax = plot_per_class(torch.zeros(0))
        plt.close(fig)


def test_plot_of_a_value_kept_from_before_a_reset_shows_no_weights_of_the_new_state():
    # torchmetrics' loop plots a stored value after reset(): its bars had been labelled with the weights of the
    # metric's current state (w=0.000 after the reset, others after a later update), not of the value's data.
    metric = MultilabelLWLRAP(NUM_LABELS, average="none")
    batches = make_batches(12)
    for preds, target in batches:
        metric.update(preds, target)
    kept = metric.compute()
    per_class = naive_lwlrap_per_class(*cat(batches))[0]
    metric.reset()
    metric.update(*batches[0])  # a later epoch's first batch
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no per_class() of the state (it had warned "before update" after reset)
        fig, ax = metric.plot(kept)
    try:
        assert _bars(ax) == pytest.approx([0.0 if math.isnan(v) else v for v in per_class], abs=1e-12)
        texts = [text.get_text() for text in ax.texts]
        assert texts and not any("w=" in text for text in texts), texts
        assert texts[0] == f"{per_class[0]:.3f}"
    finally:
        plt.close(fig)


def test_plot_per_class_of_a_single_label_is_one_bar_with_its_weight():
    # compute() of one label is 0-dim (torchmetrics squeezes one-element values): with average="none" it is still
    # that label's score, drawn as one bar with its weight, not as a scalar on a line plot.
    metric = MultilabelLWLRAP(num_labels=1, average="none")
    preds = torch.tensor([[0.3], [0.9], [0.1], [0.7], [0.5]])
    target = torch.tensor([[1], [0], [1], [1], [0]])
    metric.update(preds, target)
    value = metric.compute()
    expected = naive_lwlrap(preds, target)  # one label: its per-class score is the overall lwlrap
    assert value.ndim == 0 and value.item() == pytest.approx(expected, abs=1e-12)
    fig, ax = metric.plot(class_names=["siren"])
    try:
        assert _tick_labels(ax) == ["siren"] and not ax.lines
        assert _bars(ax) == pytest.approx([expected], abs=1e-12)
        assert ax.texts[0].get_text() == f"{expected:.3f}  (w=1.000)"
    finally:
        plt.close(fig)
    fig, ax = metric.plot(value)  # passed in: the same bar, without the state's weight
    try:
        assert _bars(ax) == pytest.approx([expected], abs=1e-12)
        assert ax.texts[0].get_text() == f"{expected:.3f}"
    finally:
        plt.close(fig)
    scalar = MultilabelLWLRAP(num_labels=1)  # the weighted average of one label stays a scalar plot
    scalar.update(preds, target)
    fig, ax = scalar.plot()
    try:
        assert not ax.patches and list(ax.lines[0].get_ydata()) == pytest.approx([expected], abs=1e-12)
    finally:
        plt.close(fig)


def test_plot_per_class_sorted_worst_on_top(tmp_path):
    per_class = torch.tensor([0.9, 0.25, float("nan"), 0.5], dtype=torch.float64)
    weights = torch.tensor([0.4, 0.3, 0.0, 0.3], dtype=torch.float64)
    names = ["a", "b", "c", "d"]
    fig, ax = plot_per_class(per_class, weights, class_names=names, sort=True, title="sorted")
    try:
        assert ax.yaxis_inverted()  # the first row is the top one
        assert _tick_labels(ax) == ["b", "d", "a", "c"]
        assert _bars(ax) == pytest.approx([0.25, 0.5, 0.9, 0.0], rel=1e-12)
        assert ax.get_title() == "sorted"
        _save_png(fig, tmp_path / "sorted.png")
    finally:
        plt.close(fig)


def test_plot_per_class_into_given_axes_with_default_names():
    fig, ax = plt.subplots()
    try:
        out_fig, out_ax = plot_per_class(torch.tensor([1.0, 0.5, 0.75]))
        plt.close(out_fig)
        out_fig, out_ax = plot_per_class(torch.tensor([1.0, 0.5, 0.75]), ax=ax)
        assert out_ax is ax and out_fig is fig
        assert _tick_labels(ax) == ["Class 0", "Class 1", "Class 2"]
        assert _bars(ax) == pytest.approx([1.0, 0.5, 0.75], rel=1e-12)
    finally:
        plt.close(fig)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"per_class": torch.ones(2, 3)}, r"`per_class` must be one-dimensional \(C,\), but got shape \(2, 3\)"),
        ({"per_class": torch.ones(3), "class_names": ["a", "b"]}, r"`class_names` must hold 3 names, but got 2"),
        (
            {"per_class": torch.ones(3), "weights": torch.ones(4)},
            r"`weights` must have the shape of `per_class` \(3,\), but got \(4,\)",
        ),
    ],
)
def test_plot_per_class_argument_errors(kwargs, message):
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=message):
        plot_per_class(**kwargs)
    assert plt.get_fignums() == before  # no figure left open by a rejected call
