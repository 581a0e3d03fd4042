"""Option values every layer shares, kept free of torch so the command line can parse arguments without it."""

import numbers
from typing import Optional

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


def whole_number(value) -> Optional[int]:
    """``value`` as a Python int where it is an integer argument: an ``int`` or a numpy integer (``np.int64(10)``
    from a config or an array), not a bool; else None, for the caller's error."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)
