"""The command line's output: the :class:`Score` of a submission, its text report, its JSON and its plot.

Other modules extend the report without editing this one: a subcommand passes ``sections`` to
:func:`format_report` (callables that turn a :class:`Score` into lines of text, printed as blocks after the
summary), and puts JSON-able values under ``Score.extra``, which ``--json`` prints beside the standard keys.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import gzip
import math
import os
import shutil
import sys
import unicodedata
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from torch_lwlrap._options import MAX_REPLICATES
from torch_lwlrap.cli._environment import available_memory, bootstrap_bytes, format_bytes
from torch_lwlrap.cli._files import GZIP_MAGIC, STDIN, CommandError, CsvFormatError

__all__ = [
    "ReportSection",
    "check_bootstrap_args",
    "Score",
    "format_report",
    "level_name",
    "no_interval_reason",
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
        metadata_columns: the truth's columns that were not scored (challenge layout: besides fname, labels).
        where: the ``--where`` conditions ``(column, value)`` that selected the truth rows scored.
        truth_rows: the number of rows of the truth file (``num_samples`` when nothing was selected).
        ignored_pred_rows: prediction rows left out because their truth rows were not selected.
        vocabulary: the ``--classes`` file that pinned the classes, or None.
        num_unknown: the unknown labels of the scored rows (``--unknown``): neither positive nor ranked.
        rows_without_label: the scored rows without a positive label (an empty ``labels`` field, a wide row of 0s):
            lwlrap has nothing of them to average, LRAP counts each as 1 (scikit-learn's rule).
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
    metadata_columns: List[str] = field(default_factory=list)
    where: List[Tuple[str, str]] = field(default_factory=list)
    truth_rows: Optional[int] = None
    ignored_pred_rows: int = 0
    vocabulary: Optional[str] = None
    num_unknown: int = 0
    rows_without_label: int = 0

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
            "num_unknown": self.num_unknown,
            "rows_without_label": self.rows_without_label,
            "per_class": {
                name: {"lwlrap": None if math.isnan(value) else value, "weight": weight, "count": count}
                for name, value, weight, count in zip(self.classes, self.per_class, self.weights, self.counts)
            },
            "classes_without_positive": self.without_positive(),
            "metadata_columns": list(self.metadata_columns),
            "selection": None
            if not self.where
            else {
                "where": dict(self.where),
                "truth_rows": self.truth_rows,
                "selected_rows": self.num_samples,
                "ignored_prediction_rows": self.ignored_pred_rows,
            },
            "vocabulary": self.vocabulary,
            **self.extra,
        }

    def without_positive(self) -> List[str]:
        """The classes without a positive label in the scored rows, in column order.

        Example:
            >>> Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide").without_positive()
            ['b']
        """
        return [name for name, count in zip(self.classes, self.counts) if count == 0]

    def ranked(self, top: Optional[int] = None) -> List[int]:
        """Class indices for the per-class table and plot: all, worst first; or the ``top`` worst (``top > 0``)
        or the ``-top`` best, best first (``top < 0``), among the classes with a positive label.

        Example:
            >>> score = Score(0.5, 0.5, 1, 1, ["a", "b", "c"], [0.9, float("nan"), 0.2], [0.5, 0.0, 0.5], [1, 0, 1],
            ...               "wide")
            >>> score.ranked(), score.ranked(1), score.ranked(-1)
            ([2, 0, 1], [2], [0])
        """
        order = self.worst_first()
        if top is None:
            return order
        scored = [i for i in order if not math.isnan(self.per_class[i])]
        return scored[:top] if top > 0 else scored[::-1][:-top]

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


# The report names the classes without a positive label when there are at most this many.
_NAMED_ABSENT = 10

ReportSection = Callable[[Score], Sequence[str]]
"""A block of the text report: lines computed from a :class:`Score` (no lines: no block)."""


def summary_line(name: str, value: object) -> str:
    """One line of the report's summary, its value aligned with the others.

    Example:
        >>> summary_line("lwlrap", "0.750000")
        'lwlrap       0.750000'
    """
    return f"{name:<12} {value}"


def _ranked_title(score: Score, top: Optional[int]) -> str:
    if top is None:
        return "per-class lwlrap, worst first"
    shown = len(score.ranked(top))
    scored = len(score.classes) - len(score.without_positive())
    which = "worst" if top > 0 else "best"
    return f"per-class lwlrap, the {shown} {which} of {scored} classes with a positive label, {which} first"


def text_width(text: str) -> int:
    """The columns ``text`` takes in a terminal: 2 for a wide East Asian character, 0 for a combining mark. Where
    standard output's encoding cannot show it (the command line then writes ``\\uXXXX`` escapes), the escapes'.

    Example:
        >>> text_width("Bark"), text_width("犬の鳴き声"), text_width("e\u0301")
        (4, 10, 1)
    """
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    with contextlib.suppress(LookupError, UnicodeError):
        text = text.encode(encoding, "backslashreplace").decode(encoding)  # as the command line writes it
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def pad_to(text: str, width: int) -> str:
    """``text`` followed by spaces to ``width`` terminal columns (:func:`text_width`): a table's class column."""
    return text + " " * (width - text_width(text))


