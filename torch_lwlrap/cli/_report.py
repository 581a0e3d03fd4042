"""The command line's output: the :class:`Score` of a submission, its text report, its JSON and its plot.

Other modules extend the report without editing this one: a subcommand passes ``sections`` to
:func:`format_report` (callables that turn a :class:`Score` into lines of text, printed as blocks after the
summary), and puts JSON-able values under ``Score.extra``, which ``--json`` prints beside the standard keys.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Sequence

from torch_lwlrap.cli._files import CommandError, CsvFormatError

__all__ = [
    "ReportSection",
    "check_bootstrap_args",
    "Score",
    "format_report",
    "per_class_table",
    "print_output",
    "summary_line",
    "write_plot",
]


@dataclass
class Score:
    """The scores of one submission (see :func:`score_files`).

    Example:
        >>> score = Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide")
        >>> [score.classes[i] for i in score.worst_first()]  # classes without positive last
        ['a', 'b']

    Attributes:
        lwlrap: overall (label-weighted) lwlrap.
        lrap: label-ranking average precision (scikit-learn's definition).
        num_samples: the number of rows scored.
        num_labels: the number of positive labels in the truth (the denominator of lwlrap).
        classes: class names, in the prediction file's column order.
        per_class: per-class lwlrap, NaN for a class without positive.
        weights: each class's share of all positive labels.
        counts: the number of positive labels of each class.
        truth_layout: ``"challenge"`` or ``"wide"``.
        extra: values other modules add to the report, each printed by ``--json`` under its key.
    """

    lwlrap: float
    lrap: float
    num_samples: int
    num_labels: int
    classes: List[str]
    per_class: List[float]
    weights: List[float]
    counts: List[int]
    truth_layout: str
    extra: Dict[str, object] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, object]:
        """The JSON object printed by ``--json``; the lwlrap of a class without positive is None (``null``).

        Example:
            >>> score = Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide")
            >>> score.to_dict()["per_class"]["b"]
            {'lwlrap': None, 'weight': 0.0, 'count': 0}
        """
        return {
            "lwlrap": self.lwlrap,
            "lrap": self.lrap,
            "num_samples": self.num_samples,
            "num_labels": self.num_labels,
            "num_classes": len(self.classes),
            "per_class": {
                name: {"lwlrap": None if math.isnan(value) else value, "weight": weight, "count": count}
                for name, value, weight, count in zip(self.classes, self.per_class, self.weights, self.counts)
            },
            **self.extra,
        }

    def worst_first(self) -> List[int]:
        """Class indices ordered by per-class lwlrap, worst first; classes without positive last.

        Example:
            >>> Score(0.5, 0.5, 1, 1, ["a", "b", "c"], [0.9, float("nan"), 0.2], [0.5, 0.0, 0.5], [1, 0, 1],
            ...       "wide").worst_first()
            [2, 0, 1]
        """
        # Rounded keys: classes equal up to float64 rounding keep their column order, whatever the summation order.
        return sorted(
            range(len(self.classes)),
            key=lambda i: (
                math.isnan(self.per_class[i]),
                0.0 if math.isnan(self.per_class[i]) else round(self.per_class[i], 12),
            ),
        )


ReportSection = Callable[[Score], Sequence[str]]
"""A block of the text report: lines computed from a :class:`Score` (no lines: no block)."""


def summary_line(name: str, value: object) -> str:
    """One line of the report's summary, its value aligned with the others.

    Example:
        >>> summary_line("lwlrap", "0.750000")
        'lwlrap       0.750000'
    """
    return f"{name:<12} {value}"


def per_class_table(score: Score) -> List[str]:
    """The ``--per-class`` block: per-class lwlrap, weight and count, worst first (``-`` without positive).

    Example:
        >>> score = Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide")
        >>> print("\\n".join(per_class_table(score)))
        per-class lwlrap, worst first:
        class    lwlrap    weight   count
        a      0.750000  1.000000       3
        b             -  0.000000       0
    """
    width = max([len("class")] + [len(name) for name in score.classes])
    ci = score.extra.get("ci")
    header = f"{'class':<{width}}  {'lwlrap':>8}  {'weight':>8}  {'count':>6}"
    if ci:
        header += f"  {_level_name(ci['level']) + ' interval':>20}"
    lines = ["per-class lwlrap, worst first:", header]
    for i in score.worst_first():
        value = "-" if math.isnan(score.per_class[i]) else f"{score.per_class[i]:.6f}"
        line = f"{score.classes[i]:<{width}}  {value:>8}  {score.weights[i]:>8.6f}  {score.counts[i]:>6}"
        if ci:
            bounds = ci["per_class"][score.classes[i]]
            line += f"  {'-' if bounds is None else _bounds(bounds):>20}"
        lines.append(line)
    return lines


def _level_name(level: float) -> str:
    return f"{100 * level:g}%"


def _bounds(bounds: Sequence[float]) -> str:
    return f"[{bounds[0]:.6f}, {bounds[1]:.6f}]"


def check_bootstrap_args(num_bootstrap: int, level: float, option: str) -> int:
    """``num_bootstrap``; CommandError unless it is at least 1 and ``0 < level < 1``."""
    if num_bootstrap < 1:
        raise CommandError(f"{option} takes a number of bootstrap replicates >= 1 (e.g. 1000), not {num_bootstrap}.")
    if not 0 < level < 1:
        raise CommandError(f"--level must be strictly between 0 and 1 (0.95 for a 95% interval), not {level}.")
    return num_bootstrap


def format_report(
    score: Score,
    truth_path: str,
    pred_path: str,
    *,
    per_class: bool = False,
    sections: Sequence[ReportSection] = (),
) -> str:
    """The plain-text report printed by ``torch-lwlrap score``.

    Args:
        score: what to report.
        truth_path: the truth file, as named on the command line.
        pred_path: the prediction file, as named on the command line.
        per_class: add the :func:`per_class_table` block.
        sections: more blocks, in order, each after a blank line; a section that returns no lines adds nothing.

    Example:
        >>> score = Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide")
        >>> print(format_report(score, "t.csv", "p.csv"))
        truth        t.csv (wide 0/1 table)
        predictions  p.csv
        samples      2
        classes      2
        labels       3 positive
        lwlrap       0.750000
        LRAP         0.800000
        >>> print(format_report(score, "t.csv", "p.csv", sections=[lambda s: [f"best  {s.classes[0]}"]]))
        ... # doctest: +ELLIPSIS
        truth        t.csv (wide 0/1 table)
        ...
        LRAP         0.800000
        <BLANKLINE>
        best  a
    """
    layout = "challenge layout: fname,labels" if score.truth_layout == "challenge" else "wide 0/1 table"
    lines = [
        summary_line("truth", f"{truth_path} ({layout})"),
        summary_line("predictions", pred_path),
        summary_line("samples", score.num_samples),
        summary_line("classes", len(score.classes)),
        summary_line("labels", f"{score.num_labels} positive"),
        summary_line("lwlrap", f"{score.lwlrap:.6f}" + _interval_note(score)),
        summary_line("LRAP", f"{score.lrap:.6f}"),
    ]
    blocks = ([per_class_table] if per_class else []) + list(sections)
    for section in blocks:
        block = list(section(score))
        if block:
            lines += [""] + block
    return "\n".join(lines)


def _interval_note(score: Score) -> str:
    ci = score.extra.get("ci")
    if not ci:
        return ""
    return f"  {_level_name(ci['level'])} interval {_bounds(ci['lwlrap'])} (bootstrap, B={ci['num_bootstrap']})"


def write_plot(score: Score, path: str) -> None:
    """Write the per-class bar chart, worst first, to ``path`` (needs matplotlib); CsvFormatError if it cannot."""
    import torch

    from torch_lwlrap.plot import plot_per_class

    order = score.worst_first()
    fig, _ = plot_per_class(
        torch.tensor([score.per_class[i] for i in order], dtype=torch.float64),
        torch.tensor([score.weights[i] for i in order], dtype=torch.float64),
        class_names=[score.classes[i] for i in order],
        title=f"per-class lwlrap (overall {score.lwlrap:.4f}), worst first",
    )
    import matplotlib.pyplot as plt

    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as err:
        message = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise CsvFormatError(f"cannot write the plot to {path!r}: {message}.") from None
    finally:
        plt.close(fig)


def print_output(text: str) -> None:
    """Print the command's output; a reader that leaves early (``torch-lwlrap score ... | head``) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
