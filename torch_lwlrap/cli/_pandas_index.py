"""pandas' index written into a CSV file as a column, told from data: the unnamed (or ``Unnamed: N``) column
``df.to_csv(path)`` writes first, a column counting 0, 1, 2, ..., the column ``reset_index()`` keeps, and the index
of a frame whose index has a name; each with the message that names it and the fix. Messages only: the readers of
:mod:`torch_lwlrap.cli._files` raise them with the file's error class.
"""

from __future__ import annotations

import re
from typing import Collection, Optional, Sequence

import numpy as np

__all__ = [
    "PANDAS_INDEX_FIX", "PANDAS_INDEX_NAME", "counts_up", "fnames_in_index_hint", "index_column_message",
    "index_column_problem",
]

#: The header pandas gives a column without a name when it reads a file back.
PANDAS_INDEX_NAME = re.compile(r"Unnamed: \d+")
PANDAS_INDEX_FIX = "write the file with to_csv(path, index=False), or drop the column"
RESET_INDEX_FIX = "write the file after df.reset_index(drop=True), or drop the column"

#: The names pandas gives the old index when ``reset_index()`` makes it a column.
RESET_INDEX_NAMES = ("index", "level_0")


def counts_up(values: np.ndarray) -> bool:
    """Whether ``values`` are exactly 0, 1, 2, ..., N-1 (N >= 2): the default index pandas writes with to_csv."""
    return (
        values.size >= 2
        and values[0] == 0
        and values[-1] == values.size - 1
        and bool(np.all(np.diff(values) == 1))
    )


def index_column_message(role: str, path: str, position: int, name: str, texts: Sequence[str], counting: bool) -> str:
    """The message for a column without a name (or named ``Unnamed: N``), or one that counts 0, 1, 2, ...
    (``counting``): pandas' index where it counts rows or comes first; else an extra comma, or a header that misses
    a name. ``texts``: the column's cells."""
    named = f"({name!r})" if name else "(no name)"
    where = f"{role} file {path!r}: column {position + 1} {named}"
    if counting and name in RESET_INDEX_NAMES:
        return (
            f"{where} holds the row numbers 0, 1, 2, ...: it is the index pandas' reset_index() keeps as a column, "
            f"not data; {RESET_INDEX_FIX}."
        )
    if counting:
        return (
            f"{where} holds the row numbers 0, 1, 2, ...: it is the index pandas writes by default, not data; "
            f"{PANDAS_INDEX_FIX}."
        )
    if all(not text for text in texts):
        return (
            f"{where} is empty in every row: the lines have an extra comma (at their end, or two in a row); "
            f"remove it."
        )
    if position == 0:
        return (
            f"{where} has no name in the header: if it is the index pandas writes by default, {PANDAS_INDEX_FIX}; "
            f"else name it."
        )
    return f"{where} has no name in the header: name it, or drop the column."


def fnames_in_index_hint(header: Sequence[str]) -> str:
    """For a header without ``fname``: how to write the fnames that a first column without a name may hold (a
    frame indexed by fname), or ``""``."""
    if not header[0]:
        return (
            " Its first column has no name: if it holds the fnames (a frame indexed by fname), write the file with "
            "to_csv(path, index_label='fname')."
        )
    if PANDAS_INDEX_NAME.fullmatch(header[0]):
        return (
            f" Its first column, {header[0]!r}, is the name pandas gives a column without one: if it holds the "
            f"fnames, name it, df.rename(columns={{{header[0]!r}: 'fname'}}), before writing."
        )
    return ""


def index_column_problem(
    scores: np.ndarray, classes: Sequence[str], header: Sequence[str], path: str, known: Collection[str] = ()
) -> Optional[str]:
    """The message for a class column of a submission that is pandas' index, or None: one holding 0, 1, 2, ...,
    N-1 (``df.reset_index()``); one named as ``reset_index()`` names it that holds distinct whole numbers (row
    numbers of a filtered or shuffled frame); the first column, before ``fname``, of distinct whole numbers beside
    fractional scores (the index of a frame whose index has a name). ``known``: the class names of the truth and of
    ``--classes``, never taken for an index but where they count 0..N-1."""
    if scores.shape[0] < 3:
        return None  # two rows scored 0 and 1 are plausible scores
    maybe = np.flatnonzero((scores[0] == 0) & (scores[-1] == scores.shape[0] - 1))
    for column in maybe.tolist():
        if counts_up(scores[:, column]):
            return index_column_message("prediction", path, header.index(classes[column]), classes[column], [], True)
    for column, name in enumerate(classes):
        values = scores[:, column]
        if name in RESET_INDEX_NAMES and name not in known and _distinct_whole_numbers(values):
            return (
                f"prediction file {path!r}: column {header.index(name) + 1} ({name!r}) holds distinct whole numbers, "
                f"row numbers: it is the index pandas' reset_index() keeps as a column, not scores; "
                f"{RESET_INDEX_FIX}."
            )
        if name == header[0] and name not in known and _distinct_whole_numbers(values):
            others = np.delete(scores, column, axis=1)
            if not np.all(others == np.floor(others)):
                return (
                    f"prediction file {path!r}: column 1 ({name!r}) comes before fname and holds distinct whole "
                    f"numbers beside fractional scores, and the truth (or --classes) has no class {name!r}: it is the "
                    f"index pandas writes with to_csv(path) for a frame whose index is named {name!r}, not scores; "
                    f"{PANDAS_INDEX_FIX}. If it is a class, name it in --classes FILE."
                )
    return None


def _distinct_whole_numbers(values: np.ndarray) -> bool:
    """Whether ``values`` are distinct non-negative whole numbers: the row numbers of a (filtered) frame."""
    return bool(np.all((values >= 0) & (values == np.floor(values)))) and np.unique(values).size == values.size
