"""NDCG with graded relevance, rank correlations and the Kendall distance at k: against scipy, scikit-learn and naive
loops written here from the formulas, the identities with the retrieval NDCG and with tau, every engine path, batch
accumulation, checkpoints, bad input and the input forms of a training loop."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.reference_ranking import all_orders, naive_distance, scipy_mean
from tests.test_checkpoints import _Recorder  # counts aten operations and the largest tensor made
from torch_lwlrap import (
    MultilabelKendallDistanceAtK,
    MultilabelNDCG,
    MultilabelRankCorrelation,
    multilabel_kendall_distance_at_k,
    multilabel_ndcg,
    multilabel_rank_correlation,
    multilabel_retrieval_at_k,
)
from torch_lwlrap import _ltr_numba
from torch_lwlrap._engine_config import use_engine

scipy_stats = pytest.importorskip("scipy.stats")
sklearn_metrics = pytest.importorskip("sklearn.metrics")

#: Engine paths: the torch path ("sort") everywhere, the compiled kernels where numba is installed.
ENGINES = ["sort"] + (["auto"] if _ltr_numba.unavailable_reason("cpu", torch.float32) is None else [])

REL = 1e-12


def tied_rows(seed, n=40, c=7, levels=3, dtype=torch.float64):
    """Two score tensors from a few levels (many ties, constant rows and +-inf too)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(0, levels, (n, c), generator=g).to(dtype)
    b = torch.randint(0, levels, (n, c), generator=g).to(dtype)
    a[0] = 1.0  # constant
    b[1] = -0.0
    b[1, 0] = 0.0  # -0.0 and 0.0 tie: constant too
    if c > 2:
        a[2, 1] = math.inf
        b[3, 2] = -math.inf
    return a, b


def distinct_rows(seed, n=40, c=7, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, c, generator=g, dtype=torch.float64).to(dtype), torch.randn(
        n, c, generator=g, dtype=torch.float64
    ).to(dtype)


def naive_ndcg(preds, relevance, k, gain, ties, ignore_index=None, empty_target="zero", weight=None):
    """NDCG from its formula: positions by the tie rule ("expected": the mean over every order of the tied
    labels), gains 2**rel - 1 or rel, the ideal DCG of the labels sorted by relevance."""
    values, weights = [], []
    for i, (scores, grades) in enumerate(zip(preds.double().tolist(), relevance.double().tolist())):
        known = [j for j in range(len(scores)) if ignore_index is None or grades[j] != ignore_index]
        # 2**rel - 1 as expm1(rel ln 2): accurate for the smallest grades too (2.0 ** 1e-17 - 1 is 0)
        g = {j: (math.expm1(grades[j] * math.log(2)) if gain == "exponential" else grades[j]) for j in known}
        cut = len(known) if k is None else k
        ideal = sum(v / math.log2(p + 2) for p, v in enumerate(sorted(g.values(), reverse=True)[:cut]))
        w = 1.0 if weight is None else float(weight[i])
        if ideal == 0:
            if empty_target == "zero":
                values.append(0.0)
                weights.append(w)
            continue

        def dcg(place):
            return sum(g[j] / math.log2(place[j] + 1) for j in known if place[j] <= cut)

        if ties == "max":
            value = dcg({j: sum(1 for q in known if scores[q] >= scores[j]) for j in known})
        elif ties == "index":
            order = sorted(known, key=lambda j: (-scores[j], j))
            value = dcg({j: p + 1 for p, j in enumerate(order)})
        else:
            orders = list(all_orders(scores, known))
            value = sum(dcg(place) for place in orders) / len(orders)
        values.append(value / ideal)
        weights.append(w)
    return float(np.average(values, weights=weights)) if values and sum(weights) > 0 else math.nan


def close(actual, expected, what=""):
    assert actual.dtype == torch.float64, what
    if math.isnan(expected):
        assert math.isnan(actual.item()), (what, actual)
    else:
        assert actual.item() == pytest.approx(expected, rel=REL, abs=REL), what


# ---------------------------------------------------------------------------------------------------------------
# rank correlations against scipy


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("method", ["spearman", "kendall"])
@pytest.mark.parametrize("case", ["ties", "distinct", "wide", "two labels", "one label"])
def test_rank_correlation_equals_scipy_per_row(engine, method, case):
    if case == "ties":
        a, b = tied_rows(0)
    elif case == "distinct":
        a, b = distinct_rows(1)
    elif case == "wide":  # long rows (the radix sort, not insertion) with ties
        a, b = tied_rows(2, n=12, c=300, levels=40, dtype=torch.float32)
    elif case == "two labels":
        a, b = tied_rows(3, c=2, levels=2)
    else:
        a, b = distinct_rows(4, c=1)
    expected, undefined = scipy_mean(a, b, method)
    with use_engine(engine):
        close(multilabel_rank_correlation(a, b, method=method), expected, case)
        metric = MultilabelRankCorrelation(a.shape[1], method=method)
        metric.update(a, b)
        close(metric.compute(), expected, case)
        assert metric.constant_rows().item() == undefined
        assert metric.rank_correlation_count.item() == len(a) - undefined


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("method", ["spearman", "kendall"])
@pytest.mark.parametrize("variant", ["parallel", "serial"])
def test_each_rows_correlation_is_its_own_with_nan_rows_between(dtype, method, variant):
    """Row by row, not only on average (a result stored in the wrong row keeps the mean): the compiled kernel's
    values against scipy's on rows of every kind in turn (continuous, tied, constant), NaN rows at the start, the
    end and next to one another, over two blocks and a partial third (Kendall's rows of 32-bit keys are counted two
    at a time: a row waits for the next one, across NaN rows, and one still waiting at its block's end is counted
    alone)."""
    from scipy import stats as scipy_stats

    n, c = 2 * _ltr_numba.BLOCK_ROWS + 5, 60
    g = torch.Generator().manual_seed(21)
    a, b = torch.randn(n, c, generator=g, dtype=torch.float64), torch.randn(n, c, generator=g, dtype=torch.float64)
    b[::3] = torch.randint(0, 4, (len(b[::3]), c), generator=g).double()  # ties in y
    a[1::5] = torch.randint(0, 3, (len(a[1::5]), c), generator=g).double()  # ties in x
    a[7], b[11] = 2.0, -1.0  # constant rows
    b[2::7] += a[2::7]  # correlated
    a, b = a.to(dtype), b.to(dtype)
    nan_rows = [0, 5, 6, 9, _ltr_numba.BLOCK_ROWS - 1, _ltr_numba.BLOCK_ROWS, n - 1]
    for i, row in enumerate(nan_rows):
        (a if i % 2 else b)[row, (7 * row) % c] = math.nan
    _, bits_a, nbits = _ltr_numba._bits(a)
    _, bits_b, _ = _ltr_numba._bits(b)
    value, defined = np.zeros(n), np.zeros(n, np.bool_)
    kernel = getattr(_ltr_numba._correlation_kernel, variant)
    kernel(bits_a, bits_b, nbits, method == "kendall", True, value, defined, np.int64(0))
    statistic = scipy_stats.spearmanr if method == "spearman" else scipy_stats.kendalltau
    for row, (x, y) in enumerate(zip(a.double().numpy(), b.double().numpy())):
        if row in nan_rows:
            assert math.isnan(value[row]), row
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            expected = statistic(x, y).statistic
        assert defined[row] == (not math.isnan(expected)), row
        if defined[row]:
            assert value[row] == pytest.approx(expected, rel=1e-12, abs=1e-12), row


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("method", ["spearman", "kendall"])
def test_rank_correlation_of_long_rows_equals_scipy(engine, dtype, method):
    """Rows long enough for the radix sorts (both key widths), with 150 to 1500 distinct values (the Kendall counts'
    bitset up to 1023 distinct ranks, the 4-ary trie beyond and with ties) and with many ties, rows of 70,000 labels
    (the binary trie) and rows whose keys differ in their lowest bytes only (an odd or even number of radix
    passes), and ties in one row only, against scipy."""
    cases = [distinct_rows(8, n=6, c=527, dtype=dtype), tied_rows(9, n=8, c=300, levels=150, dtype=dtype),
             tied_rows(10, n=8, c=400, levels=1000, dtype=dtype), distinct_rows(12, n=2, c=1500, dtype=dtype),
             tied_rows(13, n=4, c=70_000, levels=50_000, dtype=dtype)]
    a, b = distinct_rows(11, n=6, c=200, dtype=dtype)
    cases.append((a, torch.where(b > 0, b, -a)))  # mixed signs, partly ordered against a
    tied, distinct = tied_rows(15, n=6, c=300, levels=20, dtype=dtype)[0], distinct_rows(16, n=6, c=300, dtype=dtype)[0]
    cases += [(tied, distinct), (distinct, tied)]  # ties in one row only
    g = torch.Generator().manual_seed(14)
    for spread in (200, 60_000):  # scores 1 + k ulp: keys that differ in their lowest one or two bytes only
        a, b = (1 + torch.randint(0, spread, (6, 40), generator=g).double() * torch.finfo(dtype).eps for _ in "ab")
        cases.append((a.to(dtype), b.to(dtype)))
    for a, b in cases:
        expected, _ = scipy_mean(a, b, method)
        with use_engine(engine):
            close(multilabel_rank_correlation(a, b, method=method), expected, f"{dtype} {method} {a.shape}")


