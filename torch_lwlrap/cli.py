"""Command line: score a Kaggle-format submission CSV against a ground-truth CSV.

Usage::

    torch-lwlrap score TRUTH.csv PRED.csv [--per-class] [--json] [--plot OUT.png] [--ties max|index]
    python -m torch_lwlrap score TRUTH.csv PRED.csv

``TRUTH.csv`` is either the challenge layout, header ``fname,labels`` with the positive class names of a row
comma-joined in one quoted field (``a.wav,"Bark,Dog"``), or a wide 0/1 table with header ``fname,<class>,...``.
``PRED.csv`` is the submission layout, header ``fname,<class>,...`` with one score per class. Rows are matched by
``fname`` and classes by column name, both in any order. All scoring goes through
:func:`torch_lwlrap.multilabel_lwlrap_per_class`, :func:`torch_lwlrap.multilabel_lwlrap` and
:func:`torch_lwlrap.multilabel_lrap`.

A bad file ends the program with exit status 2 and one line on stderr naming the file, the line, the ``fname``
and/or the column at fault.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "CsvFormatError",
    "Predictions",
    "Score",
    "Truth",
    "build_parser",
    "format_report",
    "main",
    "read_predictions",
    "read_truth",
    "score_files",
]

PROG = "torch-lwlrap"
CHALLENGE_HEADER = ("fname", "labels")


class CsvFormatError(ValueError):
    """A CSV file that cannot be scored; the message names the file, the line, the fname and/or the column.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "truth.csv")
        >>> with open(path, "w") as file:
        ...     _ = file.write("fname,labels")
        >>> read_truth(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        torch_lwlrap.cli.CsvFormatError: truth file '...truth.csv' has a header but no rows.
    """


@dataclass
class Truth:
    """Ground truth read from a CSV file by :func:`read_truth` (whose example reads one).

    Example:
        >>> truth = Truth(["a.wav", "b.wav"], [["Bark", "Dog"], []], None, "challenge", "truth.csv", [2, 3])
        >>> sum(len(labels) for labels in truth.labels)  # positive labels
        2

    Attributes:
        fnames: the ``fname`` of each row, in file order.
        labels: for each row, the positive class names (file order, without duplicates).
        classes: the class columns of a wide table, or None for the challenge layout (whose classes are the
            prediction's columns).
        layout: ``"challenge"`` (``fname,labels``) or ``"wide"`` (``fname,<class>,...`` with 0/1 values).
        path: the file read.
        lines: the line number of each row in the file (for messages).
    """

    fnames: List[str]
    labels: List[List[str]]
    classes: Optional[List[str]]
    layout: str
    path: str
    lines: List[int]


@dataclass
class Predictions:
    """Scores read from a submission CSV file by :func:`read_predictions` (whose example reads one).

    Example:
        >>> predictions = Predictions(["a.wav"], ["Bark", "Cat"], np.array([[0.9, -2.5]]), "submission.csv")
        >>> dict(zip(predictions.classes, predictions.scores[0].tolist()))
        {'Bark': 0.9, 'Cat': -2.5}

    Attributes:
        fnames: the ``fname`` of each row, in file order.
        classes: the class columns, in file order.
        scores: float64 array ``(rows, classes)``.
        path: the file read.
    """

    fnames: List[str]
    classes: List[str]
    scores: np.ndarray
    path: str


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


# ---------------------------------------------------------------------------------------------------------------
# Reading


def _is_challenge(header: Sequence[str]) -> bool:
    return len(header) == 2 and set(header) == set(CHALLENGE_HEADER)


def _where(path: str, line: int, fname: Optional[str] = None) -> str:
    return f"{path!r}, line {line}" + (f" (fname {fname!r})" if fname is not None else "")


def _read_rows(path: str, role: str) -> Tuple[List[str], List[Tuple[int, List[str]]]]:
    """Header (stripped names) and ``(line, fields)`` of each non-blank row; checks header and field counts."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            header: Optional[List[str]] = None
            rows: List[Tuple[int, List[str]]] = []
            for fields in reader:
                if not fields or all(not field.strip() for field in fields):
                    continue  # blank line
                if header is None:
                    header = [field.strip() for field in fields]
                else:
                    rows.append((reader.line_num, fields))
    except FileNotFoundError:
        raise CsvFormatError(f"{role} file {path!r} does not exist.") from None
    except IsADirectoryError:
        raise CsvFormatError(f"{role} file {path!r} is a directory, not a CSV file.") from None
    except UnicodeDecodeError as err:
        raise CsvFormatError(f"{role} file {path!r} is not UTF-8 text ({err.reason} at byte {err.start}).") from None
    except csv.Error as err:
        raise CsvFormatError(f"{role} file {path!r} is not valid CSV: {err}.") from None
    except OSError as err:
        raise CsvFormatError(f"{role} file {path!r} cannot be read: {err.strerror or err}.") from None

    if header is None:
        raise CsvFormatError(f"{role} file {path!r} is empty: expected a header line and one row per fname.")
    if "fname" not in header:
        shown = ",".join(header)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise CsvFormatError(
            f"{role} file {path!r} has no 'fname' column: its first line must be a header such as "
            f"'fname,labels' or 'fname,<class>,...', but got {shown!r}."
        )
    seen: Dict[str, int] = {}
    for position, name in enumerate(header):
        if not name:
            raise CsvFormatError(f"{role} file {path!r}: column {position + 1} of the header has no name.")
        if name in seen:
            raise CsvFormatError(f"{role} file {path!r}: column {name!r} appears twice in the header.")
        seen[name] = position
    if not rows:
        raise CsvFormatError(f"{role} file {path!r} has a header but no rows.")

    fname_at = header.index("fname")
    first_line: Dict[str, int] = {}
    for line, fields in rows:
        fname = fields[fname_at].strip() if fname_at < len(fields) else None
        if len(fields) != len(header):
            hint = ""
            if _is_challenge(header) and len(fields) > 2:
                hint = ' (put the labels of a row in one quoted field, e.g. a.wav,"Bark,Dog")'
            raise CsvFormatError(
                f"{role} file {_where(path, line, fname)}: {len(fields)} fields, but the header has "
                f"{len(header)}{hint}."
            )
        if not fname:
            raise CsvFormatError(f"{role} file {_where(path, line)}: the fname field is empty.")
        if fname in first_line:
            raise CsvFormatError(
                f"{role} file {_where(path, line)}: fname {fname!r} is duplicated (first on line "
                f"{first_line[fname]})."
            )
        first_line[fname] = line
    return header, rows


def read_truth(path: str) -> Truth:
    """Read a ground-truth CSV: challenge layout (``fname,labels``) or a wide 0/1 table (``fname,<class>,...``).

    The layout is told by the header: exactly the two columns ``fname`` and ``labels`` is the challenge layout,
    anything else with an ``fname`` column is a wide table. In the challenge layout, ``labels`` holds the positive
    class names comma-joined (quoted when more than one); an empty field means no positive label.

    Args:
        path: the CSV file.

    Returns:
        A :class:`Truth`.

    Raises:
        CsvFormatError: a missing, empty or malformed file; the message names the file, line, fname or column.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> path = os.path.join(folder, "truth.csv")
        >>> with open(path, "w") as f:
        ...     _ = f.write('fname,labels\\na.wav,"Bark,Dog"\\nb.wav,Guitar\\n')
        >>> truth = read_truth(path)
        >>> truth.layout, truth.fnames, truth.labels
        ('challenge', ['a.wav', 'b.wav'], [['Bark', 'Dog'], ['Guitar']])
    """
    header, rows = _read_rows(path, "truth")
    fname_at = header.index("fname")
    fnames = [fields[fname_at].strip() for _, fields in rows]
    lines = [line for line, _ in rows]
    if _is_challenge(header):
        labels_at = header.index("labels")
        labels = []
        for fields in (fields for _, fields in rows):
            names = [name.strip() for name in fields[labels_at].split(",")]
            labels.append(list(dict.fromkeys(name for name in names if name)))
        return Truth(fnames, labels, None, "challenge", path, lines)

    classes = [name for name in header if name != "fname"]
    if not classes:
        raise CsvFormatError(f"truth file {path!r} has an 'fname' column but no class columns.")
    labels = []
    for line, fields in rows:
        positive = []
        for position, name in enumerate(header):
            if position == fname_at:
                continue
            text = fields[position].strip()
            try:
                value = float(text)
            except ValueError:
                value = float("nan")
            if value not in (0.0, 1.0):
                raise CsvFormatError(
                    f"truth file {_where(path, line, fields[fname_at].strip())}, column {name!r}: the value "
                    f"{text!r} is not 0 or 1."
                )
            if value == 1.0:
                positive.append(name)
        labels.append(positive)
    return Truth(fnames, labels, classes, "wide", path, lines)


def read_predictions(path: str) -> Predictions:
    """Read a submission CSV: header ``fname,<class>,...`` and one real score per class and row.

    Scores may be any real number (probabilities, logits, ``inf``); they are ranked as given. Empty, non-numeric
    and NaN scores are rejected.

    Args:
        path: the CSV file.

    Returns:
        A :class:`Predictions`.

    Raises:
        CsvFormatError: a missing, empty or malformed file; the message names the file, line, fname or column.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> path = os.path.join(folder, "submission.csv")
        >>> with open(path, "w") as f:
        ...     _ = f.write("fname,Bark,Dog\\na.wav,0.9,0.25\\nb.wav,0.1,0.5\\n")
        >>> pred = read_predictions(path)
        >>> pred.classes, pred.scores.tolist()
        (['Bark', 'Dog'], [[0.9, 0.25], [0.1, 0.5]])
    """
    header, rows = _read_rows(path, "prediction")
    fname_at = header.index("fname")
    classes = [name for name in header if name != "fname"]
    if not classes:
        raise CsvFormatError(f"prediction file {path!r} has an 'fname' column but no class columns.")
    columns = [position for position in range(len(header)) if position != fname_at]
    scores = np.empty((len(rows), len(columns)), dtype=np.float64)
    fnames = []
    for row, (line, fields) in enumerate(rows):
        fname = fields[fname_at].strip()
        fnames.append(fname)
        for column, position in enumerate(columns):
            text = fields[position].strip()
            try:
                value = float(text)
            except ValueError:
                problem = "is empty" if not text else f"{text!r} is not a number"
                raise CsvFormatError(
                    f"prediction file {_where(path, line, fname)}, column {header[position]!r}: the score "
                    f"{problem}."
                ) from None
            if math.isnan(value):
                raise CsvFormatError(
                    f"prediction file {_where(path, line, fname)}, column {header[position]!r}: the score is NaN, "
                    f"which cannot be ranked."
                )
            scores[row, column] = value
    return Predictions(fnames, classes, scores, path)


def _align(truth: Truth, pred: Predictions) -> np.ndarray:
    """0/1 target ``(rows, classes)`` in the prediction's row and column order."""
    pred_rows = {fname: row for row, fname in enumerate(pred.fnames)}
    truth_fnames = set(truth.fnames)
    for fname, line in zip(truth.fnames, truth.lines):
        if fname not in pred_rows:
            raise CsvFormatError(
                f"fname {fname!r} (truth file {truth.path!r}, line {line}) is missing from prediction file "
                f"{pred.path!r}."
            )
    for fname in pred.fnames:
        if fname not in truth_fnames:
            raise CsvFormatError(
                f"fname {fname!r} of prediction file {pred.path!r} is missing from truth file {truth.path!r}."
            )
    columns = {name: column for column, name in enumerate(pred.classes)}
    if truth.classes is not None:
        for name in truth.classes:
            if name not in columns:
                raise CsvFormatError(
                    f"class column {name!r} of truth file {truth.path!r} is not a column of prediction file "
                    f"{pred.path!r}."
                )
    target = np.zeros(pred.scores.shape, dtype=np.int8)
    for fname, line, labels in zip(truth.fnames, truth.lines, truth.labels):
        row = pred_rows[fname]
        for name in labels:
            if name not in columns:
                raise CsvFormatError(
                    f"truth file {_where(truth.path, line, fname)}: label {name!r} is not a column of prediction "
                    f"file {pred.path!r}."
                )
            target[row, columns[name]] = 1
    return target


# ---------------------------------------------------------------------------------------------------------------
# Scoring


def score_files(truth_path: str, pred_path: str, *, ties: str = "max") -> Score:
    """Read a truth and a submission CSV, match rows by ``fname`` and classes by name, and score them.

    Args:
        truth_path: ground truth, challenge layout (``fname,labels``) or wide 0/1 table.
        pred_path: submission, ``fname,<class>,...`` with scores.
        ties: ``"max"`` (tied scores share the lowest rank, scikit-learn's rule) or ``"index"`` (tied scores are
            ordered by the prediction file's column order, leftmost first).

    Returns:
        A :class:`Score`; classes are listed in the prediction file's column order.

    Raises:
        CsvFormatError: a bad file (see :func:`read_truth`, :func:`read_predictions`), an fname in one file but
            not the other, a truth class that is not a prediction column, or a truth without any positive label.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with open(os.path.join(folder, "truth.csv"), "w") as f:
        ...     _ = f.write('fname,labels\\nx.wav,"a,c"\\ny.wav,"b,c"\\n')
        >>> with open(os.path.join(folder, "pred.csv"), "w") as f:
        ...     _ = f.write("fname,a,b,c\\ny.wav,0.1,0.7,0.2\\nx.wav,0.1,0.7,0.2\\n")
        >>> score = score_files(os.path.join(folder, "truth.csv"), os.path.join(folder, "pred.csv"))
        >>> round(score.lwlrap, 4), round(score.lrap, 4), score.num_labels
        (0.7917, 0.7917, 4)
        >>> [round(value, 4) for value in score.per_class]
        [0.6667, 1.0, 0.75]
    """
    import torch

    from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class

    truth = read_truth(truth_path)
    pred = read_predictions(pred_path)
    target_np = _align(truth, pred)
    counts = target_np.sum(axis=0, dtype=np.int64)
    if counts.sum() == 0:
        raise CsvFormatError(
            f"truth file {truth.path!r} has no positive label at all: lwlrap is undefined without one."
        )
    preds = torch.from_numpy(pred.scores)  # float64
    target = torch.from_numpy(target_np)
    per_class, weights = multilabel_lwlrap_per_class(preds, target, ties=ties)
    lwlrap = multilabel_lwlrap(preds, target, ties=ties)
    lrap = multilabel_lrap(preds, target, ties=ties)
    return Score(
        lwlrap=float(lwlrap),
        lrap=float(lrap),
        num_samples=len(pred.fnames),
        num_labels=int(counts.sum()),
        classes=list(pred.classes),
        per_class=[float(value) for value in per_class.tolist()],
        weights=[float(value) for value in weights.tolist()],
        counts=[int(value) for value in counts.tolist()],
        truth_layout=truth.layout,
    )


# ---------------------------------------------------------------------------------------------------------------
# Output


def format_report(score: Score, truth_path: str, pred_path: str, *, per_class: bool = False) -> str:
    """The plain-text report printed by ``torch-lwlrap score``.

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
    """
    layout = "challenge layout: fname,labels" if score.truth_layout == "challenge" else "wide 0/1 table"
    lines = [
        f"truth        {truth_path} ({layout})",
        f"predictions  {pred_path}",
        f"samples      {score.num_samples}",
        f"classes      {len(score.classes)}",
        f"labels       {score.num_labels} positive",
        f"lwlrap       {score.lwlrap:.6f}",
        f"LRAP         {score.lrap:.6f}",
    ]
    if per_class:
        width = max([len("class")] + [len(name) for name in score.classes])
        lines += ["", "per-class lwlrap, worst first:"]
        lines.append(f"{'class':<{width}}  {'lwlrap':>8}  {'weight':>8}  {'count':>6}")
        for i in score.worst_first():
            value = "-" if math.isnan(score.per_class[i]) else f"{score.per_class[i]:.6f}"
            lines.append(f"{score.classes[i]:<{width}}  {value:>8}  {score.weights[i]:>8.6f}  {score.counts[i]:>6}")
    return "\n".join(lines)


def _write_plot(score: Score, path: str) -> None:
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


# ---------------------------------------------------------------------------------------------------------------
# Entry point


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``torch-lwlrap``.

    Example:
        >>> args = build_parser().parse_args(["score", "truth.csv", "pred.csv", "--per-class"])
        >>> args.command, args.truth, args.pred, args.per_class, args.ties
        ('score', 'truth.csv', 'pred.csv', True, 'max')
    """
    from torch_lwlrap import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Exact lwlrap (DCASE 2019 task 2 / Freesound Audio Tagging 2019) and LRAP of multi-label "
        "predictions.",
        epilog="example: torch-lwlrap score truth.csv submission.csv --per-class",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    score = commands.add_parser(
        "score",
        help="score a submission CSV against a ground-truth CSV",
        description="Score a Kaggle-format submission against the ground truth: prints lwlrap (label-weighted "
        "label-ranking average precision) and LRAP. Rows are matched by fname and classes by column name, both "
        "in any order; every fname must be in both files.",
        epilog="Exit status: 0 on success, 2 on a bad file or bad arguments (one line on stderr).",
    )
    score.add_argument(
        "truth",
        metavar="TRUTH.csv",
        help="ground truth: 'fname,labels' with the positive class names of a row comma-joined in one quoted "
        'field (a.wav,"Bark,Dog"), or a wide 0/1 table \'fname,<class>,...\'. In the first layout the classes '
        "are the prediction's columns; in the second every class must be a prediction column.",
    )
    score.add_argument(
        "pred",
        metavar="PRED.csv",
        help="submission: 'fname,<class>,...' with one score per class (probabilities, logits or any real "
        "number, ranked as given); extra classes without a positive are allowed.",
    )
    score.add_argument(
        "--per-class", action="store_true", help="add a table of per-class lwlrap, weight and count, worst first"
    )
    score.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object {"lwlrap", "lrap", "num_samples", "num_labels", "num_classes", "per_class"} '
        "and nothing else",
    )
    score.add_argument(
        "--plot", metavar="OUT.png", help="write a per-class bar chart, worst first (needs matplotlib)"
    )
    score.add_argument(
        "--ties",
        choices=("max", "index"),
        default="max",
        help="tied scores: 'max' shares the lowest rank (scikit-learn's rule, default); 'index' orders them by "
        "the prediction file's column order, leftmost first",
    )
    doctor = commands.add_parser(
        "doctor",
        help="check this installation: versions, values against a reference on every device, speed",
        description="Check this installation; paste its output into an issue if something looks wrong.",
    )
    doctor.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    return parser


def _error(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the command line; returns the exit status (0 success, 2 bad file or arguments).

    Args:
        argv: the arguments without the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit status.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with open(os.path.join(folder, "truth.csv"), "w") as f:
        ...     _ = f.write('fname,labels\\nx.wav,"a,c"\\ny.wav,"b,c"\\n')
        >>> with open(os.path.join(folder, "pred.csv"), "w") as f:
        ...     _ = f.write("fname,a,b,c\\nx.wav,0.1,0.7,0.2\\ny.wav,0.1,0.7,0.2\\n")
        >>> code = main(["score", os.path.join(folder, "truth.csv"), os.path.join(folder, "pred.csv"), "--json"])
        ... # doctest: +ELLIPSIS
        {"lwlrap": 0.79166..., "lrap": 0.79166..., "num_samples": 2, "num_labels": 4, "num_classes": 3, ...}
        >>> code
        0
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help, --version and usage errors
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 2)
    if args.command == "doctor":
        from torch_lwlrap.doctor import run

        return run(json_output=args.json)

    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return _error("--plot needs matplotlib, which is not installed: pip install 'torch-lwlrap[plot]'.")

    try:
        score = score_files(args.truth, args.pred, ties=args.ties)
        if args.plot:
            _write_plot(score, args.plot)
    except CsvFormatError as err:
        return _error(str(err))

    if args.json:
        text = json.dumps(score.to_dict())
    else:
        text = format_report(score, args.truth, args.pred, per_class=args.per_class)
        if args.plot:
            text += f"\n\nper-class chart written to {args.plot}"
    try:
        print(text, flush=True)
    except BrokenPipeError:  # e.g. `torch-lwlrap score ... | head`: the reader left, which is no error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
