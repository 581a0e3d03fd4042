"""Where sorting beats counting: the measurements behind the engine's two switch points.

* ``torch_lwlrap._ranking.COUNT_MAX_DENSITY``: the torch ``"auto"`` path (CPU without numba) counts while
  ``positives / (N * log2(C))`` stays below it, else sorts. Measured by timing the ``"sort"`` and ``"count"`` paths
  over label densities.
* ``torch_lwlrap._numba_kernel.SORT_POSITIVES_PER_LOG2``: the numba path sorts a row when it has more than this many
  positives per ``log2(C)``, else counts. Measured by timing the kernel with every row counted and every row
  sorted, over label densities.

Run ``python -m benchmarks.crossover`` (a few minutes on 2 cores; ``--quick`` for seconds). It prints the tables
and writes ``<out>/crossover.json`` and ``<out>/crossover.md``; the last column of each table is the measured ratio
and the density at which it crosses 1 is the switch point.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Dict, List, Optional, Sequence

import torch

from benchmarks.run import add_output_arguments, machine_metadata, make_inputs, time_fast, write_tables


def torch_paths(sizes: Sequence[tuple], densities: Sequence[float], device: str, min_run_time: float) -> List[Dict]:
    """Seconds of the torch "sort" and "count" paths per case; the ratio count / sort."""
    from torch_lwlrap._ranking import ranking_sums, use_engine

    rows = []
    for num_samples, num_classes in sizes:
        for density in densities:
            preds, target = make_inputs(num_samples, num_classes, density, device)
            times = {}
            for engine in ("sort", "count"):
                with use_engine(engine):
                    times[engine] = time_fast(lambda: ranking_sums(preds, target), min_run_time)
            positives = int(target.sum())
            rows.append(
                {
                    "device": device,
                    "N": num_samples,
                    "C": num_classes,
                    "density": density,
                    "positives / (N log2 C)": positives / (num_samples * math.log2(num_classes)),
                    "sort ms": times["sort"] * 1e3,
                    "count ms": times["count"] * 1e3,
                    "count / sort": times["count"] / times["sort"],
                }
            )
            print(_row_text(rows[-1]), file=sys.stderr, flush=True)
    return rows


def numba_rows(sizes: Sequence[tuple], densities: Sequence[float], min_run_time: float) -> List[Dict]:
    """Seconds of the numba kernel with every row counted and with every row sorted; the ratio."""
    from torch_lwlrap import _numba_kernel
    from torch_lwlrap._ranking import RankingSums

    rows = []
    for num_samples, num_classes in sizes:
        for density in densities:
            preds, target = make_inputs(num_samples, num_classes, density)
            times = {}
            for name, sort_above in (("count", num_classes), ("sort", 0)):

                def call(sort_above=sort_above):
                    sums = RankingSums.zeros(num_samples, num_classes)
                    _numba_kernel.ranking_sums_numba(preds, target, None, *sums, sort_above=sort_above)

                times[name] = time_fast(call, min_run_time)
            positives_per_row = int(target.sum()) / num_samples
            rows.append(
                {
                    "device": "cpu (numba)",
                    "N": num_samples,
                    "C": num_classes,
                    "density": density,
                    "positives per row / log2 C": positives_per_row / math.log2(num_classes),
                    "sort ms": times["sort"] * 1e3,
                    "count ms": times["count"] * 1e3,
                    "count / sort": times["count"] / times["sort"],
                }
            )
            print(_row_text(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _row_text(row: Dict) -> str:
    return "  ".join(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}" for key, value in row.items())


def markdown(title: str, rows: List[Dict]) -> List[str]:
    if not rows:
        return []
    keys = list(rows[0])
    lines = [f"## {title}", "", "| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{row[key]:.3g}" if isinstance(row[key], float) else str(row[key]) for key in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.crossover", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test; the numbers mean little)")
    add_output_arguments(parser, None, "crossover, or crossover-quick with --quick")
    args = parser.parse_args(argv)
    min_run_time = 0.05 if args.quick else 0.5
    densities = [0.02, 0.3] if args.quick else [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8]
    torch_sizes = [(200, 64)] if args.quick else [(20_000, 80), (5_000, 527), (500, 10_000)]
    report: Dict = {"metadata": machine_metadata(["cpu"]), "torch": [], "numba": []}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        sizes = torch_sizes if device == "cpu" or args.quick else [(n * 20, c) for n, c in torch_sizes]
        report["torch"] += torch_paths(sizes, densities, device, min_run_time)
    from torch_lwlrap import _numba_kernel

    if _numba_kernel.is_available("cpu"):
        numba_sizes = [(200, 64)] if args.quick else [(5_000, 80), (2_000, 527), (200, 2_000), (100, 10_000)]
        report["numba"] = numba_rows(numba_sizes, densities, min_run_time)
    lines = [
        "# Where sorting beats counting",
        "",
        f"- Date: {report['metadata']['date']}; commit `{report['metadata'].get('git_commit')}`; CPU: "
        f"{report['metadata']['cpu']} ({report['metadata']['cpu_count']} cores); GPU: {report['metadata']['gpu']}",
        "- Command: `python -m benchmarks.crossover" + (" --quick" if args.quick else "") + "`",
        "",
        "A ratio `count / sort` above 1 means sorting is faster.",
        "",
    ]
    lines += markdown("torch paths (`COUNT_MAX_DENSITY` applies to `positives / (N log2 C)`)", report["torch"])
    lines += markdown("numba row strategies (`SORT_POSITIVES_PER_LOG2` applies to the positives of a row / log2 C)",
                      report["numba"])
    name = args.name or ("crossover-quick" if args.quick else "crossover")
    write_tables(args.out / name, report, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
