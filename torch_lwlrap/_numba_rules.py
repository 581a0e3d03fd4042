"""The ``"expected"`` tie rule evaluated on the CPU in one compiled pass over the counts, with numba.

:func:`torch_lwlrap._tie_rules.label_precision` calls :func:`expected_precision` for CPU counts when the engine may
use numba (``"auto"`` or ``"numba"``, numba installed). It evaluates the closed form of :mod:`torch_lwlrap._tie_rules`
entry by entry, with its tables, its series and their constants, in the same order of operations; the torch
expressions there serve every other device. One pass and no temporaries: the torch evaluation makes about a hundred
float64 temporaries the size of the input, and on the CPU fresh memory for each costs more than the arithmetic
(page faults once the allocator has returned its memory to the system), about 1 ms per 17,000 tied positives here
against 0.1 ms.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from torch import Tensor

from torch_lwlrap import _numba_runtime
from torch_lwlrap._numba_runtime import numba, serial_kernel


def unavailable_reason(device, dtype: Optional[torch.dtype] = None) -> Optional[str]:
    """Why the compiled pass cannot evaluate the rule on counts on ``device`` (None: it can)."""
    return _numba_runtime.unavailable_reason(device)


def expected_precision(
    above: Tensor,
    above_positive: Tensor,
    tied: Tensor,
    tied_positive: Tensor,
    *,
    s_table: Tensor,
    t_table: Tensor,
    small: int,
    coefficients,
    series_terms: int,
    series_below: float,
) -> Tensor:
    """float64 ``"expected"`` precision of each entry of the integer CPU counts (four tensors of one shape):
    ``(A_p + 1) / (A + 1)`` where ``g <= 1`` (no tie; 0 labels: not a positive, masked by the caller), else the
    closed form, from the tables and constants of :mod:`torch_lwlrap._tie_rules` (its caller), which are arguments
    here: numba would otherwise freeze another module's globals into its disk cache."""
    shapes = {tuple(field.shape) for field in (above, above_positive, tied, tied_positive)}
    if len(shapes) != 1:
        raise ValueError(f"The four counts must have one shape, but got shapes {sorted(shapes)}.")
    fields = [field.reshape(-1).to(torch.int32).contiguous().numpy() for field in (above, above_positive, tied,
                                                                                  tied_positive)]
    out = torch.empty(above.shape, dtype=torch.float64, device="cpu")
    if out.numel():
        _expected_precisions(*fields, s_table.numpy(), t_table.numpy(), small, np.asarray(coefficients),
                             series_terms, series_below, out.view(-1).numpy())
    return out


if numba is not None:

    @serial_kernel
    def _tail(z2, coefficients):
        """``c(z) - 1/(2z)`` from ``z2 = 1/z^2`` (``_tie_rules._tail``)."""
        acc = z2 * coefficients[0]
        for i in range(1, coefficients.shape[0]):
            acc = (acc + coefficients[i]) * z2
        return acc

    @serial_kernel
    def _u_minus_log1p(u, terms, below):
        """``u - log1p(u)`` without cancellation (``_tie_rules._u_minus_log1p``)."""
        if u > below:
            return u - math.log1p(u)
        v = u / (2 + u)
        v2 = v * v
        series = 1.0 / (2 * (terms - 1) + 3)
        for k in range(terms - 2, -1, -1):
            series = series * v2 + 1.0 / (2 * k + 3)
        return (1 / (1 - v) - series * v) * v2 * 2

    @serial_kernel
    def _expected_precisions(above, above_positive, tied, tied_positive, s_table, t_table, small, coefficients,
                             terms, below, out):
        for e in range(out.shape[0]):
            a = np.int64(above[e])
            g = np.int64(tied[e])
            if g <= 1:
                out[e] = (above_positive[e] + 1.0) / (a + 1.0)
                continue
            # harmonic_sums: the first m terms from the tables, the other r from the series at A + m.
            m = min(max(small - a, 0), g)
            index = min(a, small) * (small + 1) + m
            s = s_table[index]
            t = t_table[index]
            r = g - m
            if r > 0:
                x = float(a + m + 1)
                rr = float(r)
                y = x + rr
                d = rr / (2 * x * y) + (_tail(1 / (x * x), coefficients) - _tail(1 / (y * y), coefficients))
                u = rr / x
                s_tail = math.log1p(u) + d
                t_tail = x * _u_minus_log1p(u, terms, below) - x * d if r > 1 else 0.0
                s = s + s_tail
                t = t + t_tail + m * s_tail
            share = (tied_positive[e] - 1.0) / max(g - 1.0, 1.0)
            out[e] = ((above_positive[e] + 1.0) * s + share * t) / g
