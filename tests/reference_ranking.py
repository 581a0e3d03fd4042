"""Naive references of the ranking metrics beside lwlrap, written from their definitions: Python loops over samples
and labels, exact fractions, no use of the library.

Each label of a sample gets a *position* in its ranking (ignored labels removed):

* ``ties="max"``: ``#{k : s_k >= s_l}``, the last position of its tie group;
* ``ties="index"``: its place in the order by descending score, lower column first among equal scores;
* ``ties="expected"``: every order of the tied labels is enumerated (each equally likely) and the sample's value is
  the mean of its values under those strict orders.

Every per-sample value is a function of the positions alone.

Beside them, the references of the rank agreement between two score tensors: scipy's ``spearmanr`` and
``kendalltau`` per row (scipy is a test extra, imported where used), and the Kendall distance at k by brute force
over the pairs of the two top-k sets' union.
"""

from __future__ import annotations

import itertools
import math
import warnings
from fractions import Fraction
from typing import Dict, List, Sequence

import numpy as np

from tests.reference import _rows


def positions(scores: Sequence[float], known: Sequence[int], ties: str) -> Dict[int, int]:
    """``{label: position}`` of the known labels of one sample ("max" or "index")."""
    if ties == "max":
        return {l: sum(1 for k in known if scores[k] >= scores[l]) for l in known}
    order = sorted(known, key=lambda k: (-scores[k], k))
    return {l: i + 1 for i, l in enumerate(order)}


def all_orders(scores: Sequence[float], known: Sequence[int]):
    """Every strict order of the known labels that keeps the scores descending: ``{label: position}`` each."""
    levels = sorted({scores[k] for k in known}, reverse=True)
    groups = [[k for k in known if scores[k] == level] for level in levels]
    for choice in itertools.product(*(itertools.permutations(group) for group in groups)):
        order = [label for group in choice for label in group]
        yield {l: i + 1 for i, l in enumerate(order)}


def _coverage(place, known, positives):
    return Fraction(max((place[j] for j in positives), default=0))


def _ranking_loss(place, known, positives):
    negatives = [k for k in known if k not in positives]
    if not positives or not negatives:
        return Fraction(0)
    # wrong: the negative at or before the positive (tied labels share a position under "max")
    wrong = sum(1 for j in positives for k in negatives if place[k] <= place[j])
    return Fraction(wrong, len(positives) * len(negatives))


def _one_error(place, known, positives):
    return Fraction(0 if any(place[j] == 1 for j in positives) else 1)


def _retrieval(ks):
    def values(place, known, positives):
        ranks = sorted(place[j] for j in positives)
        m = len(ranks)
        out = {}
        for k in ks:
            top = [r for r in ranks if r <= k]
            out.update(
                {
                    f"hit@{k}": Fraction(int(bool(top))),
                    f"precision@{k}": Fraction(len(top), k),
                    f"recall@{k}": Fraction(len(top), m) if m else Fraction(0),
                    # precision at each position i <= k holding a positive: positives at positions <= i, over i
                    f"ap@{k}": (
                        sum((Fraction(sum(1 for q in ranks if q <= r), r) for r in top), Fraction(0)) / min(m, k)
                        if m
                        else Fraction(0)
                    ),
                    f"rr@{k}": Fraction(1, ranks[0]) if top else Fraction(0),
                    f"ndcg@{k}": Fraction(
                        sum(1 / math.log2(r + 1) for r in top)
                        / sum(1 / math.log2(i + 1) for i in range(1, min(m, k) + 1))
                    )
                    if m
                    else Fraction(0),
                }
            )
        return out

    return values


def _per_sample(preds, target, ties, ignore_index, value_of) -> List:
    """The value of each sample (a Fraction or a dict of them); the mean over tie orders for "expected"."""
    out = []
    for scores, known, positives in _rows(preds, target, ignore_index):
        if ties != "expected":
            out.append(value_of(positions(scores, known, ties), known, positives))
            continue
        values = [value_of(place, known, positives) for place in all_orders(scores, known)]
        if isinstance(values[0], dict):
            out.append({key: sum((v[key] for v in values), Fraction(0)) / len(values) for key in values[0]})
        else:
            out.append(sum(values, Fraction(0)) / len(values))
    return out


def _weights(preds, sample_weight):
    if sample_weight is None:
        return None
    sample_weight = np.asarray(sample_weight, dtype=np.float64)
    preds = np.asarray(preds)
    if preds.ndim > 2 and sample_weight.ndim == 1:
        sample_weight = np.broadcast_to(
            sample_weight.reshape((-1,) + (1,) * (preds.ndim - 2)), (preds.shape[0],) + preds.shape[2:]
        )
    return [Fraction(float(w)) for w in sample_weight.reshape(-1)]