def per_class_table(score: Score, top: Optional[int] = None) -> List[str]:
    """The ``--per-class`` block: per-class lwlrap, weight and count, worst first (``-`` without positive); with
    ``top``, only the classes :meth:`Score.ranked` picks.

    Example:
        >>> score = Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide")
        >>> print("\\n".join(per_class_table(score)))
        per-class lwlrap, worst first:
        class    lwlrap    weight   count
        a      0.750000  1.000000       3
        b             -  0.000000       0
    """
    order = score.ranked(top)
    width = max([len("class")] + [text_width(score.classes[i]) for i in order])
    ci = score.extra.get("ci")
    header = f"{'class':<{width}}  {'lwlrap':>8}  {'weight':>8}  {'count':>6}"
    if ci:
        header += f"  {level_name(ci['level']) + ' interval':>20}"
    lines = [_ranked_title(score, top) + ":", header]
    for i in order:
        value = "-" if math.isnan(score.per_class[i]) else f"{score.per_class[i]:.6f}"
        line = f"{pad_to(score.classes[i], width)}  {value:>8}  {score.weights[i]:>8.6f}  {score.counts[i]:>6}"
        if ci:
            bounds = ci["per_class"][score.classes[i]]
            line += f"  {'-' if bounds is None else _bounds(bounds):>20}"
        lines.append(line)
    return lines


def level_name(level: float) -> str:
    """A confidence level as a percentage, with every digit it was given.

    Example:
        >>> level_name(0.95), level_name(0.975), level_name(0.9999999)
        ('95%', '97.5%', '99.99999%')
    """
    return f"{round(100 * level, 9):.12g}%"


def _bounds(bounds: Sequence[float]) -> str:
    return f"[{bounds[0]:.6f}, {bounds[1]:.6f}]"


#: The seeds the bootstrap accepts: ``[0, 2**63)`` (:func:`torch_lwlrap.stats._bootstrap.check_seed`).
SEED_LIMIT = 2**63


