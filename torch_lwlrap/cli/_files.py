"""Reading the command line's CSV files: the ground truth, the submission, and matching their rows and columns.

A bad file raises :class:`CsvFormatError` whose one-line message names the file, the line, the ``fname`` and/or
the column at fault; :func:`torch_lwlrap.cli.main` prints it and exits with status 2.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "CHALLENGE_HEADER",
    "CommandError",
    "CsvFormatError",
    "Predictions",
    "Truth",
    "align",
    "read_predictions",
    "read_truth",
]

CHALLENGE_HEADER = ("fname", "labels")


class CommandError(ValueError):
    """An error that ends the command line with exit status 2 and its message as one line on stderr.

    Subcommands raise it (or :class:`CsvFormatError`) for anything the user must fix: a bad file, a bad option.
    """

    __module__ = "torch_lwlrap.cli"


class CsvFormatError(CommandError):
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

    __module__ = "torch_lwlrap.cli"  # its public home: tracebacks and pickles name torch_lwlrap.cli.CsvFormatError


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


def align(truth: Truth, pred: Predictions) -> np.ndarray:
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
