"""Per-call latency of ``update`` at training batch sizes, on an idle machine and with every core busy.

Training loops call ``update`` hundreds of times an epoch on batches of 32 to 2048 rows while data-loader workers
keep the cores busy. This script times that: for each batch size (32, 256, 2048 and 20,000 rows x 80 and 527
classes), each path (torch_lwlrap's default engine, numba on the CPU; its torch ``count`` path, which ``"auto"``
takes without numba; torchmetrics' ``MultilabelRankingAveragePrecision`` beside them) and each threading (the
default, and one thread: ``NUMBA_NUM_THREADS=1``, ``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), a fresh
process warms up and then times single ``update`` calls: mean, p50, p90 and p99 in milliseconds.

"busy" runs every case while one busy-looping process per core (``os.sched_getaffinity``) runs beside it; the
script starts them, bounds them (they stop by themselves after ``--busy-limit`` seconds) and stops them.

Run ``python -m benchmarks.latency`` (about 10 minutes on 2 cores; ``--quick`` for a smoke run). It prints the
tables and writes ``<out>/latency.json`` and ``<out>/latency.md`` (``--out``, default the git-ignored scratch folder of ``benchmarks/run.py``).

Batches are float32 scores and float32 0/1 targets (as a ``BCEWithLogitsLoss`` loop has them) with 1 to 3
positive labels per row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from benchmarks.run import SCRATCH_DIR

ROOT = Path(__file__).resolve().parents[1]

SIZES = [(32, 80), (32, 527), (256, 80), (256, 527), (2048, 80), (2048, 527), (20000, 80), (20000, 527)]
PATHS = ["numba", "torch", "torchmetrics"]
THREADINGS = ["default", "one"]

_BUSY_LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"


def _child(path: str, threading: str, num_samples: int, num_classes: int, seconds: float) -> Dict:
    """Time ``update`` in this (fresh) process; returns the per-call statistics in milliseconds."""
    import torch

    if threading == "one":
        torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(4):
        preds = torch.randn(num_samples, num_classes, generator=generator)
        target = torch.zeros(num_samples, num_classes)
        count = torch.randint(1, 4, (num_samples,), generator=generator)
        for k in range(3):
            cols = torch.randint(0, num_classes, (num_samples,), generator=generator)
            target[torch.arange(num_samples)[count > k], cols[count > k]] = 1.0
        batches.append((preds, target))
    if path == "torchmetrics":
        from torchmetrics.classification import MultilabelRankingAveragePrecision

        metric = MultilabelRankingAveragePrecision(num_labels=num_classes)
    else:
        from torch_lwlrap import MultilabelLWLRAP

        metric = MultilabelLWLRAP(num_labels=num_classes)
    warm_until = time.perf_counter() + seconds
    for step, (preds, target) in enumerate(batches * 2):  # warm up: compile (or load numba's cache), allocate
        metric.update(preds, target)
        if step >= 1 and time.perf_counter() > warm_until:
            break
    times: List[float] = []
    end = time.perf_counter() + seconds
    # At least 20 calls (5 for calls slower than the timed seconds: torchmetrics at 20,000 rows).
    while (time.perf_counter() < end or len(times) < 20) and len(times) < 2000:
        if len(times) >= 5 and time.perf_counter() > end and times[0] * 1e-3 > seconds / 5:
            break
        preds, target = batches[len(times) % len(batches)]
        start = time.perf_counter()
        metric.update(preds, target)
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()

    def quantile(q):
        return times[min(len(times) - 1, int(q * len(times)))]

    return {
        "calls": len(times),
        "mean": statistics.fmean(times),
        "p50": quantile(0.5),
        "p90": quantile(0.9),
        "p99": quantile(0.99),
        "torch_threads": torch.get_num_threads(),
    }


def run_case(path: str, threading: str, num_samples: int, num_classes: int, seconds: float) -> Dict:
    """One case in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("TORCH_LWLRAP_ENGINE", None)
    if path == "torch":
        env["TORCH_LWLRAP_ENGINE"] = "count"  # the torch path "auto" takes on the CPU without numba, for these labels
    if threading == "one":
        env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    args = [path, threading, str(num_samples), str(num_classes), str(seconds)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.latency", "--child", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"case {args} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


class BusyCores:
    """One busy-looping process per core this process may run on, each stopping by itself after ``limit`` s."""

    def __init__(self, limit: float):
        self.limit = limit
        self.processes: List[subprocess.Popen] = []

    def __enter__(self):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        for _ in range(cores):
            self.processes.append(subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, str(self.limit)]))
        time.sleep(0.5)
        return self

    def __exit__(self, *exc):
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            process.wait()


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b > 0 else "-"


