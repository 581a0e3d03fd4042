"""Per-positive counts (``_ranking.label_counts_chunks``) and the tie rules over them (``label_precision``).

Every engine path is compared with a naive loop written from the definitions, and the precisions with exact
fractions: the rules' formulas for "max" and "index", and for "expected" the mean over every order of the tied
labels, enumerated.
"""

from __future__ import annotations

import importlib.util
import itertools
from fractions import Fraction

import pytest
import torch

from tests.reference import label_precisions
from torch_lwlrap._ranking import LabelCounts, label_counts_chunks, label_precision, use_engine
from torch_lwlrap._tie_rules import harmonic_sums

HAS_NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed (pip install numba: the cpu extra)")
FIELDS = LabelCounts._fields[1:]


def naive_counts(preds, target, ignore_index=None):
    """Dense counts by a loop over every positive and every label of its row."""
    preds, target = preds.tolist(), target.tolist()
    out = {name: [[0] * len(row) for row in preds] for name in LabelCounts._fields}
    for i, (scores, labels) in enumerate(zip(preds, target)):
        known = [k for k in range(len(labels)) if ignore_index is None or labels[k] != ignore_index]
        positives = {k for k in known if labels[k] == 1}
        for j in positives:
            s = scores[j]
            above = [k for k in known if scores[k] > s]
            tied = [k for k in known if scores[k] == s]
            before = [k for k in tied if k < j]
            values = dict(
                positive=True,
                above=len(above),
                above_positive=len(positives.intersection(above)),
                tied=len(tied),
                tied_positive=len(positives.intersection(tied)),
                tied_before=len(before),
                tied_positive_before=len(positives.intersection(before)),
            )
            for name, value in values.items():
                out[name][i][j] = value
    return out


def exact_expected(scores, known, positives):
    """{j: mean precision of j over every order of the row's tied labels} with exact fractions."""
    total = {j: Fraction(0) for j in positives}
    orders = 0
    for order in itertools.permutations(known):
        if any(scores[a] < scores[b] for a, b in zip(order, order[1:])):
            continue  # not a ranking of these scores
        orders += 1
        hits = 0
        for rank, k in enumerate(order, 1):
            if k in positives:
                hits += 1
                total[k] += Fraction(hits, rank)
    return {j: value / orders for j, value in total.items()}


def tie_heavy_case(seed, rows=40, num_classes=7, levels=3, ignore=True):
    generator = torch.Generator().manual_seed(seed)
    preds = torch.randint(levels, (rows, num_classes), generator=generator).to(torch.float32) / levels
    target = torch.randint(2, (rows, num_classes), generator=generator)
    if ignore:
        target[torch.rand(rows, num_classes, generator=generator) < 0.2] = -1
    return preds, target


def all_counts(preds, target, ignore_index=None):
    """The chunks of label_counts_chunks put back together into (N, C) tensors."""
    chunks = list(label_counts_chunks(preds, target, ignore_index))
    starts = [start for start, _ in chunks]
    assert starts == sorted(starts) and starts[0] == 0
    return LabelCounts(*(torch.cat(parts) for parts in zip(*(counts for _, counts in chunks))))


PATHS = ["sort", "count"] + (["numba"] if HAS_NUMBA else [])


def check_counts(preds, target, ignore_index=None, chunk_elements=None):
    want = naive_counts(preds.reshape(-1, preds.shape[-1]), target.reshape(-1, preds.shape[-1]), ignore_index)
    for path in PATHS:
        with use_engine(path, chunk_elements):
            got = all_counts(preds, target, ignore_index)
        for name in LabelCounts._fields:
            value = getattr(got, name)
            assert value.shape == preds.reshape(-1, preds.shape[-1]).shape
            assert value.dtype == (torch.bool if name == "positive" else torch.int32), (path, name)
            assert value.tolist() == want[name], (path, name, value.tolist(), want[name])


@pytest.mark.parametrize("ignore", [False, True])
@pytest.mark.parametrize("levels", [1, 2, 3, 50])
@pytest.mark.parametrize("chunk_elements", [None, 7, 30])
def test_counts_against_naive_loop(levels, ignore, chunk_elements):
    preds, target = tie_heavy_case(levels, rows=30, num_classes=9, levels=levels, ignore=ignore)
    check_counts(preds, target, -1 if ignore else None, chunk_elements)


