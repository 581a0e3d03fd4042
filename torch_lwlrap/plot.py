"""Per-class bar charts (matplotlib is an optional extra: ``pip install matplotlib``, the ``plot`` extra)."""

from __future__ import annotations

import math
from typing import Any, List, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor


def _pyplot() -> Any:
    try:
        import matplotlib

        if matplotlib.get_backend().lower() not in ("agg", "module://matplotlib_inline.backend_inline"):
            import os

            if not os.environ.get("DISPLAY") and os.name != "nt":
                matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - exercised only without matplotlib
        raise ModuleNotFoundError(
            "Plotting needs matplotlib: install it with `pip install matplotlib` (the package's `plot` extra)."
        ) from err
    return plt


def plot_per_class(
    per_class: Tensor,
    weights: Optional[Tensor] = None,
    *,
    class_names: Optional[Sequence[str]] = None,
    ax: Optional[Any] = None,
    title: Optional[str] = "per-class lwlrap",
    sort: bool = False,
) -> Tuple[Any, Any]:
    """Horizontal bars of per-class lwlrap, annotated with each class's label weight.

    Classes without a positive label (NaN) are drawn as empty rows marked "no positive". Without ``ax``, more than
    :data:`BARS_PER_PANEL` (110) classes are split into side-by-side panels under one title, so that 527 classes make
    a chart of about 3,300 x 1,800 pixels rather than one column 16,000 pixels high.

    Args:
        per_class: ``(C,)`` per-class lwlrap.
        weights: ``(C,)`` label weights (share of all positive labels), shown beside each bar.
        class_names: ``C`` names; defaults to ``"Class 0"``, ...
        ax: matplotlib axes to draw into (all classes, in one column), leaving its figure's layout as it is (the
            figure's own layout engine, or yours); a new figure, laid out, when None.
        title: the axes' title; with several panels, the figure's (above them all).
        sort: order the bars worst first (from the top).

    Returns:
        ``(fig, ax)``; with several panels, ``ax`` is the list of their axes, left to right.

    Example:
        >>> import torch
        >>> from torch_lwlrap.plot import plot_per_class
        >>> fig, ax = plot_per_class(torch.tensor([2 / 3, 1.0, 0.75]), torch.tensor([0.25, 0.25, 0.5]))
    """
    plt = _pyplot()
    values = per_class.detach().to("cpu", torch.float64)
    if values.ndim != 1:
        raise ValueError(f"Argument `per_class` must be one-dimensional (C,), but got shape {tuple(values.shape)}.")
    num_classes = values.numel()
    names = list(class_names) if class_names is not None else [f"Class {i}" for i in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"Argument `class_names` must hold {num_classes} names, but got {len(names)}.")
    weight_values = None if weights is None else weights.detach().to("cpu", torch.float64)
    if weight_values is not None and weight_values.shape != values.shape:
        raise ValueError(
            f"Argument `weights` must have the shape of `per_class` {tuple(values.shape)}, "
            f"but got {tuple(weight_values.shape)}."
        )
    order = list(range(num_classes))
    if sort:
        # ascending: the worst class on the top row (the y axis is inverted below), classes without positive last
        # (rounded: classes equal up to float64 rounding keep their order)
        order.sort(key=lambda i: (float("inf") if torch.isnan(values[i]) else round(float(values[i]), 12)))

    own_figure = ax is None
    chunks = panel_slices(len(order)) if own_figure else [slice(0, len(order))]
    if own_figure and len(chunks) > 1:
        rows = math.ceil(len(order) / len(chunks))
        fig, grid = plt.subplots(1, len(chunks), figsize=(6.5 * len(chunks), 0.16 * rows + 1.2), squeeze=False)
        axes = list(grid[0])
        if title:
            fig.suptitle(title)
    elif own_figure:
        fig, ax = plt.subplots(figsize=(7, max(2.0, 0.3 * num_classes + 1)))
        axes = [ax]
    else:
        fig, axes = ax.get_figure(), [ax]
    for panel, chunk in zip(axes, chunks):
        _draw_bars(panel, values, weight_values, names, order[chunk], small=len(axes) > 1)
    if len(axes) == 1 and title:
        axes[0].set_title(title)
    if own_figure:
        layout_below_title(fig)
    return fig, (axes[0] if len(axes) == 1 else axes)


def _draw_bars(ax: Any, values: Tensor, weights: Optional[Tensor], names: Sequence[str], order: Sequence[int],
               *, small: bool) -> None:
    """The bars of the classes ``order`` (top to bottom) on ``ax``, each labelled with its value and weight."""
    heights = [0.0 if torch.isnan(values[i]) else float(values[i]) for i in order]
    positions = range(len(order))
    ax.barh(positions, heights, color="tab:blue")
    ax.set_yticks(list(positions))
    ax.set_yticklabels([names[i] for i in order], fontsize=8 if small else None)
    ax.set_xlim(0.0, 1.15 if weights is not None else 1.0)
    ax.set_xlabel("lwlrap")
    for y, i in zip(positions, order):
        if torch.isnan(values[i]):
            label = "no positive"
        elif weights is not None:
            label = f"{float(values[i]):.3f}  (w={float(weights[i]):.3f})"
        else:
            label = f"{float(values[i]):.3f}"
        ax.text(min(heights[y], 1.0) + 0.01, y, label, va="center", fontsize=8)
    if order:
        ax.set_ylim(len(order) - 0.5, -0.5)  # the first class on top, no blank margin above it or below the last


