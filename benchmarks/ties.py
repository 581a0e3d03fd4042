"""ties="expected" and the tie report against ties="max" on the default path, side by side: ``python -m benchmarks.ties``.

    python -m benchmarks.ties                          # 20,000 x 527, tables in benchmarks/out/ties.{json,md}
    python -m benchmarks.ties --out benchmarks/results  # the committed tables
    python -m benchmarks.ties --samples 32 --repeats 301 --name ties_32rows --out benchmarks/results

The entries rank the same inputs in alternation (so the machine's load weighs on all alike); the table gives the
median time of each and its ratio to ``"max"``. Cases at 20,000 x 527 (FSDKaggle2019's size, with AudioSet's label
count): sparse labels with continuous scores (no ties), the same scores saturated like float32 sigmoid outputs (many
ties at 1.0), denser labels, and constant scores (the challenge's all-zero sample submission: every label tied).
Not a test: the test suite checks the values.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, Optional, Sequence

import torch

from benchmarks.run import add_output_arguments, count_argument, machine_metadata, warm_up, write_tables
from torch_lwlrap import multilabel_lwlrap, tie_report

ENTRIES = {
    "max": lambda preds, target: multilabel_lwlrap(preds, target, ties="max"),
    "expected": lambda preds, target: multilabel_lwlrap(preds, target, ties="expected"),
    "tie_report": tie_report,
}


def cases(num_samples: int, num_classes: int):
    generator = torch.Generator().manual_seed(0)
    sparse = torch.rand(num_samples, num_classes, generator=generator) < 1.2 / num_classes
    logits = 6 * torch.randn(num_samples, num_classes, generator=generator) + 8 * sparse
    yield "1.2 labels per row, logits (no ties)", logits, sparse
    yield "1.2 labels per row, sigmoid(3 x logits) (ties at 1.0)", torch.sigmoid(3 * logits), sparse
    dense = torch.rand(num_samples, num_classes, generator=generator) < 0.05
    yield "5% labels, logits", 6 * torch.randn(num_samples, num_classes, generator=generator) + 8 * dense, dense
    yield "1.2 labels per row, all scores 0 (every label tied)", torch.zeros(num_samples, num_classes), sparse


def run(num_samples: int, num_classes: int, repeats: int) -> list:
    records = []
    for name, preds, target in cases(num_samples, num_classes):
        times: Dict[str, list] = {entry: [] for entry in ENTRIES}
        for fn in ENTRIES.values():
            warm_up(fn, preds, target)
        for _ in range(repeats):
            for entry, fn in ENTRIES.items():
                start = time.perf_counter()
                fn(preds, target)
                times[entry].append(time.perf_counter() - start)
        median = {entry: statistics.median(spent) for entry, spent in times.items()}
        tied_share = tie_report(preds, target).tied_share
        records.append({
            "case": name,
            "shape": [num_samples, num_classes],
            "tied_share": tied_share,
            "seconds": median,
            "vs_max": {entry: seconds / median["max"] for entry, seconds in median.items()},
        })
    return records


def markdown(records: list, machine: Dict) -> str:
    lines = [
        f"{machine['cpu']}, {machine['torch_threads']} torch threads, torch {machine['torch']} ({machine['date']})",
        "",
        "| case | tied positives | max | expected | tie_report | expected / max | tie_report / max |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for record in records:
        seconds, ratio = record["seconds"], record["vs_max"]
        lines.append(
            f"| {record['case']} ({record['shape'][0]:,} x {record['shape'][1]}) | {record['tied_share']:.0%} "
            f"| {seconds['max'] * 1e3:.2f} ms | {seconds['expected'] * 1e3:.2f} ms "
            f"| {seconds['tie_report'] * 1e3:.2f} ms | {ratio['expected']:.2f}x | {ratio['tie_report']:.2f}x |"
        )
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=527)
    parser.add_argument("--repeats", type=count_argument, default=21)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    add_output_arguments(parser, "ties")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    records = run(args.samples, args.classes, args.repeats)
    machine = machine_metadata(["cpu"])
    write_tables(args.out / args.name, {"machine": machine, "cases": records}, markdown(records, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
