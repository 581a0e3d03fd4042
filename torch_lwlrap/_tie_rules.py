"""Tie rules: the precision of each positive label from its counts, in one place.

The ranking engine (:mod:`torch_lwlrap._ranking`) hands back, for each positive label of a row (ignored labels
removed from the row), six counts (:class:`LabelCounts`). With

* ``A`` labels scored strictly higher, ``A_p`` of them positive,
* ``g`` labels with exactly the same score (itself included), ``p`` of them positive,
* ``b`` of the tied labels at a lower column, ``b_p`` of them positive,

the precision of the label under each rule (:func:`label_precision`) is

* ``"max"`` (scikit-learn's): ``(A_p + p) / (A + g)``: every tied label is ranked as the group's last;
* ``"index"``: ``(A_p + b_p + 1) / (A + b + 1)``: tied labels in column order, lower column first;
* ``"expected"``: the expectation of the precision when the tied labels are put in a uniformly random order. The
  label's position ``K`` in its group is uniform on ``1..g`` and the positives ahead of it in the group are
  hypergeometric, so

  ``E = (1/g) sum_{K=1..g} (A_p + 1 + (K-1)(p-1)/(g-1)) / (A + K) = ((A_p + 1) S + (p-1)/(g-1) T) / g``

  with ``S = sum_{K=1..g} 1/(A+K) = H(A+g) - H(A)`` and ``T = sum_{K=1..g} (K-1)/(A+K) = g - (A+1) S`` (``H`` the
  harmonic numbers; ``T = 0`` for ``g = 1``). Both sums are evaluated without cancellation (:func:`harmonic_sums`),
  within about 1e-15 relative of their exact values whatever ``A`` and ``g``.

Because lwlrap and LRAP are sums of precisions over fixed counts, their expectations over tie orders are the sums of
these expectations: exact, not sampled. Without ties (``g = 1``) the three rules agree.

The closed form is written here once, in torch, for every device. On the CPU, where the engine may use numba, the
same formula with the same tables and constants is evaluated by one compiled pass over the counts
(:mod:`torch_lwlrap._numba_rules`): the torch expressions make about a hundred temporaries, which cost more than
the arithmetic there.
"""

from __future__ import annotations


import torch
from torch import Tensor

from torch_lwlrap import _dispatch, _numba_rules
from torch_lwlrap._options import TIES
from torch_lwlrap._types import LabelCounts  # noqa: F401 - the counts the rules reduce, re-exported

#: Rules that bound a sum of precisions over every order of tied scores (:func:`label_precision`): ``"best"`` puts
#: each tie group's positives first, ``"worst"`` last. Each tie group contributes independently, so the sums of these
#: precisions are the exact minimum and maximum over tie orders of any sum of precisions of whole groups (weighted
#: lwlrap, a sample's LRAP).
BOUNDS = ("best", "worst")


def label_precision(counts: LabelCounts, ties: str) -> Tensor:
    """float64 precision of each positive under ``ties`` (``"max"``, ``"index"`` or ``"expected"``; or one of
    :data:`BOUNDS`); 0 elsewhere.

    Example:
        Two positives tied at the top with a negative (``A = 0``, ``g = 3``, ``p = 2``): ``"max"`` gives each
        ``2/3``; over the 6 orders of the group, one positive scores ``1, 1, 1, 2/3, 1/2, 2/3``, ``29/36`` on average:

        >>> import torch
        >>> one = lambda v: torch.tensor([v], dtype=torch.int32)
        >>> counts = LabelCounts(torch.tensor([True]), one(0), one(0), one(3), one(2), one(0), one(0))
        >>> label_precision(counts, "max").item(), label_precision(counts, "index").item()
        (0.6666666666666666, 1.0)
        >>> abs(label_precision(counts, "expected").item() - 29 / 36) < 1e-15
        True
    """
    above = counts.above.to(torch.float64)
    above_positive = counts.above_positive.to(torch.float64)
    if ties == "max":
        precision = (above_positive + counts.tied_positive) / (above + counts.tied)
    elif ties == "index":
        precision = (above_positive + counts.tied_positive_before + 1) / (above + counts.tied_before + 1)
    elif ties == "expected":
        if _dispatch.compiled_cpu_pass("rules", counts.above.device):
            s_table, t_table = _tables(torch.device("cpu"))
            precision = _numba_rules.expected_precision(
                *counts[1:5], s_table=s_table, t_table=t_table, small=_SMALL, coefficients=_TAIL_COEFFICIENTS,
                series_terms=_SERIES_TERMS, series_below=_SERIES_BELOW,
            )
            return torch.where(counts.positive, precision, 0.0)
        precision = (above_positive + 1) / (above + 1)  # the value without a tie (g = 1)
        if precision.device.type == "cpu":
            # Most positives tie with no other label: the closed form for the others only.
            tied = (counts.tied > 1).view(-1).nonzero().squeeze(1)
            flat = [field.reshape(-1).index_select(0, tied) for field in counts[1:5]]
            precision.view(-1).index_copy_(0, tied, _expected_precision(*flat))
        else:  # no host-device sync: every entry
            precision = _expected_precision(counts.above, counts.above_positive, counts.tied, counts.tied_positive)
    elif ties in BOUNDS:
        # The group's q-th positive (q = b_p + 1, in column order) at position q of the group, or g - p + q.
        q = counts.tied_positive_before + 1
        lost = 0 if ties == "best" else counts.tied - counts.tied_positive
        precision = (above_positive + q) / (above + lost + q)
    else:
        raise ValueError(f"Argument `ties` must be one of {TIES}, but got {ties!r}.")
    return torch.where(counts.positive, precision, 0.0)