def test_counts_special_values_and_dtypes():
    preds = torch.tensor(
        [
            [float("inf"), float("inf"), -float("inf"), 0.0, -0.0, 0.0],
            [-float("inf")] * 6,
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            [0.5] * 6,
        ]
    )
    target = torch.tensor([[1, 1, 1, 0, 1, -1], [1, 0, -1, 1, 1, 0], [1, 1, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1]])
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        check_counts(preds.to(dtype), target, ignore_index=-1)
    check_counts(preds.t().contiguous().t()[:, :5], target[:, :5].t().contiguous().t(), ignore_index=-1)


def test_counts_extra_dimensions_become_rows():
    preds, target = tie_heavy_case(3, rows=24, num_classes=5)
    preds3, target3 = preds.reshape(4, 6, 5).movedim(2, 1), target.reshape(4, 6, 5).movedim(2, 1)
    for path in PATHS:
        with use_engine(path, 11):
            got = all_counts(preds3, target3, -1)
        assert [getattr(got, name).tolist() for name in LabelCounts._fields] == [
            naive_counts(preds, target, -1)[name] for name in LabelCounts._fields
        ]


@needs_numba
@pytest.mark.parametrize("sort_above,block_rows", [(None, 128), (0, 3), (2, 1)])
def test_numba_counts_row_strategies(sort_above, block_rows):
    """Counted and sorted rows give the same counts (the sort is forced with sort_above=0)."""
    from torch_lwlrap import _numba_counts

    preds, target = tie_heavy_case(5, rows=50, num_classes=12, levels=4)
    known = target != -1
    positive = (target == 1) & known
    want = naive_counts(preds, target, -1)
    for max_positives in (1, 7, 10**6):
        known_count, blocks = _numba_counts.label_counts_numba(
            preds, positive, known, sort_above=sort_above, block_rows=block_rows, check_nan=True,
            max_positives=max_positives,
        )
        assert known_count.tolist() == known.sum(1).tolist()
        blocks = list(blocks)
        assert not any(block.nan_found for block in blocks)
        assert len(blocks) > 1 or max_positives > 7
        rows, cols = torch.cat([b.rows for b in blocks]), torch.cat([b.cols for b in blocks])
        assert (rows * 12 + cols).tolist() == positive.reshape(-1).nonzero().squeeze(1).tolist()
        for name in FIELDS:
            got = torch.cat([getattr(b.counts, name) for b in blocks])
            assert got.tolist() == [want[name][r][c] for r, c in zip(rows.tolist(), cols.tolist())]
    preds[3, 4] = float("nan")
    blocks = _numba_counts.label_counts_numba(preds, positive, known, check_nan=True, max_positives=5)[1]
    assert [block.nan_found for block in blocks].count(True) == 1