@pytest.mark.skipif("auto" not in ENGINES, reason="the numba kernels are not installed")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spearman_of_rows_past_exact_integer_sums_equals_scipy(monkeypatch, dtype):
    """Rows longer than INT_SUMS_MAX labels (2,000,000) sum Spearman's terms in float64, which int64 would
    overflow: that variant of the kernel, brought down to short rows (with and without ties), against scipy."""
    monkeypatch.setattr(_ltr_numba, "INT_SUMS_MAX", 50)
    zeros = []
    kernel = _ltr_numba.run

    def spy(function, work, *args, **kwargs):
        zeros.append(type(args[-1]))  # the sums' type: the last argument of the correlation kernel
        return kernel(function, work, *args, **kwargs)

    monkeypatch.setattr(_ltr_numba, "run", spy)
    cases = [distinct_rows(17, n=5, c=527, dtype=dtype), tied_rows(18, n=5, c=300, levels=40, dtype=dtype)]
    for a, b in cases:
        expected, _ = scipy_mean(a, b, "spearman")
        with use_engine("auto"):  # the numba kernels, whatever TORCH_LWLRAP_ENGINE says
            close(multilabel_rank_correlation(a, b), expected, f"{dtype} {a.shape}")
    assert zeros == [np.float64, np.float64]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_scores_rank_as_their_values(engine, dtype):
    a, b = tied_rows(5, c=60, levels=300, dtype=dtype)
    for method in ("spearman", "kendall"):
        with use_engine(engine):
            value = multilabel_rank_correlation(a, b, method=method)
        close(value, scipy_mean(a.float(), b.float(), method)[0], f"{dtype} {method}")


def test_the_engine_paths_and_chunks_agree():
    a, b = tied_rows(6, n=50, c=40, levels=6)
    results = []
    for engine, chunk in [("sort", None), ("sort", 90), ("auto", None), ("auto", 90)]:
        with use_engine(engine, chunk):
            results.append(
                [multilabel_rank_correlation(a, b, method=m) for m in ("spearman", "kendall")]
                + [multilabel_kendall_distance_at_k(a, b, k) for k in (1, 3, 10, 40)]
            )
    for other in results[1:]:
        for x, y in zip(results[0], other):
            torch.testing.assert_close(x, y, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("engine", ENGINES)
def test_spearman_of_rows_of_millions_of_labels(engine):
    # Four times the sums of squares of centered ranks reach C**3 / 3: beyond int64 past 3 million labels. Swapping
    # two labels k places apart gives sum d**2 = 2 k**2, so rho = 1 - 12 k**2 / (C (C**2 - 1)).
    num_labels, k = 3_100_000, 1000
    a = torch.arange(num_labels, dtype=torch.float32)[None]
    b = a.clone()
    b[0, 5], b[0, 5 + k] = a[0, 5 + k], a[0, 5]
    with use_engine(engine):
        got = [multilabel_rank_correlation(a, other).item() for other in (a, b, a.flip(1))]
    want = [1.0, 1 - 12 * k**2 / (num_labels * (num_labels**2 - 1)), -1.0]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


@pytest.mark.skipif("auto" not in ENGINES, reason="numba is not installed")
def test_the_compiled_kernels_take_rows_they_read_in_place_in_one_call(monkeypatch):
    # Beyond the workspace budget (made small here) the rows are still one kernel call where the kernels read them
    # in place (float32 or float64, contiguous); float16 rows, widened copies, and a forced chunk size are chunked.
    from torch_lwlrap import _engine_config

    a, b = tied_rows(7, n=300, c=40, levels=9)
    want = [multilabel_rank_correlation(a, b, method=m) for m in ("spearman", "kendall")]
    want.append(multilabel_kendall_distance_at_k(a, b, 3))
    monkeypatch.setattr(_engine_config, "INPUT_CHUNK_BYTES", 40 * 40 * 16)  # about 40 rows a chunk
    calls = []
    for name in ("correlation_rows", "distance_rows"):
        kernel = getattr(_ltr_numba, name)
        monkeypatch.setattr(_ltr_numba, name, lambda *args, _k=kernel, **kw: calls.append(len(args[0])) or _k(*args, **kw))

    def run(x, y):
        calls.clear()
        got = [multilabel_rank_correlation(x, y, method=m) for m in ("spearman", "kendall")]
        return got + [multilabel_kendall_distance_at_k(x, y, 3)], list(calls)

    for dtype in (torch.float32, torch.float64):
        got, seen = run(a.to(dtype), b.to(dtype))
        assert seen == [300, 300, 300], (dtype, seen)
        for x, y in zip(got, want):
            torch.testing.assert_close(x, y, rtol=1e-13, atol=1e-13)
    got, seen = run(a.half(), b.half())
    assert len(seen) > 3 and max(seen) < 300
    with use_engine("auto", 40 * 50):
        got, seen = run(a, b)
    assert len(seen) > 3 and max(seen) < 300
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=1e-13, atol=1e-13)


# ---------------------------------------------------------------------------------------------------------------
# Kendall distance at k


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("k", [1, 2, 3, 5, 7, 9])
def test_distance_at_k_equals_brute_force_over_pairs(engine, k):
    a, b = tied_rows(7)
    with use_engine(engine):
        close(multilabel_kendall_distance_at_k(a, b, k), naive_distance(a, b, k), f"k={k}")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("k", [1, 4, 10, 30, 49, 60, 150])
