"""What ``score`` and ``compare`` share: the options that choose what is scored and how (``--ties``, ``--where``,
``--classes``, ``--unknown``), and reading the truth and the submissions under them.

Both subcommands add these options with :func:`add_input_options` and read their files with :func:`read_inputs`,
so an option means the same and is checked the same way in both.
"""

from __future__ import annotations

import argparse
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from torch_lwlrap._options import TIES
from torch_lwlrap.cli._files import (
    STDIN,
    UNKNOWN_TARGET,
    CommandError,
    CsvFormatError,
    Predictions,
    Truth,
    check_unknown,
    file_name,
    read_predictions,
    read_text,
    read_truth,
)
from torch_lwlrap.cli._match import align, check_vocabulary, read_classes, select_rows

__all__ = ["Inputs", "add_input_options", "input_options", "read_inputs"]


def add_input_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--ties``, ``--where``, ``--classes`` and ``--unknown`` to a subcommand's parser."""
    parser.add_argument(
        "--ties",
        choices=TIES,
        default="max",
        help="tied scores: 'max' shares the lowest rank (scikit-learn's rule, default); 'index' orders them by "
        "the prediction file's column order, leftmost first; 'expected' is the exact mean over random orders of "
        "tied scores (what sort-based code such as the challenge's gives on average)",
    )
    parser.add_argument(
        "--where",
        metavar="COLUMN=VALUE",
        type=_condition,
        action="append",
        default=[],
        help="score only the truth rows whose metadata column COLUMN holds VALUE (exactly), e.g. usage=Public for "
        "a public-leaderboard submission; repeat it to require several; prediction rows of the other truth rows "
        "are left out and counted in the report. Without it, every fname must be in both files",
    )
    parser.add_argument(
        "--classes",
        metavar="FILE",
        dest="classes_path",
        help="the class vocabulary: one class name a line, or the challenge's vocabulary CSV 'index,label[,mid]'; "
        "then the prediction columns must be exactly these classes (in any order)",
    )
    parser.add_argument(
        "--unknown",
        metavar="VALUE",
        help="in a wide truth table (fname,<class>,... of 0 and 1), the value that marks an unknown label, e.g. "
        "-1: such an entry is neither positive nor ranked (the Python API's ignore_index). Not 0 or 1",
    )


def _condition(text: str) -> Tuple[str, str]:
    column, equals, value = text.partition("=")
    if not equals or not column.strip():
        raise argparse.ArgumentTypeError(f"expected COLUMN=VALUE, such as usage=Public, but got {text!r}")
    return column.strip(), value.strip()


@dataclass
class Inputs:
    """A truth file and one or more submissions, read and matched under the input options.

    Attributes:
        truth: the truth rows scored (all, or those ``where`` selects).
        truth_rows: the number of rows of the truth file.
        predictions: each submission as read.
        scores: each submission's scores of the scored rows, all with their rows in fname order (sorted, whatever
            the files' order) and their columns in the first submission's order.
        target: ``(rows, classes)`` int8 in that order: 1 positive, 0 negative, :data:`UNKNOWN_TARGET` unknown.
        ignored_pred_rows: for each submission, its rows left out because their truth rows were not selected.
        counts: the positive labels of each class.
        num_unknown: the unknown labels scored rows hold (``--unknown``).
    """

    truth: Truth
    truth_rows: int
    predictions: List[Predictions]
    scores: List[np.ndarray]
    target: np.ndarray
    ignored_pred_rows: List[int]
    counts: np.ndarray
    num_unknown: int

    @property
    def classes(self) -> List[str]:
        """The class names, in the first submission's column order."""
        return list(self.predictions[0].classes)

    @property
    def ignore_index(self) -> Optional[int]:
        """The ``ignore_index`` to score :attr:`target` with: :data:`UNKNOWN_TARGET` when it holds unknown labels."""
        return UNKNOWN_TARGET if self.num_unknown else None