@needs_numba
@pytest.mark.parametrize("levels", [2, 6, 1000])
@pytest.mark.parametrize("sort_above,block_rows", [(None, 128), (0, 3), (3, 1)])
def test_numba_deferred_counts_and_untied_sums(levels, sort_above, block_rows):
    """With defer_untied, the pass writes out the counts of exactly the positives that tie another known label (every
    positive of a sorted row) and sums the others' precisions, (A_p + 1) / (A + 1), per class and per row."""
    from torch_lwlrap import _numba_counts, _numba_kernel

    preds, target = tie_heavy_case(levels, rows=60, num_classes=9, levels=levels)
    preds[::4, 1] = preds[::4, 4]  # ties on rows with few of them too
    known = target != -1
    positive = (target == 1) & known
    want = naive_counts(preds, target, -1)
    sorted_rows = positive.sum(1) > (_numba_kernel.sort_min_positives(9) if sort_above is None else sort_above)
    deferred_cells, class_sum, row_sum = [], [Fraction(0)] * 9, [Fraction(0)] * 60
    for i, j in positive.nonzero().tolist():
        if want["tied"][i][j] > 1 or sorted_rows[i]:
            deferred_cells.append(i * 9 + j)
        else:
            precision = Fraction(want["above_positive"][i][j] + 1, want["above"][i][j] + 1)
            class_sum[j] += precision
            row_sum[i] += precision
    assert 0 < len(deferred_cells) < int(positive.sum()) or sort_above == 0
    for max_positives in (1, 10, 10**6):
        blocks = list(_numba_counts.label_counts_numba(
            preds, positive, known, sort_above=sort_above, block_rows=block_rows, max_positives=max_positives,
            defer_untied=True,
        )[1])
        assert len(blocks) > 1 or max_positives > 10
        rows, cols = torch.cat([b.rows for b in blocks]), torch.cat([b.cols for b in blocks])
        assert (rows * 9 + cols).tolist() == deferred_cells
        for name in FIELDS:
            got = torch.cat([getattr(b.counts, name) for b in blocks])
            if name == "tied_before":  # not counted: only "index" needs it, and it never takes this pass
                assert got.tolist() == [-1] * len(deferred_cells)
                continue
            assert got.tolist() == [want[name][r][c] for r, c in zip(rows.tolist(), cols.tolist())], name
        assert [b.untied.start for b in blocks] == list(itertools.accumulate(
            [0] + [b.untied.sample_label_count.numel() for b in blocks[:-1]]))
        got_class = sum(b.untied.class_precision_sum for b in blocks)
        assert got_class.tolist() == pytest.approx([float(v) for v in class_sum], rel=1e-15, abs=0)
        got_rows = torch.cat([b.untied.sample_precision_sum for b in blocks])
        assert got_rows.tolist() == pytest.approx([float(v) for v in row_sum], rel=1e-15, abs=0)
        assert sum(b.untied.class_label_count for b in blocks).tolist() == positive.sum(0).tolist()
        assert torch.cat([b.untied.sample_label_count for b in blocks]).tolist() == positive.sum(1).tolist()


@pytest.mark.parametrize("ties", ["max", "index"])
def test_precision_matches_rule_definitions(ties):
    preds, target = tie_heavy_case(8, rows=30, num_classes=7)
    for path in PATHS:
        with use_engine(path):
            precision = label_precision(all_counts(preds, target, -1), ties)
        assert precision.dtype == torch.float64
        for i, (scores, labels) in enumerate(zip(preds.tolist(), target.tolist())):
            known = [k for k in range(7) if labels[k] != -1]
            want = label_precisions(scores, known, [k for k in known if labels[k] == 1], ties)
            for j in range(7):
                assert precision[i, j].item() == float(want.get(j, 0)), (path, i, j)


@pytest.mark.parametrize("levels", [1, 2, 3])
def test_expected_precision_is_mean_over_every_tie_order(levels):
    """C <= 7, heavy ties, ignored labels: the mean over the enumerated orders, exactly (1e-12 relative)."""
    preds, target = tie_heavy_case(levels, rows=25, num_classes=7, levels=levels)
    for path in PATHS:
        with use_engine(path):
            precision = label_precision(all_counts(preds, target, -1), "expected")
        for i, (scores, labels) in enumerate(zip(preds.tolist(), target.tolist())):
            known = [k for k in range(7) if labels[k] != -1]
            want = exact_expected(scores, known, {k for k in known if labels[k] == 1})
            for j in range(7):
                got = precision[i, j].item()
                if j not in want:
                    assert got == 0
                else:
                    assert abs(Fraction(got) - want[j]) <= want[j] * Fraction(1, 10**12), (path, i, j)


#: The evaluations of "expected": the torch expressions (any device; the torch engines) and the compiled CPU pass.
EVALUATIONS = ["sort"] + (["numba"] if HAS_NUMBA else [])


