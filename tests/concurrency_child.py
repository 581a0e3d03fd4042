"""Child programs for ``tests/test_concurrency.py``: each runs in its own interpreter, so a process that is killed
or aborts (numba's threading layers do both when misused) fails one test instead of taking pytest down.

Run as ``python -m tests.concurrency_child fork|threads``; prints ``OK`` when every check passed.
"""

from __future__ import annotations

import sys
import threading


class AlwaysParallel:
    """A stand-in for the runtime's speed choice that asks for the parallel variant every time, whatever the timings
    (on a shared test machine the serial variant may well be faster)."""

    def parallel_next(self, key):
        return True

    def record(self, key, parallel, seconds):
        pass


def _setup():
    import torch

    from torch_lwlrap import _numba_runtime

    # Enter parallel regions even for the small batches the naive reference can check, with two threads.
    _numba_runtime.PARALLEL_MIN_SCORES_PER_THREAD = 1
    _numba_runtime._choice = AlwaysParallel()
    torch.set_num_threads(2)
    return _numba_runtime


#: The Kendall distance's k on the pairs of :func:`_pair`: its scan serves k = 5 on 40 labels.
AGREEMENT_K = 5


def _pair(seed, levels):
    """Two score tensors of 150 x 40, three blocks of rows of the rank-agreement kernels: ``levels=4`` heavy ties
    and +-inf (the distance's sorted buffer and its sort), ``levels=10**6`` about distinct (its scan's placement)."""
    from tests.reference import make_case

    infinite = levels < 10
    first = make_case(seed, 150, 40, levels=levels, infinite=infinite)[0]
    return first, make_case(seed + 500, 150, 40, levels=levels, infinite=infinite)[0]


def _score(seed):
    """(lwlrap, lrap with ties="index", lwlrap with ties="expected", all with ignored labels; Spearman, Kendall and
    the distance at k of a tie-heavy pair, the distance of a pair without ties) of small batches, on the default
    engine: the ranking pass, the counts pass with the compiled tie rule and the rank-agreement kernels; then the
    bounds of the bootstrap interval of lwlrap from the function and from a metric updated in two batches (the
    bootstrap's compiled pass), equal bit for bit."""
    from tests.reference import make_case
    from torch_lwlrap import (
        MultilabelLWLRAP,
        multilabel_kendall_distance_at_k,
        multilabel_lrap,
        multilabel_lwlrap,
        multilabel_lwlrap_ci,
        multilabel_rank_correlation,
    )

    preds, target = make_case(seed, 150, 23, ignore_index=-1)
    interval = multilabel_lwlrap_ci(preds, target, ignore_index=-1, num_bootstrap=200, seed=seed)
    metric = MultilabelLWLRAP(num_labels=23, ignore_index=-1, num_bootstrap=200, bootstrap_seed=seed)
    metric.update(preds[:70], target[:70])
    metric.update(preds[70:], target[70:])
    low, high = metric.confidence_interval()
    assert (low.item(), high.item()) == (interval.low.item(), interval.high.item()), seed
    tied, distinct = _pair(seed, 4), _pair(seed, 10**6)
    return (
        multilabel_lwlrap(preds, target, ignore_index=-1).item(),
        multilabel_lrap(preds, target.float(), ignore_index=-1, ties="index").item(),
        multilabel_lwlrap(preds, target, ignore_index=-1, ties="expected").item(),
        multilabel_rank_correlation(*tied).item(),
        multilabel_rank_correlation(*tied, method="kendall").item(),
        multilabel_kendall_distance_at_k(*tied, AGREEMENT_K).item(),
        multilabel_kendall_distance_at_k(*distinct, AGREEMENT_K).item(),
        interval.low.item(),
        interval.high.item(),
    )


def _reference(seed):
    from tests.reference import make_case, naive_lrap, naive_lwlrap
    from tests.reference_ranking import naive_distance, scipy_mean

    preds, target = make_case(seed, 150, 23, ignore_index=-1)
    tied, distinct = _pair(seed, 4), _pair(seed, 10**6)
    return (
        naive_lwlrap(preds, target, ignore_index=-1),
        naive_lrap(preds, target, ignore_index=-1, ties="index"),
        naive_lwlrap(preds, target, ignore_index=-1, ties="expected"),
        scipy_mean(*tied, "spearman")[0],
        scipy_mean(*tied, "kendall")[0],
        naive_distance(*tied, AGREEMENT_K),
        naive_distance(*distinct, AGREEMENT_K),
    )


def _close(got, want):
    # The reference has no interval: the bounds are checked against the serial run and across processes.
    return len(got) == len(want) + 2 and all(abs(a - b) <= 1e-12 for a, b in zip(got, want))


class _ScoringDataset:
    """A dataset whose items are scored in the DataLoader worker that loads them."""

    def __len__(self):
        return 4

    def __getitem__(self, index):
        import torch

        return torch.tensor(_score(100 + index), dtype=torch.float64)