def read_inputs(
    truth_path: str,
    pred_paths: Sequence[str],
    *,
    where: Sequence[Tuple[str, str]] = (),
    classes_path: Optional[str] = None,
    unknown: Optional[str] = None,
) -> Inputs:
    """Read the truth and the submissions, select the truth rows, check the vocabulary and match rows and classes.

    Every submission must score the selected truth rows and the same classes (in any order); their scores are
    returned with their rows in fname order and their columns in the first submission's order.

    Raises:
        CommandError: more than one file is ``-``; a bad ``--unknown``, ``--where`` or ``--classes``.
        CsvFormatError: a bad file, a row or class in one file but not another, or no positive label at all.
    """
    roles = ["truth"] + (["prediction"] if len(pred_paths) == 1 else [f"{name} prediction" for name in "AB"])
    paths = [truth_path, *pred_paths]
    from_stdin = [role for role, path in zip(roles, paths) if path == STDIN]
    if len(from_stdin) > 1:
        raise CommandError(
            f"the {' and '.join(from_stdin)} files are both '-', but standard input holds one file: pipe in at most "
            f"one of them and name the others by path."
        )
    unknown = check_unknown(unknown)
    texts = [read_text(path, role.split()[-1]) for role, path in zip(roles, paths)]
    vocabulary = None if classes_path is None else read_classes(classes_path)
    try:  # swapped files fail in the truth, or (a 0/1 submission reads as a wide truth) in the labels file after it
        all_truth = read_truth(truth_path, unknown=unknown, text=texts[0])
        named = set(all_truth.classes or ()).union(*all_truth.labels, vocabulary or ())
        predictions = [
            read_predictions(path, text=text, truth_classes=named) for path, text in zip(pred_paths, texts[1:])
        ]
    except CsvFormatError as err:
        hint = _swapped_hint(paths, texts)
        if not hint:
            raise
        raise CsvFormatError(f"{err}{hint}") from None
    truth = select_rows(all_truth, where)
    if vocabulary is not None:
        for pred in predictions:
            check_vocabulary(vocabulary, classes_path, truth, pred)
    unselected = set(all_truth.fnames).difference(truth.fnames) if where else set()
    aligned = [align(truth, pred, unselected=unselected) for pred in predictions]
    target, kept_rows = aligned[0]
    first = predictions[0]
    # Rows in fname order, whatever order the files list them in: the bootstrap's weights follow row positions, so
    # an interval then depends on no file's layout, and swapping A and B mirrors a comparison's interval.
    names = [first.fnames[row] for row in kept_rows.tolist()]
    order = np.array(sorted(range(len(names)), key=names.__getitem__), dtype=np.int64)
    target, kept_rows = target[order], kept_rows[order]
    in_place = np.array_equal(kept_rows, np.arange(len(first.fnames)))
    scores = [first.scores if in_place else first.scores[kept_rows]]
    for pred, (_, rows) in zip(predictions[1:], aligned[1:]):
        scores.append(_reorder(pred, rows, first, kept_rows))
    counts = (target == 1).sum(axis=0, dtype=np.int64)
    if counts.sum() == 0:
        rows = " in the truth rows selected by " + " ".join(f"--where {c}={v}" for c, v in where) if where else ""
        raise CsvFormatError(
            f"truth file {truth.path!r} has no positive label at all{rows}: lwlrap is undefined without one."
        )
    for pred, values in zip(predictions, scores):
        _warn_whole_number_columns(pred, values, counts, selected=bool(where))
    return Inputs(
        truth=truth,
        truth_rows=len(all_truth.fnames),
        predictions=predictions,
        scores=scores,
        target=target,
        ignored_pred_rows=[len(pred.fnames) - len(rows) for pred, (_, rows) in zip(predictions, aligned)],
        counts=counts,
        num_unknown=int((target == UNKNOWN_TARGET).sum()),
    )


