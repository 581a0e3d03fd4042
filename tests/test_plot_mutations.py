"""What the plots show, read back from the matplotlib Axes: each row's bar, name and label belong to one class (or
one value), in the order asked, under the titles and axes that name the metric, drawn into the axes given.

Expected values are computed here, with a naive per-class loop (checked against scikit-learn's LRAP), not by the
library.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from torch_lwlrap import MultilabelLWLRAP, MultilabelRankingMetrics, MultilabelTieReport  # noqa: E402
from torch_lwlrap.plot import plot_per_class, plot_values  # noqa: E402

NAMES = ["dog", "cat", "bird", "car", "rain", "siren", "wind"]


def _naive_per_class(preds, target):
    """(per-class lwlrap, label weights), straight from the definition (scores without ties)."""
    num_classes = preds.shape[1]
    sums, counts = [0.0] * num_classes, [0] * num_classes
    for scores, labels in zip(preds.tolist(), target.tolist()):
        positives = [j for j in range(num_classes) if labels[j] == 1]
        for j in positives:
            ahead = [k for k in range(num_classes) if scores[k] >= scores[j]]
            sums[j] += sum(1 for k in ahead if labels[k] == 1) / len(ahead)
            counts[j] += 1
    total = sum(counts)
    per_class = [s / c if c else float("nan") for s, c in zip(sums, counts)]
    return per_class, [c / total for c in counts]


def _batches():
    gen = torch.Generator().manual_seed(11)
    out = []
    for size in (9, 14, 6):
        preds = torch.rand(size, len(NAMES), generator=gen, dtype=torch.float64)
        target = (torch.rand(size, len(NAMES), generator=gen) < 0.4).long()
        target[:, 4] = 0  # "rain": no positive anywhere
        target[0, 6] = 1  # "wind": some positives, a low weight
        out.append((preds, target))
    return out


def _expected():
    batches = _batches()
    preds = torch.cat([p for p, _ in batches])
    target = torch.cat([t for _, t in batches])
    per_class, weights = _naive_per_class(preds, target)
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    # the naive loop is lwlrap: LRAP with each sample weighted by its number of positives
    has_positive = target.sum(1) > 0
    lrap = sklearn_metrics.label_ranking_average_precision_score(
        target[has_positive].numpy(), preds[has_positive].numpy(), sample_weight=target[has_positive].sum(1).numpy()
    )
    assert sum(p * w for p, w in zip(per_class, weights) if not math.isnan(p)) == pytest.approx(lrap, abs=1e-12)
    return batches, per_class, weights


def _rows(ax):
    """``{row: (tick label, bar width, text)}``, each read at its own y position."""
    ticks = {round(y): label.get_text() for y, label in zip(ax.get_yticks(), ax.get_yticklabels())}
    bars = {round(p.get_y() + p.get_height() / 2): p.get_width() for p in ax.patches if hasattr(p, "get_width")}
    texts = {round(t.get_position()[1]): t.get_text() for t in ax.texts}
    assert set(ticks) == set(bars) == set(texts), (ticks, bars, texts)
    return {y: (ticks[y], bars[y], texts[y]) for y in sorted(ticks)}


def test_sorted_per_class_rows_keep_each_class_s_name_score_and_weight_together():
    batches, per_class, weights = _expected()
    metric = MultilabelLWLRAP(len(NAMES), average="none")
    for preds, target in batches:
        metric.update(preds, target)
    scores, label_weights = metric.per_class()
    fig, ax = plot_per_class(scores, label_weights, class_names=NAMES, sort=True)  # as the README suggests
    try:
        rows = _rows(ax)
        assert len(rows) == len(NAMES)
        for y, (name, width, text) in rows.items():
            j = NAMES.index(name)
            if math.isnan(per_class[j]):
                assert (width, text) == (0.0, "no positive"), (y, name)
            else:
                assert width == pytest.approx(per_class[j], abs=1e-12), (y, name)
                assert text == f"{per_class[j]:.3f}  (w={weights[j]:.3f})", (y, name)
        ranked = sorted(range(len(NAMES)), key=lambda j: math.inf if math.isnan(per_class[j]) else per_class[j])
        assert [name for name, _, _ in rows.values()] == [NAMES[j] for j in ranked]
        assert ax.yaxis_inverted()  # the worst class on the top row
    finally:
        plt.close(fig)


def test_a_metric_s_per_class_plot_names_the_metric_and_its_axis():
    batches, per_class, weights = _expected()
    metric = MultilabelLWLRAP(len(NAMES), average="none")
    for preds, target in batches:
        metric.update(preds, target)
    fig, ax = metric.plot(class_names=NAMES)
    try:
        assert ax.get_title() == "MultilabelLWLRAP"
        assert ax.get_xlabel() == "lwlrap"
        rows = _rows(ax)
        assert [name for name, _, _ in rows.values()] == NAMES  # unsorted: the classes in order, top to bottom
        assert [width for _, width, _ in rows.values()] == pytest.approx(
            [0.0 if math.isnan(v) else v for v in per_class], abs=1e-12
        )
        assert rows[6][2] == f"{per_class[6]:.3f}  (w={weights[6]:.3f})"
    finally:
        plt.close(fig)


def test_plot_values_rows_read_top_to_bottom_with_their_values_and_undefined_marked():
    values = {"spearman": torch.tensor(-0.4, dtype=torch.float64), "lwlrap": torch.tensor(0.79, dtype=torch.float64),
              "ndcg": torch.tensor(float("nan"), dtype=torch.float64), "coverage_error": 2.5}
    fig, ax = plot_values(values, title="ranking")
    try:
        rows = _rows(ax)
        assert [name for name, _, _ in rows.values()] == list(values)
        assert [width for _, width, _ in rows.values()] == pytest.approx([-0.4, 0.79, 0.0, 2.5], abs=1e-12)
        assert [text for _, _, text in rows.values()] == ["-0.4", "0.79", "undefined", "2.5"]
        assert ax.yaxis_inverted()  # the dict's first value on the top row
        left, right = ax.get_xlim()
        assert left <= -0.4 and right >= 2.5  # every bar inside the axes, the negative one too
        assert ax.get_title() == "ranking"
    finally:
        plt.close(fig)


def test_dict_valued_metric_plots_into_the_axes_given():
    gen = torch.Generator().manual_seed(3)
    preds = torch.rand(20, 5, generator=gen)
    target = (torch.rand(20, 5, generator=gen) < 0.4).long()
    metric = MultilabelRankingMetrics(num_labels=5, k=2)
    metric.update(preds, target)
    fig, ax = plt.subplots()
    try:
        before = plt.get_fignums()
        out_fig, out_ax = metric.plot(ax=ax)
        assert out_ax is ax and out_fig is fig and plt.get_fignums() == before  # no other figure opened
        assert [name for name, _, _ in _rows(ax).values()] == list(metric.compute())
        assert ax.get_title() == "MultilabelRankingMetrics"
    finally:
        plt.close(fig)


def test_tie_report_plot_into_the_axes_given_keeps_its_range():
    metric = MultilabelTieReport(num_labels=4)
    metric.update(torch.tensor([[1.0, 1.0, 1.0, 0.2]]), torch.tensor([[1, 0, 1, 0]]))
    fig, ax = plt.subplots()
    try:
        out_fig, out_ax = metric.plot(ax=ax)
        assert out_ax is ax and out_fig is fig
        (band,) = [c for c in ax.collections if c.get_label() == "lwlrap over tie orders, worst to best"]
        xs = band.get_paths()[0].vertices[:, 0]
        assert (xs.min(), xs.max()) == pytest.approx((7 / 12, 1.0), abs=1e-12)
        legend = ax.get_legend()  # the shading is named on the figure
        assert legend is not None and [t.get_text() for t in legend.get_texts()] == [band.get_label()]
    finally:
        plt.close(fig)


def test_panels_of_many_classes_sit_below_the_figure_s_title():
    gen = torch.Generator().manual_seed(2)
    per_class = torch.rand(300, generator=gen, dtype=torch.float64)
    names = [f"a rather long class name {j}" for j in range(300)]
    fig, axes = plot_per_class(per_class, class_names=names, title="a title\non two lines")
    try:
        assert isinstance(axes, list) and len(axes) == 3
        assert fig._suptitle.get_text() == "a title\non two lines"
        assert [ax.get_title() for ax in axes] == ["", "", ""]  # the title once, above all the panels
        renderer = fig.canvas.get_renderer()
        title_bottom = fig._suptitle.get_window_extent(renderer).y0
        for ax in axes:
            assert ax.get_tightbbox(renderer).y1 <= title_bottom + 0.5  # the panels' tops below the title
    finally:
        plt.close(fig)


# --- the axes given: the user's figure keeps its own layout ------------------------------------------------------


@pytest.mark.parametrize("layout", ["constrained", "compressed", None])
def test_plotting_into_the_axes_given_leaves_the_figure_s_layout_alone(layout):
    """A figure of the user's (its own layout engine, a colorbar beside) takes the metrics' plots in one of its axes:
    no layout is forced on it (matplotlib warns when a figure's layout engine is swapped, and refuses it once a
    colorbar is laid out), and the bars show the metric's values."""
    batches, per_class, _ = _expected()
    lwlrap = MultilabelLWLRAP(len(NAMES), average="none")
    ranking = MultilabelRankingMetrics(num_labels=len(NAMES), k=2)
    for preds, target in batches:
        lwlrap.update(preds, target)
        ranking.update(preds, target)
    fig, (left, middle, right) = plt.subplots(1, 3, layout=layout)
    fig.colorbar(right.imshow([[0.0, 1.0]]), ax=right)
    engine = fig.get_layout_engine()
    position = middle.get_position().bounds
    try:
        assert lwlrap.plot(ax=left, class_names=NAMES) == (fig, left)
        assert ranking.plot(ax=middle) == (fig, middle)
        out_fig, out_ax = plot_values({"a": 0.25, "b": 0.5}, ax=right, span=("a", "b"))
        assert (out_fig, out_ax) == (fig, right)
        assert fig.get_layout_engine() is engine
        if layout is None:  # no engine: the axes stay where the user put them
            assert middle.get_position().bounds == pytest.approx(position)
        fig.canvas.draw()
        widths = [width for _, width, _ in _rows(left).values()]
        assert widths == pytest.approx([0.0 if math.isnan(v) else v for v in per_class], abs=1e-12)
    finally:
        plt.close(fig)


def test_a_span_that_names_no_value_is_refused_with_the_names():
    values = {"worst": 0.5, "expected": 0.6, "best": 0.7}
    before = plt.get_fignums()
    with pytest.raises(ValueError, match=r"^Argument `span` must name two entries of `values` \['worst', 'expected', "
                                         r"'best'\], but got \('worst', 'bset'\)\.$"):
        plot_values(values, span=("worst", "bset"))
    with pytest.raises(ValueError, match=r"^Argument `span_rows` must name at least one entry of `values` "
                                         r"\['worst', 'expected', 'best'\], but got \['mean'\]\.$"):
        plot_values(values, span=("worst", "best"), span_rows=["mean"])
    assert plt.get_fignums() == before  # refused before a figure is made
