"""Poisson(1) weights from uniform 32-bit integers: the thresholds shared by the torch and compiled bootstraps.

A value ``u`` in ``[0, 2**32)`` becomes the weight ``k`` when ``CDF(k - 1) <= u / 2**32 < CDF(k)``: the number of
thresholds at or below ``u``. Pure Python, so the compiled kernel and the torch code read the same constants.
"""

from __future__ import annotations

import math
from typing import Tuple

#: Weights above this are never drawn (their probability is below 2**-32).
POISSON_MAX = 16


def _poisson_thresholds() -> Tuple[int, ...]:
    thresholds, cdf, term = [], 0.0, math.exp(-1.0)
    for k in range(POISSON_MAX):
        cdf += term
        term /= k + 1
        thresholds.append(min(round(cdf * 2**32), 2**32))
    return tuple(thresholds)


#: ``POISSON_MAX`` thresholds in ``[0, 2**32]``.
POISSON_THRESHOLDS = _poisson_thresholds()