def format_tables(records: List[Dict], meta: Dict) -> str:
    lines = ["# update latency, per call (ms)", ""]
    lines.append(
        f"Machine: {meta['cpu']} ({meta['cores']} cores), torch {meta['torch']}, numba {meta['numba']}, "
        f"torchmetrics {meta['torchmetrics']}; {meta['date']}. Each case in a fresh process; busy: one busy-looping "
        f"process per core beside it."
    )
    by_key = {(r["load"], r["path"], r["threading"], r["rows"], r["classes"]): r for r in records}
    loads = [load for load in ("idle", "busy") if any(r["load"] == load for r in records)]
    sizes = sorted({(r["rows"], r["classes"]) for r in records})
    paths = [p for p in PATHS if any(r["path"] == p for r in records)]
    for load in loads:
        lines += ["", f"## {load}", ""]
        lines.append(
            "| N x C | path | default mean | p50 | p90 | p99 | one thread mean | p50 | p90 | p99 "
            "| mean ratio | p50 ratio | p90 ratio |"
        )
        lines.append("| --- | --- |" + " ---: |" * 11)
        for rows, classes in sizes:
            for path in paths:
                d = by_key.get((load, path, "default", rows, classes))
                o = by_key.get((load, path, "one", rows, classes))
                if d is None or o is None:
                    continue
                cells = [f"{d[k]:.3f}" for k in ("mean", "p50", "p90", "p99")]
                cells += [f"{o[k]:.3f}" for k in ("mean", "p50", "p90", "p99")]
                cells += [_ratio(d[k], o[k]) for k in ("mean", "p50", "p90")]
                lines.append(f"| {rows} x {classes} | {path} | " + " | ".join(cells) + " |")
    lines += ["", "Ratios: default threading over one thread under the same load (the goal: busy mean and p90 at most "
              "1.5x, idle p50 at most 1.1x, for the default path, numba)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="two sizes, short runs: a smoke test")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per case (default 1)")
    parser.add_argument("--loads", default="idle,busy", help="comma-separated: idle, busy")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: numba, torch, torchmetrics")
    parser.add_argument("--busy-limit", type=float, default=1800, help="seconds after which busy processes stop")
    parser.add_argument("--out", type=Path, default=SCRATCH_DIR, help=f"output folder (default {SCRATCH_DIR})")
    args = parser.parse_args(argv)
    if args.child:
        path, threading, rows, classes, seconds = args.child
        print(json.dumps(_child(path, threading, int(rows), int(classes), float(seconds))))
        return 0

    import numba
    import torch
    import torchmetrics

    from benchmarks.run import machine_metadata

    base = machine_metadata(["cpu"])
    meta = {
        "date": base["date"],
        "cpu": base["cpu"],
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch": torch.__version__,
        "numba": numba.__version__,
        "torchmetrics": torchmetrics.__version__,
        "git_commit": base.get("git_commit"),
    }
    sizes = [(32, 80), (2048, 527)] if args.quick else SIZES
    seconds = 0.2 if args.quick else args.seconds
    paths = args.paths.split(",")
    records = []
    for load in args.loads.split(","):
        busy = BusyCores(args.busy_limit) if load == "busy" else None
        if busy is not None:
            busy.__enter__()
        try:
            for rows, classes in sizes:
                for path in paths:
                    for threading in THREADINGS:
                        result = run_case(path, threading, rows, classes, seconds)
                        record = dict(load=load, path=path, threading=threading, rows=rows, classes=classes, **result)
                        records.append(record)
                        print(
                            f"{load:4} {rows:6} x {classes:3} {path:12} {threading:7} mean {result['mean']:8.3f} "
                            f"p50 {result['p50']:8.3f} p90 {result['p90']:8.3f} p99 {result['p99']:8.3f} ms",
                            file=sys.stderr,
                            flush=True,
                        )
        finally:
            if busy is not None:
                busy.__exit__(None, None, None)
    table = format_tables(records, meta)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "latency.json").write_text(json.dumps({"metadata": meta, "records": records}, indent=1))
    (args.out / "latency.md").write_text(table)
    print(f"written: {args.out / 'latency.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
