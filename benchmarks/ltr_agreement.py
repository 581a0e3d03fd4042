"""The rank correlations and the Kendall distance at k at 20k x 527 (AudioSet size), against their goals.

    python -m benchmarks.ltr_agreement                          # CPU, 20,000 x 527, with the scipy loops
    python -m benchmarks.ltr_agreement --sizes 2000x527 --min-run-time 0.05 --rounds 3 --scipy-rows 50

Goals (the issue that added these metrics): Spearman and Kendall each no slower than ``torch.argsort`` of both
inputs along dim 1, measured in the same run; the Kendall distance at k = 10 within 2x of ``multilabel_lwlrap``
alone; each at least 100x faster per row than a scipy loop. Every entry runs in the same process on the same inputs
(``benchmarks.run.make_inputs``: float32 scores without ties within a row, bool targets; the second system's scores
are the first's plus float32 noise). The scipy loops run on the first ``--scipy-rows`` rows and are compared per
row. The entries are timed in rounds (``--rounds``), each once a round in a rotating order: a goal's ratios come
from one round's timings, seconds apart, and their median is reported with their range, so that a change in the
machine's load between entries does not move a ratio. Results (with the machine) go to
``benchmarks/results/ltr_agreement.json`` and ``.md``. Not a test: the test suite checks the values.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from benchmarks.run import (
    add_output_arguments,
    count_argument,
    machine_metadata,
    make_inputs,
    sizes_argument,
    time_fast,
    time_slow,
    warm_up,
    write_tables,
)
from torch_lwlrap import (
    MultilabelKendallDistanceAtK,
    multilabel_kendall_distance_at_k,
    multilabel_lwlrap,
    multilabel_rank_correlation,
)

ARGSORT = "torch.argsort of both inputs (baseline)"
LWLRAP = "multilabel_lwlrap alone (baseline)"
SPEARMAN = "multilabel_rank_correlation, spearman"
KENDALL = "multilabel_rank_correlation, kendall"
DISTANCE = "multilabel_kendall_distance_at_k, k = 10"

#: Goals: entry -> (baseline, the most the ratio may be).
GOALS = {SPEARMAN: (ARGSORT, 1.0), KENDALL: (ARGSORT, 1.0), DISTANCE: (LWLRAP, 2.0)}

#: The scipy loop each entry is compared with per row.
SCIPY = {SPEARMAN: "scipy spearmanr loop", KENDALL: "scipy kendalltau loop", DISTANCE: "scipy kendalltau loop"}


def _metric_call(metric) -> Callable[[torch.Tensor, torch.Tensor], object]:
    def run(a, b):
        metric.reset()
        metric.update(a, b)
        return metric.compute()

    return run


def entries(num_labels: int) -> Dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], object]]:
    distance_metric = _metric_call(MultilabelKendallDistanceAtK(num_labels, k=10))
    return {
        ARGSORT: lambda a, b, t: (torch.argsort(a, dim=1), torch.argsort(b, dim=1)),
        LWLRAP: lambda a, b, t: multilabel_lwlrap(a, t),
        SPEARMAN: lambda a, b, t: multilabel_rank_correlation(a, b),
        KENDALL: lambda a, b, t: multilabel_rank_correlation(a, b, method="kendall"),
        DISTANCE: lambda a, b, t: multilabel_kendall_distance_at_k(a, b, 10),
        "MultilabelKendallDistanceAtK(k=10) update+compute": lambda a, b, t: distance_metric(a, b),
    }


def scipy_loops(rows: int) -> Dict[str, Callable[[torch.Tensor, torch.Tensor], object]]:
    from scipy.stats import kendalltau, spearmanr

    def loop(statistic):
        def run(a, b):
            x, y = a[:rows].double().numpy(), b[:rows].double().numpy()
            return [statistic(x[i], y[i]).statistic for i in range(len(x))]

        return run

    return {"scipy spearmanr loop": loop(spearmanr), "scipy kendalltau loop": loop(kendalltau)}


def run(sizes, min_run_time: float, scipy_rows: int, rounds: int = 5) -> List[Dict]:
    """Each size's entries and scipy loops, timed in ``rounds`` rounds, each entry once a round (``min_run_time``
    seconds, median per call) in an order that rotates from round to round. A goal's ratio and its speed-up over
    scipy are computed within each round, from timings seconds apart, and reported as medians over the rounds with
    their range: a machine whose load drifts moves all the timings of a round together."""
    records = []
    for num_samples, num_classes, density in sizes:
        a, target = make_inputs(num_samples, num_classes, density)
        noise = torch.randn(a.shape, generator=torch.Generator().manual_seed(1)) * a.std()
        b = a + noise
        rows = min(scipy_rows, num_samples)
        calls = {name: (lambda fn=fn: fn(a, b, target)) for name, fn in entries(num_classes).items()}
        slow = {name: (lambda fn=fn: fn(a, b)) for name, fn in scipy_loops(rows).items()}
        for call in calls.values():
            warm_up(call)
        names = list(calls) + list(slow)
        timings: Dict[str, List[float]] = {name: [] for name in names}
        for index in range(rounds):
            for name in names[index % len(names):] + names[: index % len(names)]:
                if name in calls:
                    timings[name].append(time_fast(calls[name], min_run_time))
                else:
                    timings[name].append(time_slow(slow[name], 3, "cpu"))
                print(f"round {index + 1}  {num_samples}x{num_classes}  {name}: {timings[name][-1] * 1e3:.2f} ms",
                      file=sys.stderr)
        rows_of = {name: rows if name in slow else num_samples for name in names}
        goals = {}
        for name, (baseline, most) in GOALS.items():
            ratios = [t / base for t, base in zip(timings[name], timings[baseline])]
            speedups = [
                (scipy / rows) / (t / num_samples) for t, scipy in zip(timings[name], timings[SCIPY[name]])
            ]
            ratio, speedup = statistics.median(ratios), statistics.median(speedups)
            goals[name] = {
                "vs": baseline, "ratio": ratio, "ratio_range": [min(ratios), max(ratios)], "goal": most,
                "scipy_speedup_per_row": speedup, "scipy_speedup_range": [min(speedups), max(speedups)],
                "met": ratio <= most and speedup >= 100,
            }
        seconds = {name: statistics.median(values) for name, values in timings.items()}
        records.append(
            {
                "num_samples": num_samples, "num_classes": num_classes, "scipy_rows": rows, "rounds": rounds,
                "rows": rows_of, "seconds": seconds, "seconds_per_round": timings,
                "seconds_per_row": {name: seconds[name] / rows_of[name] for name in names}, "goals": goals,
            }
        )
    return records


def markdown(records: List[Dict]) -> str:
    lines = []
    for record in records:
        lines += [
            f"### {record['num_samples']:,} x {record['num_classes']}, {record['torch_threads']} torch thread(s); "
            f"scipy loops on {record['scipy_rows']} rows; medians of {record['rounds']} rounds",
            "",
            "| entry | median time | per row |",
            "| --- | ---: | ---: |",
        ]
        for name, seconds in record["seconds"].items():
            rows = record["rows"][name]
            lines.append(f"| {name} | {seconds * 1e3:.1f} ms ({rows:,} rows) | {seconds / rows * 1e6:.2f} us |")
        lines += [
            "",
            "| goal | ratio (goal), rounds' range | per row vs scipy (goal >= 100x), rounds' range | met |",
            "| --- | ---: | ---: | --- |",
        ]
        for name, goal in record["goals"].items():
            low, high = goal["ratio_range"]
            slow, fast = goal["scipy_speedup_range"]
            met = "yes" if goal["met"] else "no"
            lines.append(
                f"| {name} vs {goal['vs']} | {goal['ratio']:.2f}x (<= {goal['goal']:g}x), {low:.2f}x to {high:.2f}x | "
                f"{goal['scipy_speedup_per_row']:,.0f}x, {slow:,.0f}x to {fast:,.0f}x | {met} |"
            )
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=sizes_argument, default="20000x527",
                        help="comma-separated NxC (default: 20000x527)")
    parser.add_argument("--min-run-time", type=float, default=0.2,
                        help="seconds per timed entry and round (default: 0.2)")
    parser.add_argument("--rounds", type=count_argument, default=5, help="rounds, each entry timed once a round (default: 5)")
    parser.add_argument("--scipy-rows", type=count_argument, default=400, help="rows the scipy loops score (default: 400)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    add_output_arguments(parser, "ltr_agreement")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.threads:
        torch.set_num_threads(args.threads)
    records = run(args.sizes, args.min_run_time, args.scipy_rows, args.rounds)
    for record in records:
        record["torch_threads"] = torch.get_num_threads()
    write_tables(args.out / args.name, {"machine": machine_metadata(["cpu"]), "cases": records}, markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