@pytest.mark.parametrize("engine", EVALUATIONS)
def test_expected_formula_on_wide_rows_against_fractions(engine):
    """Wide rows (A up to 10^6, g up to 3000): the closed form against the issue's sum, in exact fractions."""
    cases = [(a, ap, g, p) for a in (0, 5, 31, 32, 33, 100, 10**4, 10**6) for g in (1, 2, 3, 40, 3000)
             for ap, p in ((0, 1), (a // 2, max(1, g // 2)), (a, g))]
    fields = [torch.tensor(column, dtype=torch.int32) for column in zip(*cases)]
    above, above_positive, tied, tied_positive = fields
    counts = LabelCounts(torch.ones(len(cases), dtype=torch.bool), above, above_positive, tied, tied_positive,
                         torch.zeros_like(tied), torch.zeros_like(tied))
    with use_engine(engine):
        got = label_precision(counts, "expected").tolist()
    for (a, ap, g, p), value in zip(cases, got):
        share = Fraction(p - 1, g - 1) if g > 1 else Fraction(0)
        want = sum(((ap + 1 + (k - 1) * share) / Fraction(a + k) for k in range(1, g + 1)), Fraction(0)) / g
        assert abs(Fraction(value) - want) <= want * Fraction(1, 10**12), (a, ap, g, p, value, float(want))


@needs_numba
def test_compiled_and_torch_evaluations_of_expected_agree(monkeypatch):
    """Both evaluations over a grid that takes every branch (tables only, series with small and large g/x, r = 1),
    with the dense counts' non-positive entries (zeros) masked; and the torch engines never call the compiled one."""
    from torch_lwlrap import _numba_rules

    generator = torch.Generator().manual_seed(11)
    size = 20000
    above = torch.randint(0, 3000, (size,), generator=generator, dtype=torch.int32)
    above[: size // 4] = torch.randint(0, 40, (size // 4,), generator=generator, dtype=torch.int32)
    tied = torch.randint(1, 400, (size,), generator=generator, dtype=torch.int32)
    tied[::7] = 1
    tied[1::7] = 2
    tied_positive = torch.minimum(tied, torch.randint(1, 50, (size,), generator=generator, dtype=torch.int32))
    above_positive = torch.minimum(above, torch.randint(0, 50, (size,), generator=generator, dtype=torch.int32))
    positive = torch.rand(size, generator=generator) < 0.9
    counts = LabelCounts(positive, *(torch.where(positive, field, 0) for field in
                                     (above, above_positive, tied, tied_positive)), torch.zeros_like(tied),
                         torch.zeros_like(tied))
    with use_engine("numba"):
        compiled = label_precision(counts, "expected")
    with use_engine("sort"):
        monkeypatch.setattr(_numba_rules, "expected_precision", None)  # a call would fail
        plain = label_precision(counts, "expected")
    assert compiled.dtype == plain.dtype == torch.float64
    assert (compiled[~positive] == 0).all() and (plain[~positive] == 0).all()
    torch.testing.assert_close(compiled, plain, rtol=2e-15, atol=0)


@pytest.mark.parametrize("together", [True, False], ids=["one-call", "one-pair-per-call"])
def test_harmonic_sums_against_fractions(together):
    # One pair per call too: on the CPU a call skips the series when no entry needs it.
    pairs = [(a, g) for a in (0, 1, 7, 31, 32, 33, 64, 999, 10**5) for g in (0, 1, 2, 3, 31, 32, 33, 1000)]
    if together:
        s, t = harmonic_sums(torch.tensor([a for a, _ in pairs]), torch.tensor([g for _, g in pairs]))
        s, t = s.tolist(), t.tolist()
    else:
        sums = [harmonic_sums(torch.tensor([a]), torch.tensor([g])) for a, g in pairs]
        s, t = [v[0].item() for v in sums], [v[1].item() for v in sums]
    for (a, g), got_s, got_t in zip(pairs, s, t):
        want_s = sum((Fraction(1, a + k) for k in range(1, g + 1)), Fraction(0))
        want_t = sum((Fraction(k - 1, a + k) for k in range(1, g + 1)), Fraction(0))
        for got, want in ((got_s, want_s), (got_t, want_t)):
            assert abs(Fraction(got) - want) <= want * Fraction(1, 10**14), (a, g, got, float(want))


def test_rules_agree_without_ties():
    generator = torch.Generator().manual_seed(3)
    preds = torch.randn(40, 30, generator=generator, dtype=torch.float64)
    target = torch.randint(2, (40, 30), generator=generator)
    for path in PATHS:
        with use_engine(path):
            counts = all_counts(preds, target)
        values = [label_precision(counts, ties) for ties in ("max", "index", "expected")]
        torch.testing.assert_close(values[1], values[0], rtol=0, atol=0)
        torch.testing.assert_close(values[2], values[0], rtol=1e-15, atol=0)


def test_label_precision_rejects_unknown_rule():
    counts = next(label_counts_chunks(torch.zeros(1, 2), torch.ones(1, 2)))[1]
    with pytest.raises(ValueError, match="`ties` must be one of"):
        label_precision(counts, "min")