def test_distance_at_k_on_wide_rows_takes_every_kernel_branch(engine, k):
    # k of 1 to 30 on 150 labels scan for the top k, 49 and more sort the row; unions beyond 48 labels are counted
    # through sorts, smaller ones pair by pair.
    a, b = tied_rows(8, n=6, c=150, levels=25, dtype=torch.float32)
    with use_engine(engine):
        close(multilabel_kendall_distance_at_k(a, b, k), naive_distance(a, b, k), f"k={k}")


@pytest.mark.skipif(_ltr_numba.unavailable_reason("cpu", torch.float32) is not None, reason="needs numba")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c", [64, 97, 527])
@pytest.mark.parametrize("k", [1, 8, 10, 24, 32, 40, 48])
def test_the_compiled_scan_for_the_top_k_equals_brute_force_row_by_row(dtype, c, k):
    # The scan takes k up to 48 on rows of at least 2 G labels (G: 2 k rounded up to 16): k up to 8 from 32 labels,
    # 16 from 64, 24 from 96, 48 from 192; the other rows sort (here k = 24 and more at 64 labels, 32 and more at
    # 97). G = 16, 32, 48, 64, 80 and 96 take the sorting networks of 16, 32, 64, 64, 128 and 128 entries. Rows:
    # distinct scores, a few levels (tied candidates beyond what the scan places, ties across the k-th place), 40
    # levels, 0/1 scores, and -inf, +inf, -0.0 among them. Widths 64 and 527 end in a whole and a partial vector.
    g = torch.Generator().manual_seed(c * 100 + k)
    rows = [torch.randn(4, c, generator=g, dtype=torch.float64), torch.randint(0, 3, (4, c), generator=g),
            torch.randint(0, 40, (4, c), generator=g), (torch.rand(4, c, generator=g) < 0.05)]
    a = torch.cat([r.to(torch.float64) for r in rows])
    b = torch.cat([a[:4] + 0.5 * torch.randn(4, c, generator=g, dtype=torch.float64),
                   a[4:][:, torch.randperm(c, generator=g)]])
    a[1, ::5], a[2, 3], b[3, 7], b[5, :9] = -math.inf, math.inf, -0.0, 0.0
    a, b = a.to(dtype), b.to(dtype)
    rows_out, nan_found = _ltr_numba.distance_rows(a, b, k, check_nan=True)
    assert not nan_found
    for i in range(a.shape[0]):
        assert rows_out[i].item() == pytest.approx(naive_distance(a[i : i + 1], b[i : i + 1], k), rel=1e-12, abs=0), (i, k)


@pytest.mark.skipif(_ltr_numba.unavailable_reason("cpu", torch.float32) is not None, reason="needs numba")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_scan_takes_as_floor_the_kth_highest_group_maximum(dtype):
    # Any floor that k entries reach gives the right top k (a wrong one only sends the row to a sort), so the values
    # alone cannot tell a wrong floor: the scan's count of candidates must be that of the exact floor, the k-th
    # highest of the maxima of the columns g, g + G, g + 2 G, ... (G: 2 k rounded up to 16), from numpy.
    rng = np.random.default_rng(5)
    lanes = 16
    for c in (64, 97, 192, 527):
        for k in range(1, 49):
            if not _ltr_numba._scan_applies(k, c):
                continue
            for levels in (None, 40):
                row = rng.standard_normal(c) if levels is None else rng.integers(0, levels, c).astype(np.float64)
                row = row.astype(dtype)
                groups = (2 * k + lanes - 1) // lanes * lanes
                maxima = np.array([row[g::groups].max() for g in range(groups)])
                floor = np.sort(maxima)[::-1][k - 1]
                mark, union = np.zeros(c, np.bool_), np.zeros(c + 1, np.uint64)
                other = rng.permutation(row)  # the second row of the pair: its own groups, its own floor
                other_floor = np.sort(np.array([other[g::groups].max() for g in range(groups)]))[::-1][k - 1]
                floor_a, floor_b, nan = _ltr_numba._scan_floors(
                    row, other, k, np.empty(2 * _ltr_numba.NETWORK_WIDTHS[-1], dtype))
                assert (floor_a, floor_b, nan) == (floor, other_floor, False), (c, k, levels)
                size, found, placed = _ltr_numba._scan_top(
                    row, k, floor_a, mark, union, np.uint64(0), np.empty(c + lanes, dtype), np.empty(c, np.uint64))
                assert found == int((row >= floor).sum()), (c, k, levels)
                assert placed == (k <= found <= _ltr_numba.RANKED_MAX)
                if placed and levels is None:  # distinct scores: the k highest columns
                    assert sorted(union[:size].tolist()) == sorted(np.argsort(-row, kind="stable")[:k].tolist())
                    assert mark.sum() == k


@pytest.mark.skipif(_ltr_numba.unavailable_reason("cpu", torch.float32) is not None, reason="needs numba")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("c, k", [(64, 8), (97, 10), (97, 24), (527, 10), (527, 48)])
def test_the_scan_finds_a_nan_at_any_column_of_either_row(dtype, c, k):
    # The scan finds NaN in its read of both rows' group maxima (whole stripes in vectors, the tail one entry at a
    # time): a NaN at each column, in the first or the second input, makes that row NaN and leaves the others exact.
    assert _ltr_numba._scan_applies(k, c)
    g = torch.Generator().manual_seed(c + k)
    a = torch.randn(2 * c, c, generator=g, dtype=torch.float64)
    b = a + 0.3 * torch.randn(2 * c, c, generator=g, dtype=torch.float64)
    for column in range(c):
        a[column, column] = math.nan
        b[c + column, column] = -math.nan if column % 2 else math.nan
    clean_a, clean_b = torch.randn(3, c, generator=g, dtype=torch.float64), torch.randn(3, c, generator=g,
                                                                                        dtype=torch.float64)
    a, b = torch.cat([clean_a[:1], a, clean_a[1:]]).to(dtype), torch.cat([clean_b[:1], b, clean_b[1:]]).to(dtype)
    rows_out, nan_found = _ltr_numba.distance_rows(a, b, k, check_nan=True)
    assert nan_found
    assert torch.isnan(rows_out[1:-2]).all()
    for i in (0, a.shape[0] - 2, a.shape[0] - 1):
        assert rows_out[i].item() == pytest.approx(naive_distance(a[i : i + 1], b[i : i + 1], k), rel=1e-12, abs=0)
    for column in (0, c - 1):
        for first, second in ((a[1 + column], b[1 + column]), (a[1 + c + column], b[1 + c + column])):
            group_max = np.empty(2 * _ltr_numba.NETWORK_WIDTHS[-1], first.numpy().dtype)
            assert _ltr_numba._scan_floors(first.numpy(), second.numpy(), k, group_max)[2], column
    clean = clean_a[0].to(dtype).numpy()
    assert not _ltr_numba._scan_floors(clean, clean, k, np.empty(256, clean.dtype))[2]


@pytest.mark.parametrize("engine", ENGINES)
def test_distance_at_c_without_ties_is_one_minus_tau_over_two(engine):
    a, b = distinct_rows(9, c=12)
    taus = [scipy_stats.kendalltau(x, y).statistic for x, y in zip(a.numpy(), b.numpy())]
    with use_engine(engine):
        close(multilabel_kendall_distance_at_k(a, b, 12), float(np.mean([(1 - t) / 2 for t in taus])))
        close(multilabel_kendall_distance_at_k(a, b, 10**9), float(np.mean([(1 - t) / 2 for t in taus])))
        close(multilabel_kendall_distance_at_k(a, a, 5), 0.0)
        close(multilabel_kendall_distance_at_k(a, -a, 12), 1.0)