# Charts of many classes are split into side-by-side panels of at most this many bars, so that a chart of 527
# classes is about 3,300 x 1,800 pixels rather than one column 16,000 pixels high.
BARS_PER_PANEL = 110


def panel_slices(count: int) -> List[slice]:
    """How ``count`` bars are split into side-by-side panels of at most :data:`BARS_PER_PANEL`, as even as can be."""
    panels = max(1, math.ceil(count / BARS_PER_PANEL))
    return [slice(panel * count // panels, (panel + 1) * count // panels) for panel in range(panels)]


def layout_below_title(fig: Any) -> None:
    """``fig.tight_layout()`` with the axes kept below the figure's title (``suptitle``), measured as drawn: some
    versions of matplotlib lay out the axes without it, so that its lines fell over the top bar's label."""
    fig.tight_layout()
    title = getattr(fig, "_suptitle", None)
    if title is None or not title.get_text():
        return
    # Agg's canvas has get_renderer; other canvases (pdf, a bare Figure's) lay out through the figure's own
    get_renderer = getattr(fig.canvas, "get_renderer", None) or getattr(fig, "_get_renderer", None)
    if get_renderer is None:
        return
    renderer = get_renderer()
    title_bottom = fig.transFigure.inverted().transform(title.get_window_extent(renderer))[0, 1]
    top = max(
        fig.transFigure.inverted().transform(ax.get_tightbbox(renderer))[1, 1] for ax in fig.axes
    )
    gap = 6 / 72 / fig.get_figheight()  # 6 points
    overlap = top - (title_bottom - gap)
    if overlap > 0:  # the axes (their labels included) reach into the title: move their tops down below it
        fig.subplots_adjust(top=fig.subplotpars.top - overlap)


def plot_values(
    values: Mapping[str, Tensor],
    *,
    ax: Optional[Any] = None,
    title: Optional[str] = None,
    span: Optional[Tuple[str, str]] = None,
    span_label: Optional[str] = None,
    span_rows: Optional[Sequence[str]] = None,
) -> Tuple[Any, Any]:
    """Horizontal bars of named scalar values (a dict-valued metric's :meth:`compute`), each labelled with its value.

    Values on different scales (a coverage error next to precisions) share the axis: each bar carries its value as
    text. NaN values are drawn as empty rows marked "undefined".

    Args:
        values: ``{name: scalar tensor}``, drawn top to bottom in the dict's order.
        ax: matplotlib axes to draw into, leaving its figure's layout as it is; a new figure, laid out, when None.
        title: axes title.
        span: two names in ``values`` whose values bound a range to shade behind the bars (the tie report's
            worst and best orders).
        span_label: the legend of the shaded range (default "from <first> to <second>").
        span_rows: the names whose rows the shading covers (from the first to the last of them); all by default.

    Returns:
        ``(fig, ax)``.

    Example:
        >>> import torch
        >>> from torch_lwlrap.plot import plot_values
        >>> fig, ax = plot_values({"lwlrap": torch.tensor(0.79), "coverage_error": torch.tensor(2.5)})
    """
    plt = _pyplot()
    if not values:
        raise ValueError("Argument `values` must hold at least one value to plot, but got an empty dict.")
    names = list(values)
    numbers = []
    for name in names:
        value = values[name]
        if isinstance(value, Tensor):
            value = value.detach().to("cpu", torch.float64)
        else:
            value = torch.tensor(float(value), dtype=torch.float64, device="cpu")
        if value.numel() != 1:
            raise ValueError(f"Value {name!r} must be a scalar, but got shape {tuple(value.shape)}.")
        numbers.append(float(value))
    if span is not None and (len(span) != 2 or any(name not in values for name in span)):
        raise ValueError(f"Argument `span` must name two entries of `values` {names}, but got {span!r}.")
    if span_rows is not None and not any(name in values for name in span_rows):
        raise ValueError(
            f"Argument `span_rows` must name at least one entry of `values` {names}, but got {list(span_rows)!r}."
        )
    own_figure = ax is None
    if own_figure:
        fig, ax = plt.subplots(figsize=(7, max(2.0, 0.4 * len(names) + 1)))
    else:
        fig = ax.get_figure()
    finite = [v for v in numbers if math.isfinite(v)]
    right = max([1.0] + finite)
    left = min([0.0] + finite)
    positions = range(len(names))
    ax.barh(positions, [v if math.isfinite(v) else 0.0 for v in numbers], color="tab:blue", zorder=1)
    if span is not None:
        low, high = (numbers[names.index(name)] for name in span)
        if math.isfinite(low) and math.isfinite(high):
            rows = [y for y, name in enumerate(names) if span_rows is None or name in span_rows]
            ax.fill_betweenx([min(rows) - 0.45, max(rows) + 0.45], min(low, high), max(low, high), color="tab:orange",
                             alpha=0.25, zorder=0, label=span_label or f"from {span[0]} to {span[1]}")
            ax.legend(loc="lower right", fontsize=8)
    ax.set_yticks(list(positions))
    ax.set_yticklabels(names)
    ax.set_xlim(left, right * 1.15)
    for y, value in zip(positions, numbers):
        label = f"{value:.4g}" if math.isfinite(value) else "undefined"
        ax.text((value if math.isfinite(value) else 0.0) + 0.01 * (right - left), y, label, va="center", fontsize=8)
    if title:
        ax.set_title(title)
    ax.invert_yaxis()
    if own_figure:
        fig.tight_layout()
    return fig, ax
