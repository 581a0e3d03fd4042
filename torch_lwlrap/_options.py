"""Option values every layer shares, and their checks (each error names its argument), kept free of torch so the
command line can parse arguments without it."""

import numbers
import sys
from typing import Optional, Tuple

import numpy as np

#: The tie rules of every ranking function and metric; :mod:`torch_lwlrap._tie_rules` defines them.
TIES = ("max", "index", "expected")

#: The ranking engine's paths (:mod:`torch_lwlrap._engine_config`): ``"auto"`` picks per device.
ENGINES = ("auto", "sort", "count", "numba", "triton")

#: What a sample without a positive label (or, for NDCG, whose ideal DCG is 0) adds to the retrieval metrics:
#: a score of 0, or nothing (left out of the mean).
EMPTY_TARGET = ("zero", "skip")

#: The gain functions of graded NDCG: ``2**rel - 1`` (the learning-to-rank write-up) or ``rel`` (scikit-learn).
GAINS = ("exponential", "linear")

#: The rank correlations per sample.
CORRELATIONS = ("spearman", "kendall")

#: The averages of lwlrap over classes (``None`` is read as ``"none"``).
AVERAGES = ("weighted", "macro", "none")

#: The most bootstrap replicates an interval takes: ``torch.nanquantile`` reads at most 2**24 values along the
#: replicates, and a million replicates already put the bounds' Monte Carlo error far below the interval's width.
MAX_REPLICATES = 2**24


def whole_number(value) -> Optional[int]:
    """``value`` as a Python int where it is an integer argument: an ``int``, a numpy integer (``np.int64(10)`` from
    a config or an array) or a one-element integer tensor of no dimension (``torch.tensor(10)``, as hyperparameters
    are often kept), not a bool; else None, for the caller's error."""
    torch = sys.modules.get("torch")  # a tensor exists only once torch is imported: the command line reads and checks
    if torch is not None and isinstance(value, torch.Tensor):  # its files before it imports torch
        integral = not (value.is_floating_point() or value.is_complex() or value.dtype == torch.bool)
        return int(value.item()) if value.ndim == 0 and integral else None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def check_flag(name: str, value) -> bool:
    """``value`` as a bool where it is a flag argument: ``True``, ``False`` or a numpy bool; else the error naming
    argument ``name`` (``None`` or ``0`` from a config must not switch a check off unseen)."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"Argument `{name}` must be True or False, but got {value!r}.")


def check_names(name: str, value, choices: Tuple[str, ...]) -> Tuple[str, ...]:
    """A non-empty subset of ``choices`` without repeats (one name or a sequence of names), in the order of
    ``choices``; else the error naming argument ``name``."""
    try:
        names = (value,) if isinstance(value, str) else tuple(value)
    except TypeError:  # None, a number
        names = ()
    if not names or any(item not in choices for item in names) or len(set(names)) != len(names):
        raise ValueError(
            f"Argument `{name}` must be a non-empty subset of {choices} without repeats (a name or a list of "
            f"names), but got {value!r}."
        )
    return tuple(item for item in choices if item in names)


def check_choice(name: str, value: str, choices: Tuple[str, ...]) -> str:
    """``value`` when it is one of ``choices``; else the error naming argument ``name`` and the choices."""
    if value not in choices:
        raise ValueError(f"Argument `{name}` must be one of {choices}, but got {value!r}.")
    return value


def check_empty_target(empty_target: str) -> str:
    return check_choice("empty_target", empty_target, EMPTY_TARGET)


def check_ties(ties: str) -> str:
    return check_choice("ties", ties, TIES)


def check_gain(gain: str) -> str:
    return check_choice("gain", gain, GAINS)


def check_method(method: str) -> str:
    return check_choice("method", method, CORRELATIONS)


def check_average(average: Optional[str]) -> str:
    if average is None:
        return "none"
    if average not in AVERAGES:
        raise ValueError(f"Argument `average` must be one of {AVERAGES} (or None), but got {average!r}.")
    return average


def check_num_labels(num_labels: int) -> int:
    value = whole_number(num_labels)
    if value is None or value < 1:
        raise ValueError(f"Argument `num_labels` must be a positive integer, but got {num_labels!r}.")
    return value


def check_ignore_index(ignore_index: Optional[int]) -> Optional[int]:
    if ignore_index is None:
        return None
    value = whole_number(ignore_index)
    if value is None:
        raise ValueError(f"Argument `ignore_index` must be an integer or None, but got {ignore_index!r}.")
    ignore_index = value
    if ignore_index in (0, 1):
        raise ValueError(
            f"Argument `ignore_index` must differ from the label values 0 and 1, but got {ignore_index!r}."
        )
    return _check_int64_ignore_index(ignore_index)


def _check_int64_ignore_index(ignore_index: int) -> int:
    if not -(2**63) <= ignore_index < 2**63:
        raise ValueError(
            f"Argument `ignore_index` must fit an int64 (torch compares tensors with such integers only), but got "
            f"{ignore_index!r}: mark unknown labels with -1, say."
        )
    return ignore_index


def check_k(k, *, allow_none: bool = False) -> Optional[int]:
    """``k`` as given: a positive integer below ``2**63`` (or None where allowed)."""
    if k is None and allow_none:
        return None
    value = whole_number(k)
    if value is None or value < 1:
        fix = "a positive integer (or None for every label)" if allow_none else "a positive integer"
        raise ValueError(f"Argument `k` must be {fix}, but got {k!r}.")
    if value >= 2**63:
        raise ValueError(f"Argument `k` must be below 2**63 (an int64), but got {k!r}.")
    return value


def check_graded_ignore_index(ignore_index: Optional[int]) -> Optional[int]:
    """A negative integer or None: every non-negative value is a relevance grade."""
    if ignore_index is None:
        return None
    value = whole_number(ignore_index)
    if value is None or value >= 0:
        raise ValueError(
            f"Argument `ignore_index` must be a negative integer or None for graded relevance (every non-negative "
            f"value is a relevance grade), but got {ignore_index!r}: mark unknown labels with -1, say."
        )
    return _check_int64_ignore_index(value)