# ---------------------------------------------------------------------------------------------------------------
# NDCG with graded relevance


def graded(seed, n=30, c=6, levels=3, grades=4, ignore_index=None):
    g = torch.Generator().manual_seed(seed)
    preds = torch.randint(0, levels, (n, c), generator=g).double()
    relevance = torch.randint(0, grades, (n, c), generator=g).double() * 0.75
    relevance[0] = 0  # no relevant label
    if ignore_index is not None:
        relevance[torch.rand(n, c, generator=g) < 0.2] = ignore_index
    weight = torch.rand(n, generator=g).double() * 2
    return preds, relevance, weight


@pytest.mark.parametrize("k", [None, 1, 3, 6])
def test_ndcg_with_linear_gains_equals_scikit_learn_both_tie_handlings(k):
    preds, relevance, _ = graded(10)
    y, s = relevance.numpy(), preds.numpy()
    # ignore_ties=False averages the gains of tied labels: the "expected" rule.
    close(multilabel_ndcg(preds, relevance, k, gain="linear", ties="expected"), sklearn_metrics.ndcg_score(y, s, k=k))
    # ignore_ties=True on scores without ties: every rule gives it.
    distinct = torch.randn(preds.shape, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    expected = sklearn_metrics.ndcg_score(y, distinct.numpy(), k=k, ignore_ties=True)
    for ties in ("max", "index", "expected"):
        close(multilabel_ndcg(distinct, relevance, k, gain="linear", ties=ties), expected, ties)


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
@pytest.mark.parametrize("gain", ["exponential", "linear"])
@pytest.mark.parametrize("options", [dict(), dict(ignore_index=-1), dict(empty_target="skip"), dict(weighted=True)])
def test_ndcg_equals_the_naive_formula(ties, gain, options):
    options = dict(options)
    weighted = options.pop("weighted", False)
    preds, relevance, weight = graded(12, ignore_index=options.get("ignore_index"))
    w = weight if weighted else None
    for k in (None, 1, 2, 4, 6, 50):
        expected = naive_ndcg(preds, relevance, k, gain, ties, weight=w, **options)
        close(multilabel_ndcg(preds, relevance, k, gain=gain, ties=ties, sample_weight=w, **options), expected, k)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.float16])
@pytest.mark.parametrize("gain", ["exponential", "linear"])
def test_ndcg_of_grades_in_any_dtype_equals_the_int64_value(dtype, gain):
    # Grades as stored (uint8, int8 ...): the gate's bound (1024) and ignore_index must not wrap around in a dtype
    # that cannot hold them (1024 is 0 in uint8, -1 is 255); values as int64 grades give them.
    preds, relevance, weight = graded(21, n=40, c=7, grades=4)
    relevance = (relevance / 0.75).round()
    relevance[1, 2] = 100  # a large grade each dtype holds
    for ignore_index in (None, -1, -200):
        stored = relevance.to(dtype)
        if ignore_index == -1 and dtype != torch.uint8:
            stored[2, :3] = -1  # ignored labels where the dtype can mark them
        wide = stored.long()
        if dtype == torch.uint8:
            stored[3, 4] = 255  # a grade that -1 would be, wrapped around
            wide[3, 4] = 255
        got = multilabel_ndcg(preds, stored, 5, gain=gain, ignore_index=ignore_index, sample_weight=weight)
        want = naive_ndcg(preds, wide.double(), 5, gain, "max", ignore_index=ignore_index, weight=weight)
        close(got, want, f"{dtype} ignore_index={ignore_index}")
        metric = MultilabelNDCG(7, 5, gain=gain, ignore_index=ignore_index)
        metric.update(preds, stored, sample_weight=weight)
        close(metric.compute(), want, f"{dtype} metric")


