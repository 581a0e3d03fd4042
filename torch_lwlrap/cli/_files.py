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

from torch_lwlrap.cli._pandas_index import (
    PANDAS_INDEX_NAME,
    counts_up,
    fnames_in_index_hint,
    index_column_message,
    index_column_problem,
)

__all__ = [
    "CHALLENGE_HEADER",
    "CommandError",
    "CsvFormatError",
    "Predictions",
    "Truth",
    "check_unknown",
    "read_predictions",
    "read_text",
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


def _number(text: str) -> float:
    """``float(text)`` for a number as CSV writers write it: Python's own ``float`` also reads ``1_0`` as 10 and
    digits of other scripts (fullwidth ``０.8``), which pandas and numpy refuse; so does this (ValueError)."""
    if "_" in text or not text.isascii():
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def _counts_up_text(texts: Sequence[str]) -> bool:
    try:
        return counts_up(np.array([_number(text) for text in texts]))
    except ValueError:
        return False


def _index_column_error(role: str, path: str, position: int, name: str, texts: Sequence[str]) -> CsvFormatError:
    """:func:`~torch_lwlrap.cli._pandas_index.index_column_message` as the error, the column's texts read."""
    return CsvFormatError(index_column_message(role, path, position, name, texts, not texts or _counts_up_text(texts)))


def _swallows_rows(field: str, width: int) -> bool:
    """Whether a field holds whole rows after a line break (as many commas as a row of ``width`` fields has): the
    field's quote was never closed and took the rows below it in. A quoted line break in a value is allowed."""
    return width > 1 and any(line.count(",") >= width - 1 for line in field.splitlines()[1:])


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
        start = data.rfind(b"\n", 0, err.start) + 1
        line = data.count(b"\n", 0, err.start) + 1
        column = len(data[start:err.start].decode("utf-8", "replace")) + 1
        fname = data[start:].split(b"\n", 1)[0].split(b",", 1)[0].decode("utf-8", "replace").strip('"\r')
        where = f", line {line}" + (f" (fname {fname!r})" if line > 1 and fname else "")
        raise CsvFormatError(
            f"{role} file {name!r}{where} is not UTF-8 text ({err.reason} at byte {err.start}, character {column} "
            f"of the line): write the file as UTF-8, e.g. df.to_csv(path, index=False, encoding='utf-8')."
        ) from None


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
        and all(name and not PANDAS_INDEX_NAME.fullmatch(name) for name in header)
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
    end = 0  # the line the previous record ended on: a record starts on the line after it
    try:
        for fields in reader:
            start, end = end + 1, reader.line_num
            if not fields or all(not field.strip() for field in fields):
                continue  # blank line
            if header is not None and any(_swallows_rows(field, len(header)) for field in fields):
                raise CsvFormatError(
                    f"{role} file {_where(path, start)}: a quote opened on this line is never closed, so the rows "
                    f"below it were read into one field: close it (a.wav,\"Bark,Dog\"), or remove it."
                )
            if header is None:
                header = [field.strip() for field in fields]
            else:
                rows.append((start, fields))
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
            f"'fname,labels' or 'fname,<class>,...', but got {shown!r}.{fnames_in_index_hint(header)}"
        )
    if not rows:
        raise CsvFormatError(f"{role} file {path!r} has a header but no rows.")
    seen: Dict[str, int] = {}
    for position, name in enumerate(header):
        if not name or PANDAS_INDEX_NAME.fullmatch(name):
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
            if any(field[:1].isspace() and field.lstrip().startswith('"') for field in fields):
                hint = (
                    ' (a space after a comma keeps the quote after it from opening a field: remove the space, e.g. '
                    'a.wav,"Bark,Dog")'
                )
            elif _is_challenge(header) and len(fields) > len(header):
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
                value = _number(_BOOLEANS.get(field_text.lower(), field_text))
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
                layout = _layout_hint(header, name)
                # a name where a 0 or 1 was due, in a two-column file: the layout is what to fix, not --unknown
                unknown_hint = "" if layout and _unknown_number(field_text) is None else _unknown_hint(
                    field_text, unknown
                )
                raise CsvFormatError(
                    f"truth file {_where(path, line, fields[fname_at].strip())}, column {name!r}: the value "
                    f"{field_text!r} is not 0 or 1{unknown_hint}.{layout}"
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


#: A wide truth table's values written by pandas from a bool column (True/False), read as 1/0.
_BOOLEANS = {"true": "1", "false": "0"}


def _layout_hint(header: Sequence[str], column: str) -> str:
    """For a two-column truth file read as a wide table (its second column is not named ``labels``): how to name it
    for the challenge layout."""
    if len(header) != 2:
        return ""
    return (
        f" A truth file of two columns is read as the challenge layout only when they are named 'fname' and "
        f"'labels' (comma-separated class names); rename {column!r} to 'labels' if it lists class names."
    )


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


def read_predictions(
    path: str, *, text: Optional[str] = None, truth_classes: Collection[str] = ()
) -> Predictions:
    """Read a submission CSV: header ``fname,<class>,...`` and one real score per class and row.

    Scores may be any real number (probabilities, logits, ``inf``); they are ranked as given. Empty, non-numeric
    and NaN scores are rejected.

    Args:
        path: the CSV file (``.gz``: gzip-compressed; ``-``: standard input).
        text: the file's text when already read (:func:`read_text`).
        truth_classes: the classes the truth names: a column named ``index`` is scored as a class when one of them
            is ``index``, else refused as the leftover of pandas' ``reset_index()`` where it holds row numbers.

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
        _check_no_index_column(scores, header[1:], header, path, truth_classes)
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
                value = _number(field_text)
            except ValueError:
                problem = "is empty" if not field_text else f"{field_text!r} is not a number"
                if header[position].strip().lower() == "labels":
                    problem += (
                        " (this file reads like a truth file of fname and labels: give a prediction file here, "
                        "after the truth file)"
                    )
                elif not field_text:
                    problem += " (pandas writes a NaN score so): fill or drop the missing scores before writing"
                elif re.fullmatch(r"[-+]?\d+,\d+", field_text):
                    problem += " (a decimal comma: write the file with '.' as the decimal point, pandas' default)"
                raise CsvFormatError(
                    f"prediction file {_where(path, line, fname)}, column {header[position]!r}: the score "
                    f"{problem}."
                ) from None
            if math.isnan(value):
                raise CsvFormatError(
                    f"prediction file {_where(path, line, fname)}, column {header[position]!r}: the score is NaN, "
                    f"which cannot be ranked: find where the model gave NaN, or fill the missing scores before "
                    f"writing."
                )
            scores[row, column] = value
    _check_no_index_column(scores, classes, header, path, truth_classes)
    return Predictions(fnames, classes, scores, path)



def _check_no_index_column(
    scores: np.ndarray, classes: Sequence[str], header: Sequence[str], path: str, known: Collection[str] = ()
) -> None:
    """:func:`~torch_lwlrap.cli._pandas_index.index_column_problem`, raised."""
    problem = index_column_problem(scores, classes, header, path, known)
    if problem is not None:
        raise CsvFormatError(problem)