def fork_main() -> None:
    import multiprocessing

    import numba
    import torch

    kernel = _setup()
    seeds = list(range(6))
    parent = [_score(seed) for seed in seeds]  # starts numba's threads in the parent
    assert kernel._threads_started(), "the parent call should have started numba's threads"
    from torch_lwlrap import _ltr_numba

    for ltr_kernel in (_ltr_numba._correlation_kernel, _ltr_numba._distance_kernel):
        assert ltr_kernel.parallel.signatures, "the parent should have run the rank-agreement kernels in parallel"
    print("threading layer:", numba.threading_layer(), flush=True)
    want = [_reference(seed) for seed in seeds]
    assert all(_close(got, ref) for got, ref in zip(parent, want)), (parent, want)
    # torch's own OpenMP cannot enter a parallel region in a child forked after the parent used it (GNU OpenMP
    # hangs): a fork pool's workers pin torch to one thread, as DataLoader workers do by themselves.
    with multiprocessing.get_context("fork").Pool(2, initializer=torch.set_num_threads, initargs=(1,)) as pool:
        children = pool.map(_score, seeds)
    assert children == parent, (children, parent)
    # A DataLoader whose forked workers score.
    loader = torch.utils.data.DataLoader(
        _ScoringDataset(), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    loaded = [tuple(item.tolist()) for item in loader]
    assert all(_close(got, _reference(100 + i)) for i, got in enumerate(loaded)), loaded
    # The parent still ranks in parallel after its children.
    assert kernel.threads_for(150 * 23) == 2 and not kernel._serial_only
    assert [_score(seed) for seed in seeds] == parent
    print("OK", flush=True)


def threads_main() -> None:
    runtime = _setup()
    seeds = list(range(8))
    want = [_reference(seed) for seed in seeds]
    # Serial results: one thread at a time.
    serial = [_score(seed) for seed in seeds]
    assert all(_close(got, ref) for got, ref in zip(serial, want)), (serial, want)
    start = threading.Barrier(4)
    results = {}
    errors = []

    def worker(name):
        try:
            start.wait()
            results[name] = [_score(seed) for _ in range(3) for seed in seeds]
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(name,)) for name in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    for name in range(4):
        assert results[name] == serial * 3, name
    assert not runtime._parallel_lock.locked()
    print("OK", flush=True)


def one_thread_main() -> None:
    """``torch.set_num_threads(1)`` before anything: every public function and metric, the bootstrap's, the tie
    rules', the ranking family's and the rank-agreement compiled passes included, runs without starting numba's
    threads."""
    import torch

    from tests.reference import make_case
    from torch_lwlrap import (
        MultilabelKendallDistanceAtK,
        MultilabelLRAP,
        MultilabelLWLRAP,
        MultilabelNDCG,
        MultilabelRankCorrelation,
        MultilabelRankingMetrics,
        MultilabelTieReport,
        compare_lwlrap,
        multilabel_kendall_distance_at_k,
        multilabel_lrap_ci,
        multilabel_lwlrap,
        multilabel_lwlrap_ci,
        multilabel_ndcg,
        multilabel_rank_correlation,
        tie_report,
    )
    from torch_lwlrap import _numba_runtime

    _numba_runtime.PARALLEL_MIN_SCORES_PER_THREAD = 1  # any batch would take the parallel variant on 2 threads
    _numba_runtime._choice = AlwaysParallel()
    torch.set_num_threads(1)
    preds, target = make_case(3, 3000, 23, ignore_index=-1)
    for ties in ("max", "index", "expected"):
        multilabel_lwlrap(preds, target, ignore_index=-1, ties=ties)
    multilabel_lwlrap_ci(preds, target, ignore_index=-1, num_bootstrap=200, seed=0)
    multilabel_lrap_ci(preds, target.float(), ignore_index=-1, num_bootstrap=200, seed=0)
    compare_lwlrap(preds, preds * 0.5, target, ignore_index=-1, num_bootstrap=200, seed=0)
    tie_report(preds, target, ignore_index=-1)
    other = make_case(4, 3000, 23)[0]
    for method in ("spearman", "kendall"):
        multilabel_rank_correlation(preds, other, method=method)
    multilabel_kendall_distance_at_k(preds, other, 5)
    multilabel_ndcg(preds, target.clamp(min=0), k=5)
    for metric, inputs in (
        (MultilabelRankCorrelation(23, method="kendall"), (preds, other)),
        (MultilabelKendallDistanceAtK(23, k=5), (preds, other)),
        (MultilabelNDCG(23, k=5, ignore_index=-1), (preds, target)),
    ):
        metric(*inputs)
        metric.compute()
    for metric in (
        MultilabelLWLRAP(23, ignore_index=-1, num_bootstrap=200, bootstrap_seed=0),
        MultilabelLRAP(23, ignore_index=-1, num_bootstrap=200, bootstrap_seed=0),
        MultilabelTieReport(23, ignore_index=-1),
        MultilabelRankingMetrics(23, ignore_index=-1, ties="expected"),
    ):
        metric(preds, target)
        metric.compute()
    assert not _numba_runtime._threads_started(), "a compiled kernel started numba's threads"
    print("OK", flush=True)


if __name__ == "__main__":
    {"fork": fork_main, "threads": threads_main, "one-thread": one_thread_main}[sys.argv[1]]()