def test_ndcg_with_grades_near_the_bound_is_finite():
    # Each gain 2**1023 - 1 is a float64, three of them sum beyond: the ratio must still be the ratio (NDCG of equal
    # gains does not depend on their size: the binary relevance's value).
    preds, relevance, _ = graded(23, n=30, c=6, grades=2)
    binary = (relevance > 0).double()
    for k in (None, 2, 6):
        for ties in ("max", "index", "expected"):
            huge = multilabel_ndcg(preds, binary * 1023, k, ties=ties)
            assert torch.isfinite(huge)
            close(huge, multilabel_ndcg(preds, binary, k, ties=ties).item(), f"k={k} ties={ties}")
    mixed = torch.tensor([[1023.0, 1022.0, 0.0, 1023.0]])
    scores = torch.tensor([[0.9, 0.1, 0.5, 0.3]])
    # Ranked: grades 1023, 0, 1023, 1022; ideal: 1023, 1023, 1022, 0. Divided by 2**1022 the gains are 2, 0, 2 and 1
    # (the -1 of 2**r - 1 is far below a float64's precision there).
    discount = [1 / math.log2(i + 2) for i in range(4)]
    want = (2 * discount[0] + 2 * discount[2] + 1 * discount[3]) / (2 * discount[0] + 2 * discount[1] + discount[2])
    close(multilabel_ndcg(scores, mixed), want)


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
@pytest.mark.parametrize("empty_target", ["zero", "skip"])
def test_ndcg_of_binary_relevance_is_the_retrieval_ndcg(ties, empty_target):
    preds, relevance, weight = graded(13, n=40, c=7, grades=2)
    relevance[torch.rand(relevance.shape, generator=torch.Generator().manual_seed(3)) < 0.1] = -1
    target = torch.where(relevance == -1, -1, (relevance > 0).long())
    assert (target == 1).sum() > 20
    for k in (1, 3, 7, 9):
        retrieval = multilabel_retrieval_at_k(
            preds, target, k, metrics=("ndcg",), ties=ties, ignore_index=-1, sample_weight=weight,
            empty_target=empty_target,
        )[f"ndcg@{k}"]
        for gain in ("exponential", "linear"):
            graded_value = multilabel_ndcg(
                preds, target, k, gain=gain, ties=ties, ignore_index=-1, sample_weight=weight,
                empty_target=empty_target,
            )
            assert not math.isnan(retrieval.item())
            torch.testing.assert_close(graded_value, retrieval, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("ties", ["max", "index", "expected"])
def test_ndcg_over_many_chunks_equals_the_naive_formula(ties):
    """A batch larger than the torch path's chunk (about a million scores by default) is scored a chunk of rows at a
    time: each chunk must read its own rows' grades, known labels and weights. Forced chunks of one and five rows."""
    preds, relevance, weight = graded(31, n=23, c=6, ignore_index=-1)
    for w in (None, weight):
        want = naive_ndcg(preds, relevance, 3, "exponential", ties, ignore_index=-1, weight=w)
        for chunk in (None, 6, 5 * 6):
            with use_engine("sort", chunk):
                got = multilabel_ndcg(preds, relevance, 3, ties=ties, ignore_index=-1, sample_weight=w)
            close(got, want, f"chunk={chunk} weighted={w is not None}")


@pytest.mark.parametrize("empty_target", ["zero", "skip"])
def test_the_ndcg_metric_follows_empty_target(empty_target):
    preds, relevance, weight = graded(32, n=20, c=6)
    relevance[:5] = 0  # five samples without a relevant label
    want = naive_ndcg(preds, relevance, 3, "exponential", "max", empty_target=empty_target, weight=weight)
    metric = MultilabelNDCG(6, 3, empty_target=empty_target)
    metric.update(preds[:9], relevance[:9], sample_weight=weight[:9])
    metric.update(preds[9:], relevance[9:], sample_weight=weight[9:])
    close(metric.compute(), want, empty_target)
    close(multilabel_ndcg(preds, relevance, 3, empty_target=empty_target, sample_weight=weight), want)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("method", ["spearman", "kendall"])
def test_one_row_batches_equal_scipy(engine, dtype, method):
    """A sample at a time, as a loop over clips updates a metric: the compiled Kendall pairs float32 rows, and a
    batch of one row is a row left alone at its block's end."""
    g = torch.Generator().manual_seed(33)
    a = torch.randint(0, 5, (6, 9), generator=g).to(dtype)
    b = torch.randint(0, 5, (6, 9), generator=g).to(dtype)
    with use_engine(engine):
        metric = MultilabelRankCorrelation(9, method=method)
        for i in range(len(a)):
            want, _ = scipy_mean(a[i : i + 1].float(), b[i : i + 1].float(), method)
            close(multilabel_rank_correlation(a[i : i + 1], b[i : i + 1], method=method), want, f"row {i}")
            metric.update(a[i : i + 1], b[i : i + 1])
        close(metric.compute(), scipy_mean(a.float(), b.float(), method)[0])


def test_ndcg_takes_extra_dimensions_as_samples():
    preds, relevance, _ = graded(14, n=12, c=5)
    frames = preds.reshape(4, 3, 5).movedim(1, 2)  # (N, C, T)
    grades = relevance.reshape(4, 3, 5).movedim(1, 2)
    close(multilabel_ndcg(frames, grades, 3), multilabel_ndcg(preds, relevance, 3).item())


# ---------------------------------------------------------------------------------------------------------------
# k beyond the labels


def _cost(call):
    with _Recorder() as recorder:
        value = call()
    return recorder.ops, recorder.largest, value


@pytest.mark.parametrize("engine", ENGINES)
def test_k_beyond_the_labels_costs_what_k_equal_to_c_costs(engine):
    preds, relevance, _ = graded(15, n=20, c=6)
    other = torch.randn(preds.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with use_engine(engine):
        for call in (
            lambda k: multilabel_ndcg(preds, relevance, k),
            lambda k: multilabel_kendall_distance_at_k(preds, other, k),
        ):
            ops, largest, value = _cost(lambda: call(6))
            for k in (7, 10**6, 2**63 - 1):
                assert _cost(lambda: call(k)) == (ops, largest, value)
    assert multilabel_ndcg(preds, relevance, None) == multilabel_ndcg(preds, relevance, 6)


# ---------------------------------------------------------------------------------------------------------------
# streaming, checkpoints, bad input


def _metrics():
    return [
        (lambda: MultilabelNDCG(7, k=3, ties="expected", ignore_index=-1), "graded"),
        (lambda: MultilabelRankCorrelation(7, method="kendall"), "pair"),
        (lambda: MultilabelRankCorrelation(7), "pair"),
        (lambda: MultilabelKendallDistanceAtK(7, k=3), "pair"),
    ]


def _batches(kind):
    a, b = tied_rows(16, n=37, c=7)
    if kind == "graded":
        b = torch.nan_to_num(b, posinf=5.0, neginf=-5.0).abs() % 3
        b[5, 2] = -1
    return a, b


def _reference(make, kind, a, b):
    metric = make()
    if isinstance(metric, MultilabelNDCG):
        return multilabel_ndcg(a, b, 3, ties="expected", ignore_index=-1)
    if isinstance(metric, MultilabelRankCorrelation):
        return multilabel_rank_correlation(a, b, method=metric.method)
    return multilabel_kendall_distance_at_k(a, b, 3)


@pytest.mark.parametrize("index", range(4))
def test_uneven_batches_and_an_empty_one_accumulate_to_the_value_over_all_samples(index):
    make, kind = _metrics()[index]
    a, b = _batches(kind)
    metric = make()
    for start, stop in [(0, 5), (5, 5), (5, 22), (22, 23), (23, 37)]:
        metric.update(a[start:stop], b[start:stop])
    torch.testing.assert_close(metric.compute(), _reference(make, kind, a, b), rtol=1e-13, atol=1e-13)
    # forward returns the batch's own value and accumulates
    metric.reset()
    assert math.isnan(metric(a[:0], b[:0]).item())
    torch.testing.assert_close(metric(a[:10], b[:10]), _reference(make, kind, a[:10], b[:10]), rtol=1e-13, atol=0)
    metric(a[10:], b[10:])
    torch.testing.assert_close(metric.compute(), _reference(make, kind, a, b), rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("index", range(4))
def test_a_rejected_batch_leaves_the_state_as_it_was(index):
    make, kind = _metrics()[index]
    a, b = _batches(kind)
    metric = make()
    metric.update(a[:20], b[:20])
    before = {name: getattr(metric, name).clone() for name in metric._defaults}
    bad_b = b[20:].clone()
    bad_b[3, 1] = math.nan
    bad = [(a[20:], bad_b), (a[20:, :5], b[20:, :5]), (a[20:].long(), b[20:]),
           (a[20:].to(torch.float8_e4m3fn), b[20:]), (a[20:], b[20:].to_sparse())]
    for preds, other in bad:
        for call in (metric.update, metric):
            with pytest.raises((ValueError, TypeError)):
                call(preds, other)
            for name, value in before.items():
                assert torch.equal(getattr(metric, name), value), name
    metric.update(a[20:], b[20:])
    torch.testing.assert_close(metric.compute(), _reference(make, kind, a, b), rtol=1e-13, atol=1e-13)


def test_errors_name_the_argument_the_value_and_the_fix():
    a, b = distinct_rows(17, n=4, c=5)
    with pytest.raises(ValueError, match=r"`preds_b` contains NaN \(first at index \(1, 2\)\)"):
        multilabel_kendall_distance_at_k(a, b.index_put((torch.tensor(1), torch.tensor(2)), torch.tensor(math.nan, dtype=b.dtype)), 2)
    with pytest.raises(ValueError, match=r"`preds` and `reference` must have the same shape.*\(4, 5\).*\(4, 4\)"):
        multilabel_rank_correlation(a, b[:, :4])
    with pytest.raises(TypeError, match=r"`reference` must be a floating point tensor.*torch.int64.*`reference.float\(\)`"):
        multilabel_rank_correlation(a, b.long())
    with pytest.raises(ValueError, match=r"`method` must be one of \('spearman', 'kendall'\), but got 'pearson'"):
        MultilabelRankCorrelation(5, method="pearson")
    with pytest.raises(ValueError, match=r"`k` must be a positive integer, but got 0"):
        multilabel_kendall_distance_at_k(a, b, 0)
    with pytest.raises(ValueError, match=r"Expected 6 labels \(`num_labels`\).*\(4, 5\)"):
        MultilabelKendallDistanceAtK(6, k=2).update(a, b)
    with pytest.raises(ValueError, match=r"`relevance` must be non-negative and finite, but found the values \[-0.5\] \(first at index \(0, 1\)\)\. Relevance grades are the graded targets: 0 for irrelevant labels, larger for more relevant ones\.$"):
        multilabel_ndcg(a, torch.tensor([[0, -0.5, 1, 2, 0]] * 2 + [[0, 0, 1, 2, 0]] * 2))
    with pytest.raises(ValueError, match=r"below 1024 with gain=\"exponential\""):
        multilabel_ndcg(a, torch.full((4, 5), 2000.0))
    assert multilabel_ndcg(a, torch.full((4, 5), 2000.0), gain="linear").item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"`ignore_index` must be a negative integer.*but got 2: mark unknown"):
        MultilabelNDCG(5, ignore_index=2)
    for beyond in (-(2**63) - 1, -(2**64)):
        with pytest.raises(ValueError, match=r"`ignore_index` must fit an int64.*mark unknown labels with -1"):
            MultilabelNDCG(5, ignore_index=beyond)
        with pytest.raises(ValueError, match=r"`ignore_index` must fit an int64.*mark unknown labels with -1"):
            multilabel_ndcg(a, b.abs(), ignore_index=beyond)
    too_high = r"below 1024 with gain=\"exponential\".*\[2000\] \(first at index \(1, 2\)\)"
    with pytest.raises(ValueError, match=too_high):
        multilabel_ndcg(a, torch.tensor([[0, 1, 2, 3, 0]] + [[0, 1, 2000, 3, 0]] * 3, dtype=torch.int16))
    with pytest.raises(ValueError, match=r"`gain` must be one of \('exponential', 'linear'\)"):
        multilabel_ndcg(a, b.abs(), gain="log")
    with pytest.raises(ValueError, match=r"`empty_target` must be one of"):
        multilabel_ndcg(a, b.abs(), empty_target="nan")


def test_float8_and_sparse_inputs_are_refused_by_the_gate_naming_the_argument():
    # torch has no sorts or comparisons for float8 yet, nor these reductions on sparse tensors: without the gate's
    # check they failed deep inside torch ("aminmax_cpu" not implemented for 'Float8_e4m3fn').
    a, b = distinct_rows(19, n=4, c=5)
    calls = [
        (("preds", "reference"), lambda x, y, v: multilabel_rank_correlation(x, y, validate_args=v)),
        (("preds", "reference"), lambda x, y, v: multilabel_rank_correlation(x, y, method="kendall", validate_args=v)),
        (("preds_a", "preds_b"), lambda x, y, v: multilabel_kendall_distance_at_k(x, y, 3, validate_args=v)),
        (("preds", "relevance"), lambda x, y, v: multilabel_ndcg(x, y, 3, validate_args=v)),
    ]
    for names, call in calls:
        for validate_args in (True, False):
            for position, name in enumerate(names):
                for bad, words in ((torch.float8_e4m3fn, ["float8_e4m3fn", f"`{name}.float()`"]),
                                   ("sparse", ["sparse_coo", f"`{name}.to_dense()`"])):
                    args = [a, b.abs()]
                    args[position] = args[position].to_sparse() if bad == "sparse" else args[position].to(bad)
                    with pytest.raises(TypeError) as info:
                        call(*args, validate_args)
                    assert str(info.value).startswith(f"Argument `{name}` "), str(info.value)
                    assert all(word in str(info.value) for word in words), str(info.value)


def test_exponential_gains_of_the_smallest_grades_are_not_rounded_away():
    # 2**rel - 1 computed as exp2(rel) - 1 is 0 for rel below about 1e-16: a relevant label counted as irrelevant.
    preds = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.8, 0.4]], dtype=torch.float64)
    relevance = torch.tensor([[1e-17, 0.0, 3e-300], [0.0, 1e-20, 0.5]], dtype=torch.float64)
    for ties in ("max", "index", "expected"):
        got = multilabel_ndcg(preds, relevance, ties=ties)
        want = naive_ndcg(preds, relevance, None, "exponential", ties)
        assert got.item() == pytest.approx(want, rel=1e-12)
    first = multilabel_ndcg(preds[:1, :2], relevance[:1, :2])  # the one relevant label ranked first: 1, not 0
    assert first.item() == pytest.approx(1.0, rel=1e-12)


