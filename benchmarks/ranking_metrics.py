"""The ranking metrics beside lwlrap at 20k x 527 (AudioSet size): the one-pass collection against lwlrap alone.

    python -m benchmarks.ranking_metrics                 # CPU, 20,000 x 527, with the scikit-learn anchors
    python -m benchmarks.ranking_metrics --no-anchors    # library entries only
    python -m benchmarks.ranking_metrics --sizes 2000x527 --min-run-time 0.2
    python -m benchmarks.ranking_metrics --threads 1 --out benchmarks/results --name ranking_metrics_1thread

Every entry runs in the same process on the same inputs (``benchmarks.run.make_inputs``: float32 scores, bool
targets, 1-3 labels per row); the table gives each median and its ratio to ``multilabel_lwlrap`` alone. The
results (with the machine) go to ``<out>/<name>.json`` and ``.md`` (``ranking_metrics`` in the scratch folder by
default). Not a test: the test suite checks the values.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Optional, Sequence

import torch

from benchmarks.run import (
    add_output_arguments,
    machine_metadata,
    make_inputs,
    sizes_argument,
    time_fast,
    time_slow,
    warm_up,
    write_tables,
)
from torch_lwlrap import (
    MultilabelCoverageError,
    MultilabelLRAP,
    MultilabelLWLRAP,
    MultilabelOneError,
    MultilabelRankingLoss,
    MultilabelRankingMetrics,
    MultilabelRetrievalAtK,
    multilabel_lwlrap,
)

KS = (1, 5, 10)


def _metric_call(metric) -> Callable[[torch.Tensor, torch.Tensor], object]:
    def run(preds, target):
        metric.reset()
        metric.update(preds, target)
        return metric.compute()

    return run


def entries(num_labels: int, anchors: bool) -> Dict[str, Callable[[torch.Tensor, torch.Tensor], object]]:
    separate = [
        MultilabelLWLRAP(num_labels),
        MultilabelLRAP(num_labels),
        MultilabelCoverageError(num_labels),
        MultilabelRankingLoss(num_labels),
        MultilabelOneError(num_labels),
        MultilabelRetrievalAtK(num_labels, KS),
    ]

    def all_separately(preds, target):
        return [_metric_call(metric)(preds, target) for metric in separate]

    out = {
        "multilabel_lwlrap (baseline)": lambda p, t: multilabel_lwlrap(p, t),
        "MultilabelLWLRAP update+compute": _metric_call(MultilabelLWLRAP(num_labels)),
        "MultilabelRankingMetrics, all metrics, k = 1, 5, 10": _metric_call(MultilabelRankingMetrics(num_labels, k=KS)),
        "MultilabelRankingMetrics, validate_args=False": _metric_call(
            MultilabelRankingMetrics(num_labels, k=KS, validate_args=False)
        ),
        "MultilabelRankingMetrics, coverage + ranking loss only": _metric_call(
            MultilabelRankingMetrics(num_labels, metrics=("coverage_error", "ranking_loss"))
        ),
        "the six metric objects, one pass each": all_separately,
    }
    if anchors:
        from sklearn.metrics import coverage_error, label_ranking_loss

        def scikit_learn(preds, target):
            y, s = target.numpy(), preds.numpy()
            return coverage_error(y, s), label_ranking_loss(y, s)

        out["scikit-learn coverage_error + label_ranking_loss"] = scikit_learn
    return out


SLOW = ("scikit-learn",)


def run(sizes, min_run_time: float, anchors: bool) -> List[Dict]:
    records = []
    for num_samples, num_classes, density in sizes:
        preds, target = make_inputs(num_samples, num_classes, density)
        timings = {}
        for name, fn in entries(num_classes, anchors).items():
            warm_up(fn, preds, target)
            if name.startswith(SLOW):
                seconds = time_slow(lambda: fn(preds, target), 3, "cpu")
            else:
                seconds = time_fast(lambda: fn(preds, target), min_run_time)
            timings[name] = seconds
            print(f"{num_samples}x{num_classes}  {name}: {seconds * 1e3:.2f} ms", file=sys.stderr)
        baseline = timings["multilabel_lwlrap (baseline)"]
        records.append(
            {
                "num_samples": num_samples,
                "num_classes": num_classes,
                "density": density,
                "seconds": timings,
                "vs_lwlrap": {name: seconds / baseline for name, seconds in timings.items()},
            }
        )
    return records


def markdown(records: List[Dict]) -> str:
    lines = []
    for record in records:
        lines += [
            f"### {record['num_samples']:,} x {record['num_classes']}, {record['torch_threads']} torch thread(s)",
            "",
            "| entry | median time | vs lwlrap alone |",
            "| --- | ---: | ---: |",
        ]
        for name, seconds in record["seconds"].items():
            lines.append(f"| {name} | {seconds * 1e3:.1f} ms | {record['vs_lwlrap'][name]:.1f}x |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=sizes_argument, default="20000x527",
                        help="comma-separated NxC (default: 20000x527)")
    parser.add_argument("--min-run-time", type=float, default=1.0, help="seconds per timed entry (default: 1)")
    parser.add_argument("--no-anchors", action="store_true", help="skip scikit-learn")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    add_output_arguments(parser, "ranking_metrics")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    records = run(args.sizes, args.min_run_time, not args.no_anchors)
    for record in records:
        record["torch_threads"] = threads
    write_tables(args.out / args.name, {"machine": machine_metadata(["cpu"]), "cases": records}, markdown(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