def check_bootstrap_args(
    num_bootstrap: int,
    level: float,
    option: str,
    *,
    seed: int = 0,
    pred_path: Optional[str] = None,
    systems: int = 1,
) -> int:
    """``num_bootstrap``; CommandError unless it is at least 1, ``0 < level < 1``, the seed is one the bootstrap
    accepts, when ``pred_path`` names a readable prediction file its classes' replicates of ``systems`` submissions
    fit in the memory available (:func:`torch_lwlrap.cli._environment.bootstrap_bytes`), and it is at most
    :data:`~torch_lwlrap._options.MAX_REPLICATES`.

    Example:
        >>> check_bootstrap_args(1000, 0.95, "--ci", seed=2**63 - 1)
        1000
        >>> try:
        ...     check_bootstrap_args(1000, 0.95, "--ci", seed=-1)
        ... except CommandError as err:
        ...     print(err)
        --seed takes a whole number from 0 to 2**63 - 1 (9223372036854775807), not -1.
    """
    if num_bootstrap < 1:
        raise CommandError(f"{option} takes a number of bootstrap replicates >= 1 (e.g. 1000), not {num_bootstrap}.")
    if not 0 < level < 1:
        raise CommandError(f"--level must be strictly between 0 and 1 (0.95 for a 95% interval), not {level}.")
    if not 0 <= seed < SEED_LIMIT:
        raise CommandError(f"--seed takes a whole number from 0 to 2**63 - 1 ({SEED_LIMIT - 1}), not {seed}.")
    num_classes = None if pred_path is None else _count_classes(pred_path)
    if num_classes:
        needed, available = bootstrap_bytes(num_bootstrap, num_classes, systems), available_memory()
        if available is not None and needed > available:
            systems_text = " x 2 submissions" if systems == 2 else ""
            raise CommandError(
                f"{option} {num_bootstrap} needs about {format_bytes(needed)} of memory for its bootstrap "
                f"replicates ({num_bootstrap} replicates x {num_classes} classes{systems_text}), "
                f"more than the {format_bytes(available)} available: use fewer replicates (1000 is usually enough)."
            )
    if num_bootstrap > MAX_REPLICATES:
        raise CommandError(
            f"{option} takes at most 2**24 ({MAX_REPLICATES}) bootstrap replicates, not {num_bootstrap}: use fewer "
            f"(1000 is usual)."
        )
    return num_bootstrap


def _count_classes(pred_path: str) -> Optional[int]:
    """The number of score columns in the header of a prediction file, gzip-compressed or not; None if it cannot be
    read (the reader reports that file later, with more detail) or is standard input (read once, later)."""
    if pred_path == STDIN:
        return None
    try:
        with open(pred_path, "rb") as raw:
            compressed = raw.read(len(GZIP_MAGIC)) == GZIP_MAGIC
        opener = gzip.open if compressed else open
        with opener(pred_path, "rt", newline="", encoding="utf-8-sig") as handle:
            header = next(csv.reader(handle), None)
    except (OSError, EOFError, UnicodeDecodeError, csv.Error):
        return None
    return len(header) - 1 if header else None


def format_report(
    score: Score,
    truth_path: str,
    pred_path: str,
    *,
    per_class: bool = False,
    top: Optional[int] = None,
    sections: Sequence[ReportSection] = (),
) -> str:
    """The plain-text report printed by ``torch-lwlrap score``.

    Args:
        score: what to report.
        truth_path: the truth file, as named on the command line.
        pred_path: the prediction file, as named on the command line.
        per_class: add the :func:`per_class_table` block.
        top: limit that block to the ``top`` worst classes (``top < 0``: the ``-top`` best); implies ``per_class``.
        sections: more blocks, in order, each after a blank line; a section that returns no lines adds nothing.

    Example:
        >>> score = Score(0.75, 0.8, 2, 3, ["a", "b"], [0.75, float("nan")], [1.0, 0.0], [3, 0], "wide")
        >>> print(format_report(score, "t.csv", "p.csv"))
        truth        t.csv (wide 0/1 table)
        predictions  p.csv
        samples      2
        classes      2 (1 without a positive label: b)
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
    if score.metadata_columns:
        layout += "; not scored: " + ", ".join(score.metadata_columns)
    lines = [summary_line("truth", f"{truth_path} ({layout})")]
    if score.where:
        conditions = " and ".join(f"{column}={value}" for column, value in score.where)
        lines.append(summary_line("where", f"{conditions}: {score.num_samples} of {score.truth_rows} truth rows"))
    lines.append(summary_line("predictions", pred_path + ignored_rows_note(score.ignored_pred_rows)))
    if score.vocabulary is not None:
        lines.append(summary_line("vocabulary", f"{score.vocabulary} (every class, no other)"))
    classes = str(len(score.classes))
    absent = score.without_positive()
    if absent:
        names = ": " + ", ".join(absent) if len(absent) <= _NAMED_ABSENT else ", listed by --json"
        classes += f" ({len(absent)} without a positive label{names})"
    lines += [
        summary_line("samples", str(score.num_samples) + unlabelled_note(score.rows_without_label)),
        summary_line("classes", classes),
        summary_line("labels", labels_summary(score.num_labels, score.num_unknown)),
    ]
    ties = score.extra.get("options", {}).get("ties", "max")
    if ties != "max":  # as compare's report says it: the values below follow this rule, the tie block's 'max' not
        lines.append(summary_line("tie rule", f"--ties {ties}"))
    lines += [
        summary_line("lwlrap", f"{score.lwlrap:.6f}" + _interval_note(score)),
        summary_line("LRAP", f"{score.lrap:.6f}"),
    ]
    table = functools.partial(per_class_table, top=top)
    blocks = ([table] if per_class or top is not None else []) + list(sections)
    for section in blocks:
        block = list(section(score))
        if block:
            lines += [""] + block
    return "\n".join(lines)


def ignored_rows_note(rows: int) -> str:
    """What follows a prediction file's name where ``--where`` left rows of it out ("" where it left none)."""
    return f" ({rows} row{'' if rows == 1 else 's'} outside the selection ignored)" if rows else ""