def test_exponential_gains_of_small_fractional_grades_keep_their_precision():
    # exp2(rel) - 1 keeps about 1e-16 / (rel ln 2) of a small grade's gain: 1.6e-6 at rel = 1e-10, which moved the
    # NDCG of a row of such grades in its eighth digit. Soft labels (a teacher's sigmoid) give grades this small.
    preds = torch.tensor([[0.5, 0.4, 0.3, 0.2, 0.1], [0.1, 0.9, 0.3, 0.7, 0.5]], dtype=torch.float64)
    relevance = torch.tensor([[1e-10, 3e-10, 7e-10, 2e-10, 5e-10], [0.25, 1e-7, 0.999, 3e-12, 0.5]],
                             dtype=torch.float64)
    for ties in ("max", "index", "expected"):
        for k in (None, 2):
            got = multilabel_ndcg(preds, relevance, k, ties=ties)
            want = naive_ndcg(preds, relevance, k, "exponential", ties)
            assert got.item() == pytest.approx(want, rel=1e-13, abs=0), (ties, k)
    # Whole grades in a floating tensor still give exactly 2**rel - 1: the 0/1 case equals the retrieval NDCG.
    whole = torch.tensor([[0.0, 1.0, 2.0, 3.0, 1.0]], dtype=torch.float64)
    assert multilabel_ndcg(preds[:1], whole).item() == multilabel_ndcg(preds[:1], whole.long()).item()


def test_relevance_errors_point_to_the_fix():
    """Marks of unknown labels and grades too large for exponential gains: the error names the rule broken, the
    distinct values, and the option that takes them; the metric's sums stay as they were."""
    preds = torch.tensor([[0.9, 0.1, 0.5, 0.3], [0.2, 0.8, 0.4, 0.6], [0.3, 0.2, 0.1, 0.7]])
    marks = torch.tensor([[1, -1, 0, 2], [0, 0, -1, 1], [2, 1, 0, -1]])
    with pytest.raises(ValueError, match=r"must be non-negative and finite, but found the values \[-1\] \(first at "
                                         r"index \(0, 1\)\).*Fix: if they mark unknown labels, pass `ignore_index=-1`"):
        multilabel_ndcg(preds, marks)
    with_nan = torch.where(marks < 0, math.nan, marks.double())
    with pytest.raises(ValueError, match=r"found the values \[nan\].*pass `ignore_index=-1` after "
                                         r"`relevance.nan_to_num\(-1\)`"):
        multilabel_ndcg(preds, with_nan)
    # Following each fix gives the value of the marks left out.
    expected = naive_ndcg(preds, marks, None, "exponential", "max", ignore_index=-1)
    assert multilabel_ndcg(preds, marks, ignore_index=-1).item() == pytest.approx(expected, rel=1e-12)
    assert multilabel_ndcg(preds, with_nan.nan_to_num(-1), ignore_index=-1).item() == pytest.approx(expected, rel=1e-12)
    large = marks.clamp(min=0) * 1000
    with pytest.raises(ValueError) as info:
        multilabel_ndcg(preds, large)
    message = str(info.value)
    assert 'must be below 1024 with gain="exponential"' in message and "non-negative" not in message, message
    assert "found the values [2000]" in message and 'pass `gain="linear"`' in message, message
    both = torch.tensor([[-2.0, 3000.0, 0.0, 1.0]] * 3)
    with pytest.raises(ValueError, match=r"must be non-negative and finite and below 1024 .*\[-2.0, 3000.0\].*"
                                         r"`ignore_index=-2`.*`gain=\"linear\"`"):
        multilabel_ndcg(preds, both)
    with pytest.raises(ValueError) as info:  # several kinds of negative values: no mark to name
        multilabel_ndcg(preds, torch.tensor([[-2.0, -1.0, 0.0, 1.0]] * 3))
    assert "ignore_index" not in str(info.value) and "[-2.0, -1.0]" in str(info.value), str(info.value)
    metric = MultilabelNDCG(4)
    metric.update(preds, marks.clamp(min=0))
    held = {name: value.clone() for name, value in metric.metric_state.items()}
    with pytest.raises(ValueError, match=r"ignore_index=-1"):
        metric.update(preds, marks)
    assert all(torch.equal(held[name], value) for name, value in metric.metric_state.items())


