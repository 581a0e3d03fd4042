"""Reading the command line's CSV files: the ground truth, the submission, and matching their rows and columns.

A bad file raises :class:`CsvFormatError` whose one-line message names the file, the line, the ``fname`` and/or
the column at fault; :func:`torch_lwlrap.cli.main` prints it and exits with status 2.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
import re
import sys
import zlib
from dataclasses import dataclass, field
from typing import Callable, Collection, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = [
    "CHALLENGE_HEADER",
    "CommandError",
    "CsvFormatError",
    "Predictions",
    "Truth",
    "align",
    "check_unknown",
    "check_vocabulary",
    "read_classes",
    "read_predictions",
    "read_text",
    "read_truth",
    "select_rows",
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
        metadata: in the challenge layout, the columns other than ``fname`` and ``labels`` (``usage``,
            ``license``, FSD50K's ``split``, ...), name to the stripped value of each row, in file order.
        unknown: in a wide table read with ``unknown=VALUE``, for each row the classes whose value is ``VALUE``
            (unknown labels: neither positive nor ranked); empty when no row has one.
    """

    fnames: List[str]
    labels: List[List[str]]
    classes: Optional[List[str]]
    layout: str
    path: str
    lines: List[int]
    metadata: Dict[str, List[str]] = field(default_factory=dict)
    unknown: List[List[str]] = field(default_factory=list)


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
    return all(name in header for name in CHALLENGE_HEADER)


_PANDAS_INDEX_NAME = re.compile(r"Unnamed: \d+")
PANDAS_INDEX_FIX = "write the file with to_csv(path, index=False), or drop the column"


def counts_up(values: np.ndarray) -> bool:
    """Whether ``values`` are exactly 0, 1, 2, ..., N-1 (N >= 2): the default index pandas writes with to_csv."""
    return (
        values.size >= 2
        and values[0] == 0
        and values[-1] == values.size - 1
        and bool(np.all(np.diff(values) == 1))
    )


def _counts_up_text(texts: Sequence[str]) -> bool:
    try:
        return counts_up(np.array([float(text) for text in texts]))
    except ValueError:
        return False


def _index_column_error(role: str, path: str, position: int, name: str, texts: Sequence[str]) -> CsvFormatError:
    named = f"({name!r})" if name else "(no name)"
    what = "holds the row numbers 0, 1, 2, ..." if not texts or _counts_up_text(texts) else "has no name"
    return CsvFormatError(
        f"{role} file {path!r}: column {position + 1} {named} {what}: it is the index pandas writes by default, "
        f"not data; {PANDAS_INDEX_FIX}."
    )


def _where(path: str, line: int, fname: Optional[str] = None) -> str:
    return f"{path!r}, line {line}" + (f" (fname {fname!r})" if fname is not None else "")