def unlabelled_note(rows: int, lrap: bool = True) -> str:
    """The ``samples`` line's note of rows without a positive label (``lrap``: the report gives LRAP too).

    Example:
        >>> unlabelled_note(0), unlabelled_note(2)
        ('', ' (2 without a positive label: left out of lwlrap; LRAP counts each as 1, as scikit-learn does)')
        >>> unlabelled_note(1, lrap=False)
        ' (1 without a positive label: left out of lwlrap)'
    """
    if not rows:
        return ""
    return f" ({rows} without a positive label: left out of lwlrap" + (
        "; LRAP counts each as 1, as scikit-learn does)" if lrap else ")")


def labels_summary(num_labels: int, num_unknown: int) -> str:
    """The value of the report's ``labels`` line.

    Example:
        >>> labels_summary(397, 0), labels_summary(397, 12)
        ('397 positive', '397 positive, 12 unknown (--unknown: neither positive nor ranked)')
    """
    unknown = f", {num_unknown} unknown (--unknown: neither positive nor ranked)" if num_unknown else ""
    return f"{num_labels} positive{unknown}"


def no_interval_reason(labelled_rows: int, num_bootstrap: int) -> str:
    """Why the overall interval is missing: fewer than two rows with a positive label, or else no replicate drew
    one (only a handful of replicates can all miss them).

    Example:
        >>> no_interval_reason(1, 1000)
        'one row with a positive label (every bootstrap replicate is that row)'
        >>> no_interval_reason(3, 1)
        'none of the 1 bootstrap replicate(s) drew a row with a positive label (use more replicates: 1000 is usual)'
    """
    if labelled_rows < 2:
        return "one row with a positive label (every bootstrap replicate is that row)"
    return (
        f"none of the {num_bootstrap} bootstrap replicate(s) drew a row with a positive label (use more replicates: "
        f"1000 is usual)"
    )


def _interval_note(score: Score) -> str:
    ci = score.extra.get("ci")
    if not ci:
        return ""
    if ci["lwlrap"] is None:
        return "  no interval: " + no_interval_reason(score.num_samples - score.rows_without_label, ci["num_bootstrap"])
    return f"  {level_name(ci['level'])} interval {_bounds(ci['lwlrap'])} (bootstrap, B={ci['num_bootstrap']})"


