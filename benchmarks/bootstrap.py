"""What the Poisson bootstrap costs an update: side by side with the plain update, as ratios.

For each case (``N x C``, ``B`` replicates) it times, on the same batch and in the same run (the plain and the
bootstrap update alternating, medians of the rounds):

* ``plain``: ``MultilabelLWLRAP.update`` (and ``MultilabelLRAP.update``) with ``validate_args=False``;
* ``bootstrap``: the same with ``num_bootstrap=B``;
* the two parts of the bootstrap update: the per-positive precisions (the ranking) and the replicate sums (drawing
  and adding the weights, :func:`torch_lwlrap.stats._bootstrap.add_class_sums_`);

and the peak bytes of the temporaries one bootstrap update creates: peak RSS added by the call in a fresh process
(the CPU path; numba's arrays included), and the tensors followed on the ``meta`` device (the path that runs on a
GPU) for growing ``N`` and ``B``. The classic bootstrap (torchmetrics' ``BootStrapper``) costs about ``B`` plain
updates.

Run ``python -m benchmarks.bootstrap`` (``--quick`` for a few seconds). It prints the tables and writes
``<out>/bootstrap.json`` and ``<out>/bootstrap.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import torch

from benchmarks.run import (
    _status_kib, add_output_arguments, machine_metadata, make_inputs, time_fast, warm_up, write_tables,
)

MiB = 1 << 20


def _metric(kind: str, num_classes: int, num_bootstrap: int):
    from torch_lwlrap import MultilabelLRAP, MultilabelLWLRAP

    cls = MultilabelLWLRAP if kind == "lwlrap" else MultilabelLRAP
    return cls(num_classes, validate_args=False, num_bootstrap=num_bootstrap, bootstrap_seed=0)


def interleaved_medians(fns, rounds: int) -> List[float]:
    """Median seconds of each function over ``rounds`` rounds that call each once in turn: on a shared machine
    the load changes over time, and alternating keeps the ratio fair."""
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, out in zip(fns, times):
            start = time.perf_counter()
            fn()
            out.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def time_case(num_samples: int, num_classes: int, num_bootstrap: int, min_run_time: float, rounds: int) -> Dict:
    from torch_lwlrap.stats import _bootstrap

    preds, target = make_inputs(num_samples, num_classes, None)
    row: Dict = {"num_samples": num_samples, "num_classes": num_classes, "num_bootstrap": num_bootstrap}
    for kind in ("lwlrap", "lrap"):
        plain, boot = _metric(kind, num_classes, 0), _metric(kind, num_classes, num_bootstrap)
        # compile and warm up at full size: a large batch runs the kernels' parallel variants, compiled on first use
        warm_up(plain.update, preds, target)
        warm_up(boot.update, preds, target)
        plain_s, boot_s = interleaved_medians(
            [lambda: plain.update(preds, target), lambda: boot.update(preds, target)], rounds
        )
        row[f"{kind}_plain_s"], row[f"{kind}_bootstrap_s"] = plain_s, boot_s
        row[f"{kind}_ratio"] = boot_s / plain_s

    from torch_lwlrap._rank_reductions import positive_counts_chunks
    from torch_lwlrap._tie_rules import label_precision

    def ranking_only():
        return [
            (entries.rows + first, entries.cols, label_precision(entries.counts, "max"))
            for first, entries in positive_counts_chunks(preds, target)
        ]

    items = ranking_only()
    key = _bootstrap.stream_key(0, 0)

    def weights_only():
        for sample, group, value in items:
            _bootstrap.class_sums(key, sample, group, value, num_classes, num_bootstrap)

    row["lwlrap_precisions_s"] = time_fast(ranking_only, min_run_time)
    row["lwlrap_replicate_sums_s"] = time_fast(weights_only, min_run_time)
    row["positives"] = int(sum(item[0].numel() for item in items))
    return row


def rss_probe(num_samples: int, num_classes: int, num_bootstrap: int) -> Dict:
    """Peak RSS added by one bootstrap update, in this (fresh) process."""
    import gc

    preds, target = make_inputs(num_samples, num_classes, None)
    metric = _metric("lwlrap", num_classes, num_bootstrap)
    metric.update(preds, target)  # at full size: the compile of a parallel variant would count in the peak
    gc.collect()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status_kib("VmRSS")
    metric.update(preds, target)
    return {"extra_bytes": max(0, _status_kib("VmHWM") - before) * 1024}


def rss_peak(num_samples: int, num_classes: int, num_bootstrap: int) -> int:
    code = (
        "import json; from benchmarks.bootstrap import rss_probe; "
        f"print(json.dumps(rss_probe({num_samples}, {num_classes}, {num_bootstrap})))"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])["extra_bytes"]


def meta_peak(num_samples: int, num_classes: int, num_bootstrap: int, kind: str = "lwlrap") -> int:
    """Peak bytes of the tensors one update creates on the ``meta`` device (the GPU path's torch code), the inputs
    and the metric's states excluded; ``num_bootstrap=0`` gives the plain update's."""
    from tests.test_memory import LiveBytes

    metric = _metric(kind, num_classes, num_bootstrap).to("meta")
    preds = torch.empty(num_samples, num_classes, device="meta")
    target = torch.empty(num_samples, num_classes, dtype=torch.bool, device="meta")
    with LiveBytes(preds, target, *metric.metric_state.values()) as mode:
        metric.update(preds, target)
    return mode.peak


def main(argv: List[str] = None) -> Dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds")
    add_output_arguments(parser, None, "bootstrap, or bootstrap-quick with --quick")
    parser.add_argument("--min-run-time", type=float, default=None)
    parser.add_argument("--rounds", type=int, default=None, help="alternating rounds of plain and bootstrap updates")
    args = parser.parse_args(argv)
    cases = [(2000, 80, 100)] if args.quick else [(20000, 527, 1000), (20000, 527, 100)]
    min_run_time = args.min_run_time or (0.05 if args.quick else 2.0)
    report = {"metadata": machine_metadata(["cpu"]), "timings": [], "rss": [], "meta": []}
    for case in cases:
        row = time_case(*case, min_run_time, args.rounds or (3 if args.quick else 9))
        report["timings"].append(row)
        print(json.dumps(row), file=sys.stderr)
    rss_cases = [(2000, 80, 100)] if args.quick else [(20000, 527, 1000), (200000, 527, 1000)]
    for n, c, b in rss_cases:
        report["rss"].append({"num_samples": n, "num_classes": c, "num_bootstrap": b, "extra_bytes": rss_peak(n, c, b)})
    meta_cases = [(2000, 80, 100)] if args.quick else [
        (20000, 527, 1000), (200000, 527, 1000), (20000, 527, 10000), (1000000, 527, 1000)
    ]
    for n, c, b in meta_cases:
        report["meta"].append({
            "num_samples": n, "num_classes": c, "num_bootstrap": b,
            "lwlrap_bytes": meta_peak(n, c, b, "lwlrap"), "lrap_bytes": meta_peak(n, c, b, "lrap"),
            "lwlrap_plain_bytes": meta_peak(n, c, 0, "lwlrap"), "lrap_plain_bytes": meta_peak(n, c, 0, "lrap"),
        })
    write_tables(args.out / (args.name or ("bootstrap-quick" if args.quick else "bootstrap")), report,
                 format_report(report))
    return report


def format_report(report: Dict) -> str:
    meta = report["metadata"]
    lines = [
        "# Bootstrap update cost",
        "",
        f"{meta['cpu']}, {meta['cpu_count']} cores, torch {meta['torch']}, commit {meta.get('git_commit')}.",
        "",
        "| N x C | B | positives | lwlrap plain | lwlrap bootstrap | ratio | of which precisions | of which replicate"
        " sums | LRAP plain | LRAP bootstrap | ratio |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in report["timings"]:
        lines.append(
            f"| {r['num_samples']} x {r['num_classes']} | {r['num_bootstrap']} | {r['positives']} "
            f"| {r['lwlrap_plain_s'] * 1e3:.1f} ms | {r['lwlrap_bootstrap_s'] * 1e3:.1f} ms | {r['lwlrap_ratio']:.1f}x "
            f"| {r['lwlrap_precisions_s'] * 1e3:.1f} ms | {r['lwlrap_replicate_sums_s'] * 1e3:.1f} ms "
            f"| {r['lrap_plain_s'] * 1e3:.1f} ms | {r['lrap_bootstrap_s'] * 1e3:.1f} ms | {r['lrap_ratio']:.1f}x |"
        )
    lines += ["", "Peak RSS added by one lwlrap bootstrap update (CPU path, fresh process):", ""]
    lines += ["| N x C | B | extra RSS |", "| --- | --- | --- |"]
    for r in report["rss"]:
        lines.append(f"| {r['num_samples']} x {r['num_classes']} | {r['num_bootstrap']} | "
                     f"{r['extra_bytes'] / MiB:.0f} MiB |")
    lines += ["", "Peak temporaries of one update on the meta device (the torch path off the CPU; inputs and states "
              "excluded), bootstrap and plain:", ""]
    lines += ["| N x C | B | lwlrap bootstrap | lwlrap plain | LRAP bootstrap | LRAP plain |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in report["meta"]:
        lines.append(f"| {r['num_samples']} x {r['num_classes']} | {r['num_bootstrap']} | "
                     f"{r['lwlrap_bytes'] / MiB:.0f} MiB | {r['lwlrap_plain_bytes'] / MiB:.0f} MiB | "
                     f"{r['lrap_bytes'] / MiB:.0f} MiB | {r['lrap_plain_bytes'] / MiB:.0f} MiB |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