def _expected_precision(above: Tensor, above_positive: Tensor, tied: Tensor, tied_positive: Tensor) -> Tensor:
    """``((A_p + 1) S + (p-1)/(g-1) T) / g``, float64 (see the module's docstring)."""
    s, t = harmonic_sums(above, tied)
    group = tied.to(torch.float64)
    share = (tied_positive - 1).to(torch.float64) / (group - 1).clamp(min=1)
    return ((above_positive.to(torch.float64) + 1) * s + share * t) / group


# ---------------------------------------------------------------------------------------------------------------
# S(A, g) = sum_{K=1..g} 1/(A+K) and T(A, g) = sum_{K=1..g} (K-1)/(A+K), accurately.
#
# For A >= _SMALL both come from the asymptotic series of the digamma function (H(n) = psi(n+1) + gamma), written as
# differences that are computed directly: S = log1p(g/x) + D(x, y) with x = A+1, y = A+g+1 and
# D(x, y) = c(x) - c(y), c(z) = 1/(2z) + 1/(12z^2) - 1/(120z^4) + 1/(252z^6) - 1/(240z^8) + 1/(132z^10)
# (truncated below 1e-16 relative for x > 32); T = g - xS = x (u - log1p(u)) - x D(x, y) with u = g/x, where
# u - log1p(u) has its own series. For A < _SMALL, the first terms (up to A+K = _SMALL) come from tables of their sums and
# the rest from the series at A = _SMALL: every piece is a sum of positive terms, so nothing cancels.

_SMALL = 32

#: ``_tail``'s coefficients, in Horner's order; ``u - log1p(u)`` comes from a series of ``_SERIES_TERMS`` terms for
#: ``u <= _SERIES_BELOW``. Shared with the compiled CPU evaluation (:mod:`torch_lwlrap._numba_rules`).
_TAIL_COEFFICIENTS = (1 / 132, -1 / 240, 1 / 252, -1 / 120, 1 / 12)
_SERIES_TERMS = 14
_SERIES_BELOW = 0.5


_tables_on = {}


def _tables(device: torch.device):
    """``(S, T)`` tables, flat ``(_SMALL + 1)^2``: entry ``a * (_SMALL + 1) + m`` sums the terms ``K = 1..m`` after
    ``A = a`` (``a + m <= _SMALL``, else 0). Built on ``device`` itself (no copy from the host, so no host-device
    sync) and kept; each entry is a sum of at most 32 positive terms."""
    if device not in _tables_on:
        a = torch.arange(_SMALL + 1, dtype=torch.float64, device=device).unsqueeze(1)
        k = torch.arange(1, _SMALL + 2, dtype=torch.float64, device=device)
        inside = a + k <= _SMALL
        s_terms = torch.where(inside, 1 / (a + k), 0.0)
        t_terms = torch.where(inside, (k - 1) / (a + k), 0.0)
        zero = torch.zeros(_SMALL + 1, 1, dtype=torch.float64, device=device)
        # Column m holds the sum of the first m terms.
        _tables_on[device] = tuple(
            torch.cat([zero, terms.cumsum(1)[:, :-1]], 1).reshape(-1) for terms in (s_terms, t_terms)
        )
    return _tables_on[device]