def check_plot_target(path: str) -> str:
    """Before any scoring: ``--plot PATH`` can be written (matplotlib installed, a file name, not a folder, in a
    folder that is there and writable, of a format matplotlib writes), so that a long run never ends in an error
    that throws its report away. Returns the file the chart goes to: ``PATH``, with ``.png`` added where it names no
    format (matplotlib's default format), so that the report names the file written.

    Example:
        >>> check_plot_target("per_class")
        'per_class.png'
    """
    try:
        import matplotlib
    except ImportError:
        raise CommandError(
            "--plot needs matplotlib, which is not installed: pip install matplotlib (the package's plot extra)."
        ) from None
    if os.path.isdir(path):
        raise CommandError(
            f"--plot {path}: that is a folder: name a file in it, such as {os.path.join(path, 'per_class.png')}."
        )
    from matplotlib.backend_bases import FigureCanvasBase

    formats = dict(FigureCanvasBase.get_supported_filetypes())
    if shutil.which(matplotlib.rcParams["pgf.texsystem"]) is None:  # pgf needs a LaTeX install to write
        formats.pop("pgf", None)
    extension = os.path.splitext(path)[1][1:].lower()
    if not extension:
        path = path.rstrip(".") + ".png"
    elif extension not in formats:
        raise CommandError(
            f"--plot {path}: matplotlib writes no '.{extension}' files: end the name with one of "
            f"{', '.join('.' + name for name in sorted(formats))}."
        )
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise CommandError(f"--plot {path}: the folder {folder!r} does not exist: create it, or name another file.")
    if not os.access(folder, os.W_OK):
        raise CommandError(f"--plot {path}: the folder {folder!r} is not writable: name a file in another folder.")
    return path


def write_plot(score: Score, path: str, *, top: Optional[int] = None) -> None:
    """Write the per-class bar chart, worst first (the classes of :meth:`Score.ranked`), to ``path`` (needs
    matplotlib); :class:`CsvFormatError` if it cannot be written."""
    import torch

    from torch_lwlrap.plot import _pyplot, layout_below_title, panel_slices, plot_per_class

    plt = _pyplot()
    order = score.ranked(top)
    if top is None:
        title = f"per-class lwlrap (overall {score.lwlrap:.4f}), worst first"
    else:
        which = "worst" if top > 0 else "best"
        scored = len(score.classes) - len(score.without_positive())
        title = f"per-class lwlrap: the {len(order)} {which} of {scored} classes\n(overall lwlrap {score.lwlrap:.4f})"
    fig = None
    try:
        fig, axes = plot_per_class(
            torch.tensor([score.per_class[i] for i in order], dtype=torch.float64),
            torch.tensor([score.weights[i] for i in order], dtype=torch.float64),
            class_names=[score.classes[i] for i in order],
            title=title,
        )
        if score.extra.get("ci"):
            for ax, chunk in zip(axes if isinstance(axes, list) else [axes], panel_slices(len(order))):
                _draw_intervals(ax, score, order[chunk])
            layout_below_title(fig)  # the intervals' axis label is longer
        fig.savefig(path, dpi=100)
    except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: a writer's missing tool (LaTeX for .pgf)
        message = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise CsvFormatError(f"cannot write the plot to {path!r}: {message}.") from None
    finally:
        if fig is not None:
            plt.close(fig)


def _draw_intervals(ax, score: Score, chosen: Sequence[int]) -> None:
    """The bootstrap interval of each class drawn (``--ci``) on its bar, as an error bar."""
    ci = score.extra["ci"]
    rows = [(y, i) for y, i in enumerate(chosen) if ci["per_class"].get(score.classes[i]) is not None]
    if not rows:
        return
    bounds = [ci["per_class"][score.classes[i]] for _, i in rows]
    # Centred on the interval, not on the value: a percentile interval need not hold the value in its middle.
    ax.errorbar(
        [(low + high) / 2 for low, high in bounds],
        [y for y, _ in rows],
        xerr=[(high - low) / 2 for low, high in bounds],
        fmt="none",
        ecolor="black",
        elinewidth=1,
        capsize=2,
    )
    # Each bar's value label starts right of its interval (not over it); the axis label says what the bars are,
    # where a legend would cover the last bar.
    high_of = {y: high for (y, _), (_, high) in zip(rows, bounds)}
    for text in ax.texts:
        x, y = text.get_position()
        if round(y) in high_of:
            text.set_x(max(x, min(high_of[round(y)], 1.0) + 0.01))
    ax.set_xlabel(f"lwlrap; black: {level_name(ci['level'])} bootstrap interval ({ci['num_bootstrap']} replicates)")


def print_output(text: str) -> None:
    """Print the command's output; a reader that leaves early (``torch-lwlrap score ... | head``) is no error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