#: The target value of an unknown label (``--unknown``): the ``ignore_index`` the scoring functions are given.
UNKNOWN_TARGET = -1
STDIN = "-"
STDIN_NAME = "<stdin>"
GZIP_MAGIC = b"\x1f\x8b"
# Compressions pandas reads by suffix that this reader does not: told apart by their first bytes.
_OTHER_COMPRESSIONS = {b"PK\x03\x04": "zip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"\x28\xb5\x2f\xfd": "zstd"}


def file_name(path: str) -> str:
    """The name messages give a file: ``<stdin>`` for ``-``."""
    return STDIN_NAME if path == STDIN else path


def read_text(path: str, role: str) -> str:
    """The text of a CSV file: ``-`` reads standard input; a gzip file (``.gz`` or gzip's first bytes) is
    decompressed, as pandas does for ``df.to_csv("x.csv.gz")``; UTF-8 with or without a BOM.

    Raises:
        CsvFormatError: a missing, unreadable, corrupt-gzip or non-UTF-8 file, or a terminal on standard input.

    Example:
        >>> import gzip, os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "truth.csv.gz")
        >>> with gzip.open(path, "wt") as f:
        ...     _ = f.write("fname,labels\\na.wav,Bark\\n")
        >>> read_text(path, "truth")
        'fname,labels\\na.wav,Bark\\n'
    """
    name = file_name(path)
    if path == STDIN:
        if sys.stdin is None or sys.stdin.isatty():
            raise CsvFormatError(
                f"{role} file '-' reads standard input, which is a terminal: pipe the file in, e.g. "
                f"'cat {role}.csv | torch-lwlrap score ...' with '-' in its place."
            )
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
    else:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            raise CsvFormatError(f"{role} file {name!r} does not exist.") from None
        except IsADirectoryError:
            raise CsvFormatError(f"{role} file {name!r} is a directory, not a CSV file.") from None
        except OSError as err:
            raise CsvFormatError(f"{role} file {name!r} cannot be read: {err.strerror or err}.") from None
    if path.endswith(".gz") and not data.startswith(GZIP_MAGIC):
        raise CsvFormatError(
            f"{role} file {name!r} is named .gz but is not gzip-compressed (it does not start with gzip's bytes): "
            f"rename it without .gz, or compress it with gzip."
        )
    if data.startswith(GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise CsvFormatError(
                f"{role} file {name!r} is not a complete gzip file ({err}): write it again, e.g. "
                f"df.to_csv('{role}.csv.gz', index=False), or give the uncompressed CSV."
            ) from None
    else:
        for magic, kind in _OTHER_COMPRESSIONS.items():
            if data.startswith(magic):
                raise CsvFormatError(
                    f"{role} file {name!r} is {kind}-compressed: torch-lwlrap reads plain or gzip-compressed CSV; "
                    f"decompress it, or write it with df.to_csv('{role}.csv.gz', index=False)."
                )
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CsvFormatError(f"{role} file {name!r} is not UTF-8 text ({err.reason} at byte {err.start}).") from None


def _read_plain_table(
    text: str, *, accept: Callable[[List[str]], bool]
) -> Optional[Tuple[List[str], List[str], np.ndarray]]:
    """Header, fnames and values ``(rows, columns after fname)`` of a plain numeric table, parsed by numpy's
    compiled reader (about 20 times faster than the csv module and ``float``, and to the same bits).

    Plain: ``fname`` first, then numbers only, no quote in any row, no blank line, no NaN, a sound header that
    ``accept`` takes. Anything else returns None, and the precise line-by-line reader (:func:`_read_rows`) reads
    the file instead, naming any error's file, line, fname and column exactly.
    """
    if "\r" in text:  # as a file opened in text mode reads it
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    header_line, _, body = text.partition("\n")
    if not body or '"' in body:
        return None
    try:
        header = [name.strip() for name in next(csv.reader([header_line]))]
    except (csv.Error, StopIteration):
        return None
    plain_header = (
        len(header) >= 2
        and header[0] == "fname"
        and len(set(header)) == len(header)
        and all(name and not _PANDAS_INDEX_NAME.fullmatch(name) for name in header)
    )
    if not plain_header or not accept(header):
        return None
    lines = body.split("\n")
    if not lines[-1]:
        lines.pop()
    num_values = len(header) - 1
    # Every row has at least num_values commas (numpy checks the columns it reads), so this count makes it exact.
    if body.count(",") != len(lines) * num_values:
        return None
    fnames = [line[: line.find(",")].strip() for line in lines]
    if "" in fnames or len(set(fnames)) != len(fnames):
        return None
    try:
        values = np.loadtxt(
            lines, dtype=np.float64, delimiter=",", comments=None, usecols=range(1, num_values + 1), ndmin=2
        )
    except ValueError:
        return None
    if values.shape != (len(lines), num_values) or np.isnan(values).any():
        return None
    return header, fnames, values


_SEPARATORS = {";": "';'", "\t": "tabs ('\\t')", "|": "'|'"}


def _other_separator(header: Sequence[str]) -> Optional[str]:
    """How the header is separated when it is by another separator than a comma (``fname;a;b``), else None."""
    line = ",".join(header)
    for separator, name in _SEPARATORS.items():
        if separator in line and "fname" in (field.strip().strip('"') for field in line.split(separator)):
            return name
    return None


def _read_rows(text: str, path: str, role: str) -> Tuple[List[str], List[Tuple[int, List[str]]]]:
    """Header (stripped names) and ``(line, fields)`` of each non-blank row of ``text`` (the file ``path``);
    checks header and field counts."""
    reader = csv.reader(io.StringIO(text, newline=""))
    header: Optional[List[str]] = None
    rows: List[Tuple[int, List[str]]] = []
    try:
        for fields in reader:
            if not fields or all(not field.strip() for field in fields):
                continue  # blank line
            if header is None:
                header = [field.strip() for field in fields]
            else:
                rows.append((reader.line_num, fields))
    except csv.Error as err:
        raise CsvFormatError(f"{role} file {path!r} is not valid CSV: {err}.") from None

    if header is None:
        raise CsvFormatError(f"{role} file {path!r} is empty: expected a header line and one row per fname.")
    if "fname" not in header:
        separator = _other_separator(header)
        if separator is not None:
            raise CsvFormatError(
                f"{role} file {path!r} looks separated by {separator}, but torch-lwlrap reads comma-separated files: "
                f"write it with df.to_csv(path, index=False) (without sep=), with '.' as the decimal point."
            )
        shown = ",".join(header)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        raise CsvFormatError(
            f"{role} file {path!r} has no 'fname' column: its first line must be a header such as "
            f"'fname,labels' or 'fname,<class>,...', but got {shown!r}."
        )
    if not rows:
        raise CsvFormatError(f"{role} file {path!r} has a header but no rows.")
    seen: Dict[str, int] = {}
    for position, name in enumerate(header):
        if not name or _PANDAS_INDEX_NAME.fullmatch(name):
            texts = [fields[position].strip() if position < len(fields) else "" for _, fields in rows]
            raise _index_column_error(role, path, position, name, texts)
        if name in seen:
            raise CsvFormatError(f"{role} file {path!r}: column {name!r} appears twice in the header.")
        seen[name] = position

    fname_at = header.index("fname")
    first_line: Dict[str, int] = {}
    for line, fields in rows:
        fname = fields[fname_at].strip() if fname_at < len(fields) else None
        if len(fields) != len(header):
            hint = ""
            if _is_challenge(header) and len(fields) > len(header):
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


def read_truth(path: str, *, unknown: Optional[str] = None, text: Optional[str] = None) -> Truth:
    """Read a ground-truth CSV: challenge layout (``fname,labels``) or a wide 0/1 table (``fname,<class>,...``).

    The layout is told by the header: a header with both ``fname`` and ``labels`` columns is the challenge layout,
    anything else with an ``fname`` column is a wide table. In the challenge layout, ``labels`` holds the positive
    class names comma-joined (quoted when more than one); an empty field means no positive label. Its other
    columns are metadata, not scored: the official test labels' ``usage,freesound_id,license`` and FSD50K's
    ``mids,split`` (see :attr:`Truth.metadata`).

    Args:
        path: the CSV file (``.gz``: gzip-compressed; ``-``: standard input).
        unknown: in a wide table, the value marking an unknown label (``"-1"``), compared as a number when it is
            one (``-1.0`` is ``-1``), else as text (``"?"``, ``""``); such entries are listed in
            :attr:`Truth.unknown`. It must not be 0 or 1 (see :func:`check_unknown`).
        text: the file's text when already read (:func:`read_text`).

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
    if text is None:
        text = read_text(path, "truth")
    path = file_name(path)
    is_unknown = _unknown_matcher(unknown)
    plain = _read_plain_table(text, accept=lambda header: not _is_challenge(header))
    mark = None if unknown is None else _unknown_number(unknown)
    if plain is not None and np.isin(plain[2], (0.0, 1.0) if mark is None else (0.0, 1.0, mark)).all():
        header, fnames, values = plain
        classes = header[1:]
        labels = [[classes[j] for j in np.flatnonzero(row == 1.0).tolist()] for row in values]
        unknown_labels = []
        if mark is not None and (values == mark).any():
            unknown_labels = [[classes[j] for j in np.flatnonzero(row == mark).tolist()] for row in values]
        return Truth(fnames, labels, classes, "wide", path, list(range(2, len(fnames) + 2)), {}, unknown_labels)

    header, rows = _read_rows(text, path, "truth")
    fname_at = header.index("fname")
    fnames = [fields[fname_at].strip() for _, fields in rows]
    lines = [line for line, _ in rows]
    if _is_challenge(header):
        if unknown is not None:
            raise CommandError(
                f"--unknown {unknown}: truth file {path!r} is the challenge layout (fname,labels), which lists "
                f"positive labels only; --unknown marks values of a wide truth table (fname,<class>,... of 0, 1 "
                f"and {unknown}): leave it out."
            )
        labels_at = header.index("labels")
        labels = []
        for fields in (fields for _, fields in rows):
            names = [name.strip() for name in fields[labels_at].split(",")]
            labels.append(list(dict.fromkeys(name for name in names if name)))
        metadata = {
            name: [fields[position].strip() for _, fields in rows]
            for position, name in enumerate(header)
            if name not in CHALLENGE_HEADER
        }
        return Truth(fnames, labels, None, "challenge", path, lines, metadata)

    classes = [name for name in header if name != "fname"]
    if not classes:
        raise CsvFormatError(f"truth file {path!r} has an 'fname' column but no class columns.")
    labels = []
    unknown_labels: List[List[str]] = []
    for line, fields in rows:
        positive = []
        row_unknown = []
        for position, name in enumerate(header):
            if position == fname_at:
                continue
            field_text = fields[position].strip()
            try:
                value = float(field_text)
            except ValueError:
                value = float("nan")
            if value == 1.0:
                positive.append(name)
            elif value == 0.0:
                continue
            elif is_unknown(field_text):
                row_unknown.append(name)
            else:
                if _counts_up_text([other[position].strip() for _, other in rows]):
                    raise _index_column_error("truth", path, position, name, [])
                raise CsvFormatError(
                    f"truth file {_where(path, line, fields[fname_at].strip())}, column {name!r}: the value "
                    f"{field_text!r} is not 0 or 1{_unknown_hint(field_text, unknown)}."
                )
        labels.append(positive)
        unknown_labels.append(row_unknown)
    if not any(unknown_labels):
        unknown_labels = []
    return Truth(fnames, labels, classes, "wide", path, lines, {}, unknown_labels)


def check_unknown(unknown: Optional[str]) -> Optional[str]:
    """``unknown``, stripped; CommandError when it is 0 or 1 (the labels it would hide).

    Example:
        >>> check_unknown(" -1 ")
        '-1'
    """
    if unknown is None:
        return None
    unknown = unknown.strip()
    if _unknown_number(unknown) in (0.0, 1.0):
        raise CommandError(
            f"--unknown {unknown}: 0 and 1 are the negative and positive labels; --unknown takes the other value "
            f"that marks an unknown label in the wide truth table, such as --unknown -1."
        )
    return unknown


def _unknown_number(unknown: str) -> Optional[float]:
    try:
        value = float(unknown)
    except ValueError:
        return None
    return None if math.isnan(value) else value


def _unknown_matcher(unknown: Optional[str]) -> Callable[[str], bool]:
    """Whether a stripped field holds ``unknown``: equal as numbers when ``unknown`` is one, else as text."""
    if unknown is None:
        return lambda text: False
    number = _unknown_number(unknown)
    if number is None:
        if unknown.lower() == "nan":
            return lambda text: text.lower() == "nan"
        return lambda text: text == unknown
    return lambda text: _unknown_number(text) == number


def _unknown_hint(text: str, unknown: Optional[str]) -> str:
    if unknown is not None:
        return f" or the --unknown value {unknown!r}"
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if 0.0 < value < 1.0:
        return ""  # a score, not a mark
    import shlex

    return f"; if it marks an unknown label, pass --unknown {shlex.quote(text)} (neither positive nor ranked)"


def read_predictions(path: str, *, text: Optional[str] = None) -> Predictions:
    """Read a submission CSV: header ``fname,<class>,...`` and one real score per class and row.

    Scores may be any real number (probabilities, logits, ``inf``); they are ranked as given. Empty, non-numeric
    and NaN scores are rejected.

    Args:
        path: the CSV file (``.gz``: gzip-compressed; ``-``: standard input).
        text: the file's text when already read (:func:`read_text`).

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
    if text is None:
        text = read_text(path, "prediction")
    path = file_name(path)
    plain = _read_plain_table(text, accept=lambda header: True)
    if plain is not None:
        header, fnames, scores = plain
        _check_no_index_column(scores, header[1:], header, path)
        return Predictions(fnames, header[1:], scores, path)

    header, rows = _read_rows(text, path, "prediction")
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
            field_text = fields[position].strip()
            try:
                value = float(field_text)
            except ValueError:
                problem = "is empty" if not field_text else f"{field_text!r} is not a number"
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
    _check_no_index_column(scores, classes, header, path)
    return Predictions(fnames, classes, scores, path)


def _check_no_index_column(scores: np.ndarray, classes: Sequence[str], header: Sequence[str], path: str) -> None:
    """A class column holding 0, 1, 2, ..., N-1 is a leftover index (``df.reset_index()``), not scores."""
    if scores.shape[0] < 3:
        return  # two rows scored 0 and 1 are plausible scores
    maybe = np.flatnonzero((scores[0] == 0) & (scores[-1] == scores.shape[0] - 1))
    for column in maybe.tolist():
        if counts_up(scores[:, column]):
            raise _index_column_error("prediction", path, header.index(classes[column]), classes[column], [])


def _listed(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(repr(name) for name in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


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
            raise CsvFormatError(
                f"fname {fname!r} (truth file {truth.path!r}, line {line}) is missing from prediction file "
                f"{pred.path!r}."
            )
    kept = []
    for row, fname in enumerate(pred.fnames):
        if fname in truth_fnames:
            kept.append(row)
        elif fname not in unselected:
            raise CsvFormatError(
                f"fname {fname!r} of prediction file {pred.path!r} is missing from truth file {truth.path!r}."
            )
    kept_rows = np.array(kept, dtype=np.int64)
    position = {fname: at for at, fname in enumerate(pred.fnames[row] for row in kept)}
    columns = {name: column for column, name in enumerate(pred.classes)}
    if truth.classes is not None:
        for name in truth.classes:
            if name not in columns:
                raise CsvFormatError(
                    f"class column {name!r} of truth file {truth.path!r} is not a column of prediction file "
                    f"{pred.path!r}."
                )
    target = np.zeros((len(kept), len(pred.classes)), dtype=np.int8)
    for fname, line, labels in zip(truth.fnames, truth.lines, truth.labels):
        row = position[fname]
        for name in labels:
            if name not in columns:
                raise CsvFormatError(
                    f"truth file {_where(truth.path, line, fname)}: label {name!r} is not a column of prediction "
                    f"file {pred.path!r}."
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