def test_swapped_ndcg_arguments_are_called_swapped():
    """Integer grades first and float scores second: the error says the arguments look swapped (converting the grades
    with ``.float()``, the fix for integer scores, would score the labels by the scores)."""
    probs = torch.tensor([[0.9, 0.2, 0.7, 0.1], [0.3, 0.8, 0.6, 0.4]])
    labels = torch.tensor([[1, 0, 0, 1], [0, 1, 1, 0]])
    with pytest.raises(TypeError, match=r"`preds` must be a floating point tensor of scores, but got dtype "
                                        r"torch.int64, and `relevance` has the floating dtype torch.float32.*look "
                                        r"swapped.*`multilabel_ndcg\(preds=scores, relevance=grades\)`"):
        multilabel_ndcg(labels, probs)
    with pytest.raises(TypeError, match=r"look swapped.*`metric.update\(preds=scores, relevance=grades\)` on your "
                                        r"MultilabelNDCG"):
        MultilabelNDCG(4).update(labels, probs)
    with pytest.raises(TypeError, match=r"look swapped.*`metric\(preds=scores, relevance=grades\)` on your "
                                        r"MultilabelNDCG"):
        MultilabelNDCG(4)(labels.bool(), probs)
    with pytest.raises(TypeError, match=r"`preds.float\(\)`"):  # integer scores and integer grades: convert
        multilabel_ndcg(labels, labels)


def _pair_calls():
    """Every update of two score tensors, as (argument names, call)."""
    return [
        (("preds", "reference"), lambda a, b: multilabel_rank_correlation(a, b)),
        (("preds", "reference"), lambda a, b: multilabel_rank_correlation(a, b, method="kendall")),
        (("preds_a", "preds_b"), lambda a, b: multilabel_kendall_distance_at_k(a, b, 3)),
        # k at least the row's length: no scan for the top k, the rows are sorted (their own NaN check)
        (("preds_a", "preds_b"), lambda a, b: multilabel_kendall_distance_at_k(a, b, a.shape[1])),
    ]


def _with_nan(value, where):
    value = value.clone()
    value[where] = math.nan
    return value


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_nan_in_either_input_raises_the_gate_error_on_every_path(dtype):
    # The compiled kernels check the scores for NaN in their own pass (the gate then reads nothing first): the
    # error is the gate's, naming the first argument that holds a NaN and its first index, on every engine and
    # chunking, wherever the NaN lies (a later chunk, the other argument too).
    a, b = tied_rows(19, n=30, c=40, levels=5, dtype=dtype)
    cases = [
        ((2, 7), None, 0, "(2, 7)"),
        (None, (29, 39), 1, "(29, 39)"),
        ((25, 0), (3, 1), 0, "(25, 0)"),  # a's NaN in a later chunk than b's: a is named, as the gate names it
        (slice(None), None, 0, "(0, 0)"),
    ]
    for names, call in _pair_calls():
        for in_a, in_b, named, index in cases:
            bad_a = a if in_a is None else _with_nan(a, in_a)
            bad_b = b if in_b is None else _with_nan(b, in_b)
            message = rf"Argument `{names[named]}` contains NaN \(first at index {re.escape(index)}\); NaN scores cannot"
            for engine, chunk in [("sort", None), ("auto", None), ("auto", 3 * 40)]:
                with use_engine(engine, chunk):
                    with pytest.raises(ValueError, match=message):
                        call(bad_a, bad_b)
                    call(a, b)  # the same tensors without NaN pass


def test_nan_leaves_a_metric_state_unchanged_on_the_compiled_path():
    a, b = tied_rows(20, n=30, c=40, levels=5)
    for metric in (MultilabelRankCorrelation(40), MultilabelRankCorrelation(40, method="kendall"),
                   MultilabelKendallDistanceAtK(40, k=4)):
        for engine, chunk in [("auto", None), ("auto", 3 * 40), ("sort", None)]:
            with use_engine(engine, chunk):
                metric.reset()
                metric.update(a[:10], b[:10])
                before = {name: getattr(metric, name).clone() for name in metric._defaults}
                for bad in ((_with_nan(a[10:], (15, 3)), b[10:]), (a[10:], _with_nan(b[10:], (0, 0)))):
                    for call in (metric.update, metric):
                        with pytest.raises(ValueError, match="contains NaN"):
                            call(*bad)
                        for name, value in before.items():
                            assert torch.equal(getattr(metric, name), value), (engine, chunk, name)


