"""Naive references of the ranking metrics beside lwlrap, written from their definitions: Python loops over samples
and labels, exact fractions, no use of the library.

Each label of a sample gets a *position* in its ranking (ignored labels removed):

* ``ties="max"``: ``#{k : s_k >= s_l}``, the last position of its tie group;
* ``ties="index"``: its place in the order by descending score, lower column first among equal scores.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Dict, Optional, Sequence

import numpy as np

from tests.reference import _rows


def positions(scores: Sequence[float], known: Sequence[int], ties: str) -> Dict[int, int]:
    """``{label: position}`` of the known labels of one sample."""
    if ties == "max":
        return {l: sum(1 for k in known if scores[k] >= scores[l]) for l in known}
    order = sorted(known, key=lambda k: (-scores[k], k))
    return {l: i + 1 for i, l in enumerate(order)}


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
    values = []
    for scores, known, positives in _rows(preds, target, ignore_index):
        place = positions(scores, known, ties)
        values.append(Fraction(max((place[j] for j in positives), default=0)))
    return _mean(values, _weights(preds, sample_weight))


def naive_ranking_loss(preds, target, ties="max", ignore_index=None, sample_weight=None):
    """Share of (positive, negative) pairs ordered wrong: the negative scores at least as high ("max") or comes
    first in the column-ordered ranking ("index")."""
    values = []
    for scores, known, positives in _rows(preds, target, ignore_index):
        negatives = [k for k in known if k not in positives]
        if not positives or not negatives:
            values.append(Fraction(0))
            continue
        wrong = 0
        for j in positives:
            for k in negatives:
                if ties == "max":
                    wrong += scores[k] >= scores[j]
                else:
                    wrong += scores[k] > scores[j] or (scores[k] == scores[j] and k < j)
        values.append(Fraction(wrong, len(positives) * len(negatives)))
    return _mean(values, _weights(preds, sample_weight))


def naive_one_error(preds, target, ties="max", ignore_index=None, sample_weight=None):
    """1 unless the top label is positive: with "max" the top score must be held by one label alone."""
    values = []
    for scores, known, positives in _rows(preds, target, ignore_index):
        if not known:
            values.append(Fraction(1))
            continue
        top = max(scores[k] for k in known)
        holders = [k for k in known if scores[k] == top]
        if ties == "max":
            right = len(holders) == 1 and holders[0] in positives
        else:
            right = min(holders) in positives
        values.append(Fraction(0 if right else 1))
    return _mean(values, _weights(preds, sample_weight))


def naive_retrieval(preds, target, ks, ties="max", ignore_index=None, sample_weight=None, empty_target="zero"):
    """``{"<metric>@<k>": value}`` from the positions of the positives."""
    per_sample = {}
    has_positive = []
    for scores, known, positives in _rows(preds, target, ignore_index):
        place = positions(scores, known, ties)
        ranks = sorted(place[j] for j in positives)
        m = len(ranks)
        has_positive.append(m > 0)
        for k in ks:
            top = [r for r in ranks if r <= k]
            values = {
                "hit": Fraction(int(bool(top))),
                "precision": Fraction(len(top), k),
                "recall": Fraction(len(top), m) if m else Fraction(0),
                # precision at each position i <= k holding a positive: positives at positions <= i, over i
                "ap": (
                    sum((Fraction(sum(1 for q in ranks if q <= r), r) for r in top), Fraction(0)) / min(m, k)
                    if m
                    else Fraction(0)
                ),
                "rr": Fraction(1, ranks[0]) if top else Fraction(0),
                "ndcg": (
                    sum(1 / math.log2(r + 1) for r in top) / sum(1 / math.log2(i + 1) for i in range(1, min(m, k) + 1))
                    if m
                    else 0.0
                ),
            }
            for name, value in values.items():
                per_sample.setdefault(f"{name}@{k}", []).append(Fraction(value))
    keep = has_positive if empty_target == "skip" else None
    weights = _weights(preds, sample_weight)
    return {name: _mean(values, weights, keep) for name, values in per_sample.items()}