def _mean(values, weights, keep=None):
    if weights is None:
        weights = [Fraction(1)] * len(values)
    if keep is not None:
        values = [v for v, k in zip(values, keep) if k]
        weights = [w for w, k in zip(weights, keep) if k]
    total = sum(weights, Fraction(0))
    if total == 0:
        return float("nan")
    return float(sum((w * v for w, v in zip(weights, values)), Fraction(0)) / total)


def naive_coverage_error(preds, target, ties="max", ignore_index=None, sample_weight=None):
    values = _per_sample(preds, target, ties, ignore_index, _coverage)
    return _mean(values, _weights(preds, sample_weight))


def naive_ranking_loss(preds, target, ties="max", ignore_index=None, sample_weight=None):
    """Share of (positive, negative) pairs ordered wrong: the negative scores at least as high ("max") or comes
    first in the strict order."""
    values = _per_sample(preds, target, ties, ignore_index, _ranking_loss)
    return _mean(values, _weights(preds, sample_weight))


def naive_one_error(preds, target, ties="max", ignore_index=None, sample_weight=None):
    """1 unless a positive is at position 1: with "max" the top score must be held by one label alone."""
    values = _per_sample(preds, target, ties, ignore_index, _one_error)
    return _mean(values, _weights(preds, sample_weight))


def naive_retrieval(preds, target, ks, ties="max", ignore_index=None, sample_weight=None, empty_target="zero"):
    """``{"<metric>@<k>": value}`` from the positions of the positives."""
    values = _per_sample(preds, target, ties, ignore_index, _retrieval(ks))
    keep = None
    if empty_target == "skip":
        keep = [bool(positives) for _, _, positives in _rows(preds, target, ignore_index)]
    weights = _weights(preds, sample_weight)
    return {key: _mean([v[key] for v in values], weights, keep) for key in values[0]} if values else {}


def naive_lwlrap_lrap_expected(preds, target, ignore_index=None):
    """``(lwlrap, LRAP)`` with every label's precision averaged over every order of the tied labels."""
    precision_sum, positives_total, lrap = Fraction(0), 0, []
    for scores, known, positives in _rows(preds, target, ignore_index):
        orders = list(all_orders(scores, known))
        row_sum = Fraction(0)
        for place in orders:
            for j in positives:
                row_sum += Fraction(sum(1 for q in positives if place[q] <= place[j]), place[j])
        row_sum /= len(orders)
        precision_sum += row_sum
        positives_total += len(positives)
        trivial = not positives or len(positives) == len(known)
        lrap.append(Fraction(1) if trivial else row_sum / len(positives))
    return float(precision_sum / positives_total), float(sum(lrap, Fraction(0)) / len(lrap))


# Rank agreement between two score tensors: scipy per row, and the Kendall distance at k by brute force.


def scipy_mean(a, b, method):
    """The mean of scipy's per-row correlation over rows where it is defined, and the rows where it is not."""
    from scipy import stats as scipy_stats  # a test extra: imported where a reference needs it

    values, undefined = [], 0
    for x, y in zip(a.double().numpy(), b.double().numpy()):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if method == "spearman":
                value = scipy_stats.spearmanr(x, y).statistic if len(x) > 1 else math.nan
            else:
                value = scipy_stats.kendalltau(x, y).statistic if len(x) > 1 else math.nan
        if math.isnan(value):
            undefined += 1
        else:
            values.append(value)
    return (float(np.mean(values)) if values else math.nan), undefined


def naive_distance(a, b, k):
    """The distance at k from its definition: sort with lower column first among ties, brute force over pairs."""
    out = []
    for x, y in zip(a.double().tolist(), b.double().tolist()):
        c = len(x)
        top = set(sorted(range(c), key=lambda j: (-x[j], j))[:k]) | set(sorted(range(c), key=lambda j: (-y[j], j))[:k])
        n = len(top)
        if n < 2:
            out.append(0.0)
            continue
        score = 0.0
        for u, v in itertools.combinations(sorted(top), 2):
            # By comparison, not subtraction: two equal infinities are tied (their difference is NaN).
            dx, dy = (x[u] > x[v]) - (x[u] < x[v]), (y[u] > y[v]) - (y[u] < y[v])
            if dx * dy < 0:
                score += 1
            elif (dx == 0) != (dy == 0):
                score += 0.5
        out.append(score / (n * (n - 1) / 2))
    return float(np.mean(out))