def _warn_whole_number_columns(pred: Predictions, scores: np.ndarray, counts: np.ndarray, selected: bool) -> None:
    """Warn of the class columns without a positive label whose values are varied whole numbers (beyond 0 and 1) in
    a submission whose labelled classes are scored with fractions: a ``fold`` or ``id`` column left in the file,
    which, scored as a class, can outrank real classes and lower lwlrap. (A submission of whole numbers throughout,
    ranks say, and constant or infinite columns are no cause.)"""
    finite = np.isfinite(scores)
    whole = np.all(finite & (scores == np.floor(np.where(finite, scores, 0.0))), axis=0)
    labelled = counts > 0
    if not labelled.any() or whole[labelled].all():
        return
    varied = scores.max(axis=0, initial=-np.inf) > np.maximum(scores.min(axis=0, initial=np.inf), 1.0)
    suspects = [name for name, w, v, c in zip(pred.classes, whole, varied, counts.tolist()) if w and v and c == 0]
    if suspects:
        shown = ", ".join(repr(name) for name in suspects[:5]) + (", ..." if len(suspects) > 5 else "")
        what = f"the column {shown} holds" if len(suspects) == 1 else f"the columns {shown} hold"
        rows = "scored truth row (--where)" if selected else "truth row"
        warnings.warn(
            f"prediction file {pred.path!r}: {what} whole numbers, and no {rows} has it as a label: scored as a "
            f"class, it may outrank real classes and lower lwlrap. If it is not a class (a fold or id column), drop "
            f"it, or pass --classes FILE to name the classes.",
            UserWarning,
            stacklevel=2,
        )


def _reorder(pred: Predictions, rows: np.ndarray, first: Predictions, first_rows: np.ndarray) -> np.ndarray:
    """``pred``'s scores of its ``rows`` in ``first``'s row and column order (the same fnames, by :func:`align`)."""
    columns = {name: column for column, name in enumerate(pred.classes)}
    missing = [name for name in first.classes if name not in columns]
    if missing or len(pred.classes) != len(first.classes):
        extra = sorted(set(pred.classes).difference(first.classes))
        what = f"lacks {missing[0]!r}" if missing else f"has the column {extra[0]!r} that {first.path!r} lacks"
        raise CsvFormatError(
            f"prediction files {first.path!r} and {pred.path!r} must score the same classes, but {pred.path!r} "
            f"{what}: write both with one set of class columns (or drop a column that is not a class)."
        )
    position = {pred.fnames[row]: row for row in rows.tolist()}
    row_order = [position[first.fnames[row]] for row in first_rows.tolist()]
    return pred.scores[np.ix_(row_order, [columns[name] for name in first.classes])]


def _swapped_hint(paths: Sequence[str], texts: Sequence[str]) -> str:
    """When the truth file reads as a submission and another file as a truth: a hint that they are swapped."""
    try:
        read_predictions(paths[0], text=texts[0])
    except CsvFormatError:
        return ""
    for path, text in zip(paths[1:], texts[1:]):
        try:
            read_truth(path, text=text)
        except CommandError:
            continue
        usage = "score TRUTH.csv PRED.csv" if len(paths) == 2 else "compare TRUTH.csv A.csv B.csv"
        return (
            f" The files look swapped: {file_name(paths[0])!r} reads as a submission and {file_name(path)!r} as a "
            f"ground truth; the truth file comes first (torch-lwlrap {usage})."
        )
    return ""


def input_options(
    ties: str, where: Sequence[Tuple[str, str]], classes_path: Optional[str], unknown: Optional[str]
) -> Dict[str, object]:
    """The input options as ``--json`` reports them under ``"options"`` (None: not given).

    Example:
        >>> input_options("expected", [("usage", "Public")], None, " -1")
        {'ties': 'expected', 'where': {'usage': 'Public'}, 'classes': None, 'unknown': '-1'}
    """
    return {
        "ties": ties,
        "where": dict(where) if where else None,
        "classes": classes_path,
        "unknown": None if unknown is None else unknown.strip(),
    }
