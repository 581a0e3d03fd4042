"""The files matched to each other: the truth rows a ``--where`` selects, each submission aligned to them by
``fname`` and class name, and the vocabulary of ``--classes`` checked against both. Everything here names the file,
line or column at fault, as :mod:`torch_lwlrap.cli._files` does for one file.
"""

from __future__ import annotations

import csv
import unicodedata
from typing import Collection, Dict, List, Sequence, Tuple

import numpy as np

from torch_lwlrap.cli._files import (
    UNKNOWN_TARGET,
    CommandError,
    CsvFormatError,
    Predictions,
    Truth,
    _where,
)
__all__ = ["align", "check_vocabulary", "read_classes", "select_rows"]


def _listed(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


#: What a missing class or label is told when nothing more specific explains it.
_NEED_EVERY_CLASS = "the predictions need a column for every class (a class the model does not predict scores 0)"


def _label_hint(name: str, columns: Collection[str]) -> str:
    """Why a truth's label or class ``name`` may miss the prediction columns ``columns``, with the fix: a quote
    read into it (a space before a quoted field), written as a Python list, joined by another separator, in other
    letter case or in another Unicode normalization form; else that every class needs a column."""
    if name.startswith('"'):
        return (
            "the label holds a quote: a space after the comma before it keeps the quote from opening a field; "
            "remove the space (a.wav,\"Bark,Dog\")"
        )
    if name.startswith(("['", '["')):
        return (
            "the labels field reads like a Python list (pandas writes a list so): write each row's labels joined "
            "by commas, df['labels'] = df['labels'].str.join(',') on the list column (on one read back from a "
            "CSV, parse it first: df['labels'].apply(ast.literal_eval).str.join(','))"
        )
    for separator in (";", "|", " "):
        parts = [part.strip() for part in name.split(separator) if part.strip()]
        if len(parts) > 1 and all(part in columns for part in parts):
            return f"the labels look separated by {separator!r}: separate a row's labels by commas (a.wav,\"Bark,Dog\")"
    cased = [column for column in columns if column.lower() == name.lower()]
    if cased:
        return f"the predictions have {cased[0]!r}, which differs in letter case (labels are matched exactly)"
    form = unicodedata.normalize("NFC", name)
    same = [column for column in columns if unicodedata.normalize("NFC", column) == form]
    if same:
        return (
            f"the predictions have {same[0]!r}, which looks the same but is written with other Unicode code points "
            f"(composed and decomposed accents): write both files in one form, e.g. unicodedata.normalize('NFC', name)"
        )
    return _NEED_EVERY_CLASS


def select_rows(truth: Truth, where: Sequence[Tuple[str, str]]) -> Truth:
    """The truth rows whose metadata columns hold the given values (all must hold), e.g. ``[("usage", "Public")]``.

    Raises:
        CommandError: the truth has no such metadata column, or the conditions select no row.

    Example:
        >>> truth = Truth(["a.wav", "b.wav"], [["Bark"], ["Cat"]], None, "challenge", "t.csv", [2, 3],
        ...               {"usage": ["Public", "Private"]})
        >>> select_rows(truth, [("usage", "Private")]).fnames
        ['b.wav']
    """
    if not where:
        return truth
    shown = " ".join(f"--where {column}={value}" for column, value in where)
    if not truth.metadata:
        layout = "a wide 0/1 table" if truth.layout == "wide" else "fname,labels only"
        raise CommandError(
            f"{shown}: truth file {truth.path!r} has no metadata column to select by ({layout}); --where takes a "
            f"column of the challenge layout besides fname and labels, such as usage in fname,labels,usage,..."
        )
    keep = list(range(len(truth.fnames)))
    for column, value in where:
        if column not in truth.metadata:
            raise CommandError(
                f"--where {column}={value}: truth file {truth.path!r} has no metadata column {column!r}; its "
                f"metadata columns are {_listed(list(truth.metadata))}."
            )
        values = truth.metadata[column]
        if value not in values:
            present = sorted(set(values))
            raise CommandError(
                f"--where {column}={value} selects no row: column {column!r} of truth file {truth.path!r} holds "
                f"{_listed(present)} (values are matched exactly, case included)."
            )
        keep = [row for row in keep if values[row] == value]
    if not keep:
        raise CommandError(f"{shown}: no truth row of {truth.path!r} meets all these conditions together.")
    return Truth(
        [truth.fnames[row] for row in keep],
        [truth.labels[row] for row in keep],
        truth.classes,
        truth.layout,
        truth.path,
        [truth.lines[row] for row in keep],
        {name: [values[row] for row in keep] for name, values in truth.metadata.items()},
        [truth.unknown[row] for row in keep] if truth.unknown else [],
    )


def _selection_hint(truth: Truth, pred: Predictions, unselected: Collection[str]) -> str:
    """Where the prediction rows are exactly the truth rows of one value of a metadata column (a public-leaderboard
    submission against the whole test set): the ``--where`` that scores them."""
    if unselected:
        return ""
    scored = set(pred.fnames)
    for column, values in truth.metadata.items():
        kinds = set(values)
        if len(kinds) > 20:  # an id or a license per row, not a split
            continue
        for value in sorted(kinds):
            if {f for f, v in zip(truth.fnames, values) if v == value} == scored:
                return f": it scores the truth rows of {column}={value} alone; pass --where {column}={value}"
    return ""


def align(truth: Truth, pred: Predictions, *, unselected: Collection[str] = ()) -> Tuple[np.ndarray, np.ndarray]:
    """Target ``(rows, classes)`` in the prediction's row and column order, and the prediction rows it covers: 1 for
    a positive label, 0 for a negative, :data:`UNKNOWN_TARGET` for an unknown one (:attr:`Truth.unknown`).

    Every truth fname must be a prediction row, and every prediction fname a truth row, except the fnames in
    ``unselected`` (truth rows left out by :func:`select_rows`), whose prediction rows are left out.
    """
    pred_rows = {fname: row for row, fname in enumerate(pred.fnames)}
    truth_fnames = set(truth.fnames)
    for fname, line in zip(truth.fnames, truth.lines):
        if fname not in pred_rows:
            missing = sum(name not in pred_rows for name in truth.fnames)
            more = f" (and {missing - 1} more of its {len(truth.fnames)} fnames)" if missing > 1 else ""
            # No prediction fname in the truth points to fnames written another way (without .wav, say): show one.
            unlike = bool(pred.fnames) and not any(name in truth_fnames for name in pred.fnames)
            example = f"; its fnames read like {pred.fnames[0]!r}" if unlike else ""
            cased = [name for name in pred.fnames if name.lower() == fname.lower()]
            if cased:  # the same name in other letter case: fnames are matched exactly
                example = f"; it has {cased[0]!r}, which differs in letter case (fnames are matched exactly)"
            raise CsvFormatError(
                f"fname {fname!r} (truth file {truth.path!r}, line {line}){more} is missing from prediction file "
                f"{pred.path!r}{example}{_selection_hint(truth, pred, unselected)}."
            )
    kept = []
    for row, fname in enumerate(pred.fnames):
        if fname in truth_fnames:
            kept.append(row)
        elif fname not in unselected:
            extra = sum(name not in truth_fnames and name not in unselected for name in pred.fnames)
            more = f" (and {extra - 1} more of its {len(pred.fnames)} fnames)" if extra > 1 else ""
            raise CsvFormatError(
                f"fname {fname!r} of prediction file {pred.path!r}{more} is missing from truth file {truth.path!r}."
            )
    kept_rows = np.array(kept, dtype=np.int64)
    position = {fname: at for at, fname in enumerate(pred.fnames[row] for row in kept)}
    columns = {name: column for column, name in enumerate(pred.classes)}
    if truth.classes is not None:
        for name in truth.classes:
            if name not in columns:
                raise CsvFormatError(
                    f"class column {name!r} of truth file {truth.path!r} is not a column of prediction file "
                    f"{pred.path!r}: {_label_hint(name, columns)}."
                )
    target = np.zeros((len(kept), len(pred.classes)), dtype=np.int8)
    for fname, line, labels in zip(truth.fnames, truth.lines, truth.labels):
        row = position[fname]
        for name in labels:
            if name not in columns:
                raise CsvFormatError(
                    f"truth file {_where(truth.path, line, fname)}: label {name!r} is not a column of prediction "
                    f"file {pred.path!r}: {_label_hint(name, columns)}."
                )
            target[row, columns[name]] = 1
    for fname, names in zip(truth.fnames, truth.unknown):
        for name in names:
            target[position[fname], columns[name]] = UNKNOWN_TARGET
    return target, kept_rows


def read_classes(path: str) -> List[str]:
    """Read a class vocabulary: one class name a line, or the challenge's ``index,label[,mid]`` CSV.

    A name that holds a comma is quoted (``"Bark, dog"``). The vocabulary CSV may start with a header line
    (``index,label,mid``); its first field is the class's integer index, its second the name.

    Raises:
        CommandError: a missing or unreadable file, a line of neither form, an empty or duplicated name.

    Example:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "vocabulary.csv")
        >>> with open(path, "w") as f:
        ...     _ = f.write("0,Accordion,/m/0mkg\\n1,Bark,/m/05tny_\\n")
        >>> read_classes(path)
        ['Accordion', 'Bark']
    """
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            reader = csv.reader(handle)
            rows = [(reader.line_num, fields) for fields in reader if any(field.strip() for field in fields)]
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        reason = {FileNotFoundError: "does not exist", IsADirectoryError: "is a directory, not a file"}.get(
            type(err), f"cannot be read: {getattr(err, 'strerror', None) or err}"
        )
        raise CommandError(f"--classes: classes file {path!r} {reason}.") from None
    if not rows:
        raise CommandError(f"--classes: classes file {path!r} is empty: expected one class name a line.")

    def is_index(text: str) -> bool:
        return text.strip().isdigit()

    first = rows[0][1]
    if len(rows) > 1 and len(first) in (2, 3) and not is_index(first[0]) and is_index(rows[1][1][0]):
        rows = rows[1:]  # the vocabulary CSV's header
    vocabulary = all(len(fields) in (2, 3) and is_index(fields[0]) for _, fields in rows)
    names: List[str] = []
    first_line: Dict[str, int] = {}
    for line, fields in rows:
        if not vocabulary and len(fields) != 1:
            raise CommandError(
                f"--classes: classes file {path!r}, line {line}: {len(fields)} fields; expected one class name a "
                f"line (quote a name that holds a comma) or the vocabulary CSV 'index,label[,mid]'."
            )
        name = (fields[1] if vocabulary else fields[0]).strip()
        if not name:
            raise CommandError(f"--classes: classes file {path!r}, line {line}: the class name is empty.")
        if name in first_line:
            raise CommandError(
                f"--classes: classes file {path!r}, line {line}: class {name!r} is listed twice (first on line "
                f"{first_line[name]})."
            )
        first_line[name] = line
        names.append(name)
    return names


def check_vocabulary(classes: Sequence[str], classes_path: str, truth: Truth, pred: Predictions) -> None:
    """The prediction's columns must be exactly the vocabulary's classes (in any order), and so must the truth's.

    Raises:
        CommandError: a prediction column, a wide truth column or a truth label outside the vocabulary, or a
            vocabulary class that is not a prediction column.
    """
    vocabulary = set(classes)
    outside = [name for name in pred.classes if name not in vocabulary]
    if outside:
        raise CommandError(
            f"{len(outside)} class column(s) of prediction file {pred.path!r} are not in the vocabulary "
            f"{classes_path!r} ({len(classes)} classes): {_listed(outside)}; fix their names or drop the columns."
        )
    columns = set(pred.classes)
    missing = [name for name in classes if name not in columns]
    if missing:
        raise CommandError(
            f"{len(missing)} class(es) of the vocabulary {classes_path!r} are not columns of prediction file "
            f"{pred.path!r}: {_listed(missing)}; a submission scores every class."
        )
    if truth.classes is not None:
        outside = [name for name in truth.classes if name not in vocabulary]
        if outside:
            raise CommandError(
                f"{len(outside)} class column(s) of truth file {truth.path!r} are not in the vocabulary "
                f"{classes_path!r}: {_listed(outside)}."
            )
    for fname, line, labels in zip(truth.fnames, truth.lines, truth.labels):
        for name in labels:
            if name not in vocabulary:
                raise CommandError(
                    f"truth file {_where(truth.path, line, fname)}: label {name!r} is not in the vocabulary "
                    f"{classes_path!r}."
                )