class _OpNames(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.skipif("auto" not in ENGINES, reason="needs numba")
def test_the_compiled_path_reads_the_scores_for_nan_in_its_own_pass():
    a, b = distinct_rows(21, n=20, c=30)
    for _, call in _pair_calls():
        with _OpNames() as recorder:
            call(a, b)
        assert not [name for name in recorder.names if "aminmax" in name or "isnan" in name], recorder.names
        with use_engine("sort"), _OpNames() as recorder:
            call(a, b)
        assert [name for name in recorder.names if "aminmax" in name]  # the torch path keeps the gate's check
    # validate_args=False: no check anywhere, no error
    bad = _with_nan(a, (1, 1))
    multilabel_kendall_distance_at_k(bad, b, 3, validate_args=False)
    multilabel_rank_correlation(bad, b, validate_args=False)
    wide_a, wide_b = distinct_rows(24, n=8, c=150)  # the scan for the top k, NaN left in
    wide_a[:4, ::3] = math.nan
    wide_b[2:6] = math.nan
    for k in (1, 4, 9):
        multilabel_kendall_distance_at_k(wide_a, wide_b, k, validate_args=False)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_long_rows_rank_exactly(engine, dtype):
    # More than 1024 distinct ranks (a deeper trie of Kendall's counts), 8 radix passes for float64, more chunks
    # than the scan's buffer holds; with and without ties.
    distinct = distinct_rows(22, n=3, c=1500, dtype=dtype)
    tied = tied_rows(23, n=4, c=1500, levels=700, dtype=dtype)
    for a, b in (distinct, tied):
        with use_engine(engine):
            for method in ("spearman", "kendall"):
                close(multilabel_rank_correlation(a, b, method=method), scipy_mean(a, b, method)[0], method)
            for k in (10, 40):
                close(multilabel_kendall_distance_at_k(a, b, k), naive_distance(a, b, k), f"k={k}")


def test_checkpoints_round_trip_and_refuse_other_options():
    a, b = tied_rows(18, n=30, c=7)
    grades = torch.nan_to_num(b, posinf=5.0, neginf=-5.0).abs() % 3
    cases = [
        (lambda **o: MultilabelNDCG(7, **{"k": 3, **o}), grades, [dict(k=4), dict(gain="linear"), dict(ties="index"),
                                                                  dict(ignore_index=-1), dict(k=None)]),
        (lambda **o: MultilabelRankCorrelation(7, **o), b, [dict(method="kendall")]),
        (lambda **o: MultilabelKendallDistanceAtK(7, **{"k": 3, **o}), b, [dict(k=2)]),
    ]
    for make, other, changes in cases:
        metric = make()
        metric.update(a[:17], other[:17])
        metric.persistent(True)  # torchmetrics leaves states out of state_dict unless asked
        state = metric.state_dict()
        assert set(state) == set(metric._defaults)
        resumed = make()
        resumed.load_state_dict(state)
        resumed.update(a[17:], other[17:])
        whole = make()
        whole.update(a, other)
        torch.testing.assert_close(resumed.compute(), whole.compute(), rtol=1e-13, atol=1e-15)
        for change in changes:
            refusing = make(**change)
            with pytest.raises(RuntimeError, match=r"checkpoint was made with .*: create the metric with the checkpoint"):
                refusing.load_state_dict(state)
        if isinstance(metric, MultilabelNDCG):  # empty_target changes compute only: the same sums load
            make(empty_target="skip").load_state_dict(state)
    for method in ("spearman", "kendall"):  # another metric's checkpoint: refused, naming the class that made it
        made_by = "MultilabelKendallDistanceAtK"
        with pytest.raises(RuntimeError, match=f"MultilabelRankCorrelation checkpoint was made by {made_by}: load it "
                                               f"into a {made_by}"):
            other = MultilabelKendallDistanceAtK(7, k=3)
            other.persistent(True)
            MultilabelRankCorrelation(7, method=method).load_state_dict(other.state_dict())


def test_states_are_float64_sums_with_distinct_names():
    names = []
    for make, _ in _metrics()[:2] + _metrics()[3:]:
        metric = make()
        assert list(metric._defaults)[0] == "options_tag"
        for name in list(metric._defaults)[1:]:
            assert metric._reductions[name].__name__ in ("dim_zero_sum", "sum"), name
            assert metric._defaults[name].dtype in (torch.float64, torch.int64)
        names += list(metric._defaults)[1:]
        metric.half()
        metric.to(torch.bfloat16)
        assert all(getattr(metric, n).dtype in (torch.float64, torch.int64) for n in list(metric._defaults)[1:])
    assert len(names) == len(set(names))


# ---------------------------------------------------------------------------------------------------------------
# what a training loop hands over


def test_grad_carrying_logits_inference_mode_and_bfloat16_autocast():
    torch.manual_seed(0)
    student, teacher = torch.nn.Linear(5, 9), torch.nn.Linear(5, 9)
    x = torch.randn(16, 5)
    logits = student(x)
    assert logits.requires_grad
    reference = teacher(x).detach()
    value = multilabel_kendall_distance_at_k(logits, reference, 4)
    assert not value.requires_grad and student.weight.grad is None
    close(value, naive_distance(logits.detach(), reference, 4))
    rho = multilabel_rank_correlation(logits, teacher(x))
    close(rho, scipy_mean(logits.detach(), reference, "spearman")[0])
    grades = (reference.abs() * 2).round()
    close(multilabel_ndcg(logits, grades, 3), naive_ndcg(logits.detach(), grades, 3, "exponential", "max"))
    with torch.inference_mode():
        metric = MultilabelKendallDistanceAtK(9, k=4)
        inference_logits = student(x)
    metric.update(logits, reference)
    metric.update(inference_logits, reference)
    close(metric.compute(), naive_distance(logits.detach(), reference, 4))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = student(x)
        low_reference = teacher(x).detach()
    assert low.dtype == torch.bfloat16
    for engine in ENGINES:
        with use_engine(engine):
            close(multilabel_kendall_distance_at_k(low, low_reference, 4),
                  naive_distance(low.detach().float(), low_reference.float(), 4), engine)
            close(multilabel_rank_correlation(low, low_reference, method="kendall"),
                  scipy_mean(low.detach().float(), low_reference.float(), "kendall")[0], engine)


# ---------------------------------------------------------------------------------------------------------------
# no host-device sync in update (checked on the meta device, as tests/test_sync.py does for lwlrap and LRAP)


@pytest.mark.parametrize("validate_args", [False, True], ids=["unchecked", "checked"])
@pytest.mark.parametrize("extra", [(), (2,)], ids=["2-d", "extra dimension"])
def test_update_reads_the_host_only_for_value_checks(validate_args, extra):
    # Off the CPU the torch path ranks: on a GPU each read of a value on the host waits for the device.
    from tests.test_sync import META, HostReads

    g = torch.Generator().manual_seed(4)
    shape = (40, 7) + extra
    a, b = torch.randint(0, 4, shape, generator=g).float(), torch.randint(0, 4, shape, generator=g).float()
    grades = torch.randint(0, 3, shape, generator=g)
    grades[torch.rand(shape, generator=g) < 0.2] = -1
    weight = torch.rand(shape[:1], generator=g, dtype=torch.float64)
    a, b, grades, weight = (t.to(META) for t in (a, b, grades, weight))
    calls = [
        (MultilabelNDCG(7, 3, ties="expected", ignore_index=-1, validate_args=validate_args),
         lambda m: m.update(a, grades, sample_weight=weight)),
        (MultilabelNDCG(7, gain="linear", validate_args=validate_args), lambda m: m.update(a, grades.clamp(min=0))),
        (MultilabelRankCorrelation(7, validate_args=validate_args), lambda m: m.update(a, b)),
        (MultilabelRankCorrelation(7, method="kendall", validate_args=validate_args), lambda m: m.update(a, b)),
        (MultilabelKendallDistanceAtK(7, 3, validate_args=validate_args), lambda m: m.update(a, b)),
    ]
    for metric, update in calls:
        metric = metric.to(META)
        with HostReads() as mode:
            update(metric)
        assert mode.reads == (["aten._local_scalar_dense.default"] if validate_args else []), type(metric).__name__
        assert all(getattr(metric, name).device == META for name in metric._defaults)


@pytest.mark.parametrize("call", ["correlation", "distance", "ndcg"])
def test_an_engine_forced_to_a_backend_that_cannot_take_the_scores_warns_as_lwlrap_does(monkeypatch, call):
    # triton forced on CPU tensors: the torch path ranks them (the values stay exact) and the warning says so, once.
    from torch_lwlrap import EngineFallbackWarning, _dispatch

    monkeypatch.setattr(_dispatch, "_warned", set())
    a, b = tied_rows(5, n=12, c=6)
    run = {
        "correlation": lambda: multilabel_rank_correlation(a, b, method="kendall"),
        "distance": lambda: multilabel_kendall_distance_at_k(a, b, 2),
        "ndcg": lambda: multilabel_ndcg(a, b.abs().nan_to_num(posinf=3.0) % 4),
    }[call]
    want = run()
    with use_engine("triton"):
        with pytest.warns(EngineFallbackWarning, match=r"the triton engine cannot rank cpu tensors.*torch sort path"):
            got = run()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per cause
            run()
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, equal_nan=True)
    with use_engine("sort"), warnings.catch_warnings():
        warnings.simplefilter("error")  # a torch engine is what it asks for: nothing to say
        run()


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_unsigned_grades_torch_cannot_compare_are_refused_with_the_fix(name):
    if not hasattr(torch, name):
        pytest.skip(f"this torch has no {name}")
    preds, relevance, _ = graded(3, n=4, c=5)
    relevance = (relevance / 0.75).round()  # whole grades
    with pytest.raises(TypeError, match=rf"`relevance` has dtype torch.{name}.*convert the grades with `relevance.long\(\)`"):
        multilabel_ndcg(preds, relevance.to(getattr(torch, name)))
    metric = MultilabelNDCG(5)
    with pytest.raises(TypeError, match=r"`relevance.long\(\)`"):
        metric.update(preds, relevance.to(getattr(torch, name)))
    metric.update(preds, relevance.long())
    close(metric.compute(), multilabel_ndcg(preds, relevance).item())