def _u_minus_log1p(u: Tensor) -> Tensor:
    """``u - log1p(u)`` for ``u >= 0`` without cancellation.

    With ``v = u / (2 + u)``, ``log1p(u) = 2 atanh(v)`` and ``u = 2v / (1 - v)``, so
    ``u - log1p(u) = 2v^2 (1/(1-v) - v (1/3 + v^2/5 + v^4/7 + ...))``; the bracket is between 0.93 and 1.25 for
    ``u <= 1/2``. Larger ``u`` lose at most a factor 5 to cancellation when computed directly.
    """
    v = u / (2 + u)
    v2 = v * v
    # sum_{k>=0} v^(2k) / (2k+3) by Horner's rule, in place; 14 terms are enough for v <= 0.2.
    series = torch.full_like(v, 1.0 / (2 * (_SERIES_TERMS - 1) + 3))
    for k in range(_SERIES_TERMS - 2, -1, -1):
        series.mul_(v2).add_(1.0 / (2 * k + 3))
    small = (1 / (1 - v)).sub_(series.mul_(v)).mul_(v2).mul_(2)
    return torch.where(u <= _SERIES_BELOW, small, u - torch.log1p(u))


def _tail(z2: Tensor) -> Tensor:
    """``c(z) - 1/(2z)`` from ``z2 = 1/z^2``, by Horner's rule."""
    acc = z2 * _TAIL_COEFFICIENTS[0]  # Horner's rule, in place
    for coefficient in _TAIL_COEFFICIENTS[1:]:
        acc.add_(coefficient).mul_(z2)
    return acc


def _series_sums(x: Tensor, r: Tensor) -> tuple:
    """``(S, T)`` over ``K = 1..r`` after ``A = x - 1`` labels, ``x >= _SMALL + 1``, from the digamma series."""
    y = x + r
    # D = c(x) - c(y); its first term, the only one that matters against T's size, factored by y - x = r.
    d = r / (2 * x * y) + (_tail(1 / (x * x)) - _tail(1 / (y * y)))
    u = r / x
    log1p = torch.log1p(u)
    s = log1p + d
    if u.device.type == "cpu" and not bool((u <= _SERIES_BELOW).any()):  # no cancellation: skip the series
        t = x * (u - log1p) - x * d
    else:  # elsewhere every entry is computed alike: no host-device sync
        t = x * _u_minus_log1p(u) - x * d
    # r = 0: empty sums (the formulas give 0 up to rounding); r = 1: T = 0 exactly.
    return torch.where(r > 0, s, 0.0), torch.where(r > 1, t, 0.0)


def harmonic_sums(above: Tensor, tied: Tensor) -> tuple:
    """``(S, T)``, float64: ``S = sum_{K=1..g} 1/(A+K)`` and ``T = sum_{K=1..g} (K-1)/(A+K)`` elementwise, for
    integer tensors ``A = above >= 0`` and ``g = tied >= 0``, within about 1e-15 relative of the exact values.

    Example:
        >>> import torch
        >>> s, t = harmonic_sums(torch.tensor([0, 1000]), torch.tensor([3, 2]))
        >>> abs(s[0].item() - 11 / 6) < 1e-15, abs(t[1].item() - 1 / 1002) < 1e-18
        (True, True)
    """
    s_table, t_table = _tables(above.device)
    above = above.to(torch.int64)
    tied = tied.to(torch.int64)
    # The first m terms (A + m <= _SMALL) from the tables, the other r = g - m from the series at A + m.
    small = above.clamp(max=_SMALL)
    m = torch.minimum((_SMALL - above).clamp(min=0), tied)
    index = small * (_SMALL + 1) + m
    s_head, t_head = s_table[index], t_table[index]
    r = (tied - m).to(torch.float64)
    if above.device.type == "cpu" and not bool((r > 0).any()):  # every sum within the tables
        return s_head, t_head
    s_tail, t_tail = _series_sums((above + m + 1).to(torch.float64), r)
    # Terms K = m + k of T: (m + k - 1)/(A + m + k) = (k - 1)/(A + m + k) + m/(A + m + k).
    return s_head + s_tail, t_head + t_tail + m.to(torch.float64) * s_tail
