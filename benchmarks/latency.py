"""Per-call latency of ``update`` at training batch sizes, on an idle machine and with every core busy.

Training loops call ``update`` hundreds of times an epoch on batches of 32 to 2048 rows while data-loader workers
keep the cores busy. This script times that: for each batch size (32, 256, 2048 and 20,000 rows x 80 and 527
classes), each path (torch_lwlrap's default engine, numba on the CPU; its torch ``count`` path, which ``"auto"``
takes without numba; torchmetrics' ``MultilabelRankingAveragePrecision`` beside them; and ``sumonly``, a
``torchmetrics.Metric`` whose ``update`` only sums its batch into two ``(C,)`` states: the framework's floor for an
``update``, against which the overhead table sets the default path) and each threading (the
default, and one thread: ``NUMBA_NUM_THREADS=1``, ``OMP_NUM_THREADS=1``, ``torch.set_num_threads(1)``), a fresh
process warms up and then times single ``update`` calls: mean, p50, p90 and p99 in milliseconds. ``--call forward``
times ``metric(preds, target)`` instead, as a training step calls it (torchmetrics' forward: the batch's own value
besides the accumulated states).

"busy" runs every case while one busy-looping process per core (``os.sched_getaffinity``) runs beside it; the
script starts them, bounds them (they stop by themselves after ``--busy-limit`` seconds) and stops them.

"loop" calls (``--loops``) run a model-sized matmul before each ``update``, as a training or validation loop does
(:data:`MATMUL`: a 527-class linear head over 1024-wide embeddings of 1024 rows, about 1.1 GFLOP, on torch's
threads); only ``update`` is timed. torch's OpenMP threads are still spinning when ``update`` starts, which is
what a decision read from host-wide load counters took for other processes' load. "plain" calls ``update`` back to
back. The tables give the speed-up of the default threading over one thread (one thread's time over the default's).
The header gives the CPU time torch's OpenMP threads spin after that matmul (measured in a fresh process);
``--omp-wait-policy passive`` runs every case with ``OMP_WAIT_POLICY=PASSIVE``, under which they sleep instead.

``--before DIR`` times the torch_lwlrap source tree under ``DIR`` too (a ``git worktree`` of an earlier commit),
case by case in alternation with this checkout, and puts the two side by side.

Run ``python -m benchmarks.latency`` (about 10 minutes on 2 cores; ``--quick`` for a smoke run). It prints the
tables and writes ``<out>/<name>.json`` and ``.md`` (``--out``, default the git-ignored scratch folder of
``benchmarks/run.py``; ``--name``, default ``latency``).

Batches are float32 scores and float32 0/1 targets (as a ``BCEWithLogitsLoss`` loop has them) with 1 to 3
positive labels per row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[1]
if __package__ in (None, ""):  # run as a script (the children are, so that torch_lwlrap may come from another tree)
    sys.path.append(str(ROOT))

from benchmarks.run import add_output_arguments, write_tables  # noqa: E402

SIZES = [(32, 80), (32, 527), (256, 80), (256, 527), (2048, 80), (2048, 527), (20000, 80), (20000, 527)]
PATHS = ["numba", "torch", "torchmetrics", "sumonly"]
THREADINGS = ["default", "one"]
LOOPS = ["plain", "loop"]

#: The loop case's matmul before each update: ``(rows, features) @ (features, classes)``.
MATMUL = (1024, 1024, 527)

_BUSY_LOOP = "import sys, time\nend = time.monotonic() + float(sys.argv[1])\nwhile time.monotonic() < end: pass\n"


def _child(
    path: str, threading: str, num_samples: int, num_classes: int, seconds: float, loop: str, call: str = "update"
) -> Dict:
    """Time ``update`` (or, with ``call="forward"``, ``metric(preds, target)`` as a training step calls it) in this
    (fresh) process; returns the per-call statistics in milliseconds."""
    import torch

    if threading == "one":
        torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    rows, features, classes = MATMUL
    embeddings, head = torch.randn(rows, features, generator=generator), torch.randn(features, classes, generator=generator)

    def model():
        if loop == "loop":
            embeddings.matmul(head)
    batches = []
    for _ in range(4):
        preds = torch.randn(num_samples, num_classes, generator=generator)
        target = torch.zeros(num_samples, num_classes)
        count = torch.randint(1, 4, (num_samples,), generator=generator)
        for k in range(3):
            cols = torch.randint(0, num_classes, (num_samples,), generator=generator)
            target[torch.arange(num_samples)[count > k], cols[count > k]] = 1.0
        batches.append((preds, target))
    torch_lwlrap = None
    if path == "torchmetrics":
        from torchmetrics.classification import MultilabelRankingAveragePrecision

        metric = MultilabelRankingAveragePrecision(num_labels=num_classes)
    elif path == "sumonly":
        metric = _sum_only_metric(num_classes)
    else:
        import torch_lwlrap
        from torch_lwlrap import MultilabelLWLRAP

        metric = MultilabelLWLRAP(num_labels=num_classes)
    step_call = metric.update if call == "update" else metric
    warm_until = time.perf_counter() + seconds
    for step, (preds, target) in enumerate(batches * 2):  # warm up: compile (or load numba's cache), allocate
        model()
        step_call(preds, target)
        if step >= 1 and time.perf_counter() > warm_until:
            break
    times: List[float] = []
    end = time.perf_counter() + seconds
    # At least 20 calls (5 for calls slower than the timed seconds: torchmetrics at 20,000 rows).
    while (time.perf_counter() < end or len(times) < 20) and len(times) < 2000:
        if len(times) >= 5 and time.perf_counter() > end and times[0] * 1e-3 > seconds / 5:
            break
        preds, target = batches[len(times) % len(batches)]
        model()
        start = time.perf_counter()
        step_call(preds, target)
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
        "call": "update" if getattr(metric, "_forward_cache", None) is None else "forward",  # what ran
        "source": None if torch_lwlrap is None else torch_lwlrap.__file__,
    }


def _sum_only_metric(num_classes: int):
    """A ``torchmetrics.Metric`` that sums its batch into two ``(C,)`` float64 states: the floor of an ``update``."""
    import torch
    from torchmetrics import Metric

    class SumOnly(Metric):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            self.add_state("score_sum", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")
            self.add_state("label_sum", torch.zeros(num_classes, dtype=torch.float64), dist_reduce_fx="sum")

        def update(self, preds, target) -> None:
            self.score_sum += preds.sum(0)
            self.label_sum += target.sum(0)

        def compute(self):
            return self.score_sum.sum() / self.label_sum.sum()

    return SumOnly()


def _child_environment(source, wait_policy: str) -> Dict[str, str]:
    """The environment of a child: torch_lwlrap from ``source``; ``OMP_WAIT_POLICY`` unset, or set to
    ``wait_policy`` (torch's OpenMP threads read it when torch loads)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(source), str(ROOT)]))
    env.pop("OMP_WAIT_POLICY", None)
    if wait_policy != "unset":
        env["OMP_WAIT_POLICY"] = wait_policy.upper()
    return env


def _spin_child() -> Dict:
    """The CPU time torch's other threads (its OpenMP workers) take in the 100 ms after the loop's matmul, without
    work: their spin-wait, cores that other threads and processes do not get meanwhile. Medians of 8, in ms (None
    where ``/proc/self/task/*/schedstat`` cannot be read)."""
    import torch

    def cpu_ns() -> Dict[str, int]:
        times = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/schedstat") as stat:
                times[tid] = int(stat.read().split()[0])
        return times

    rows, features, classes = MATMUL
    embeddings, head = torch.randn(rows, features), torch.randn(features, classes)
    main_thread, spins = str(os.getpid()), []
    try:
        for step in range(11):
            embeddings.matmul(head)
            before = cpu_ns()
            time.sleep(0.1)
            after = cpu_ns()
            if step >= 3:  # warmed up
                spins.append(sum(t - before.get(tid, 0) for tid, t in after.items() if tid != main_thread) / 1e6)
    except OSError:
        return {"spin_ms": None}
    return {"spin_ms": statistics.median(spins)}


def torch_spin_ms(wait_policy: str = "unset") -> Optional[float]:
    """:func:`_spin_child` in a fresh process under ``wait_policy``."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "latency.py"), "--spin"], cwd=ROOT,
        env=_child_environment(ROOT, wait_policy), capture_output=True, text=True, timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the spin measurement failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])["spin_ms"]


def run_case(
    path: str,
    threading: str,
    num_samples: int,
    num_classes: int,
    seconds: float,
    loop: str = "plain",
    source=ROOT,
    call: str = "update",
    wait_policy: str = "unset",
) -> Dict:
    """One case in a fresh process, importing torch_lwlrap from the tree under ``source``."""
    env = _child_environment(source, wait_policy)
    env.pop("TORCH_LWLRAP_ENGINE", None)
    if path == "torch":
        env["TORCH_LWLRAP_ENGINE"] = "count"  # the torch path "auto" takes on the CPU without numba, for these labels
    if threading == "one":
        env.update(NUMBA_NUM_THREADS="1", OMP_NUM_THREADS="1")
    args = [path, threading, str(num_samples), str(num_classes), str(seconds), loop, call]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "latency.py"), "--child", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"case {args} failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["source"] is not None and not result["source"].startswith(str(Path(source).resolve())):
        raise RuntimeError(f"the child imported {result['source']}, not the tree under {source}")
    return result


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
    lines = [f"# {meta.get('call', 'update')} latency, per call (ms)", ""]
    lines.append(
        f"Machine: {meta['cpu']} ({meta['cores']} cores), torch {meta['torch']}, numba {meta['numba']}, "
        f"torchmetrics {meta['torchmetrics']}; {meta['date']}; load average {meta.get('loadavg', '?')} before the "
        f"run. Each case in a fresh process; busy: one busy-looping process per core beside it; loop: a "
        f"{MATMUL[0]} x {MATMUL[1]} @ {MATMUL[1]} x {MATMUL[2]} matmul before each update (untimed)."
    )
    if meta.get("torch_spin_ms") is not None:
        lines.append(
            f"OMP_WAIT_POLICY {meta.get('omp_wait_policy', 'unset')}: after the loop's matmul torch's OpenMP "
            f"threads take {meta['torch_spin_ms']:.1f} ms of CPU in the next 100 ms (their spin-wait; median of 8)."
        )
    if meta.get("before"):
        lines.append(f"Trees: after = {meta['after']}, before = {meta['before']}, alternating case by case.")
    key = lambda r: (r.get("tree", "after"), r["load"], r.get("loop", "plain"), r["path"], r["threading"], r["rows"],
                     r["classes"])  # noqa: E731
    by_key = {key(r): r for r in records}
    trees = [t for t in ("before", "after") if any(r.get("tree", "after") == t for r in records)]
    loads = [load for load in ("idle", "busy") if any(r["load"] == load for r in records)]
    loops = [loop for loop in LOOPS if any(r.get("loop", "plain") == loop for r in records)]
    sizes = sorted({(r["rows"], r["classes"]) for r in records})
    paths = [p for p in PATHS if any(r["path"] == p for r in records)]
    for load in loads:
        for loop in loops:
            lines += ["", f"## {load}, {loop}", ""]
            header = "| N x C | path |"
            for tree in trees:
                label = f"{tree}: " if len(trees) > 1 else ""
                header += (f" {label}default mean | p50 | p90 | one thread mean | p50 | p90 | mean ratio | p90 ratio "
                           f"| speed-up |")
            lines += [header, "| --- | --- |" + " ---: |" * (9 * len(trees))]
            for rows, classes in sizes:
                for path in paths:
                    cells = []
                    for tree in trees:
                        d = by_key.get((tree, load, loop, path, "default", rows, classes))
                        o = by_key.get((tree, load, loop, path, "one", rows, classes))
                        if d is None or o is None:
                            cells += ["-"] * 9
                            continue
                        cells += [f"{d[k]:.3f}" for k in ("mean", "p50", "p90")]
                        cells += [f"{o[k]:.3f}" for k in ("mean", "p50", "p90")]
                        cells += [_ratio(d["mean"], o["mean"]), _ratio(d["p90"], o["p90"]), _ratio(o["p50"], d["p50"])]
                    if any(cell != "-" for cell in cells):
                        lines.append(f"| {rows} x {classes} | {path} | " + " | ".join(cells) + " |")
    if "sumonly" in paths:
        lines += ["", "## overhead against a sum-only Metric", "",
                  "| load | loop | N x C | path | threading | p50 | sum-only p50 | p50 ratio | mean ratio |",
                  "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |"]
        tree = trees[-1]
        for load, loop, (rows, classes), path, threading in itertools.product(
            loads, loops, sizes, [p for p in paths if p != "sumonly"], THREADINGS
        ):
            r = by_key.get((tree, load, loop, path, threading, rows, classes))
            floor = by_key.get((tree, load, loop, "sumonly", threading, rows, classes))
            if r is not None and floor is not None:
                lines.append(f"| {load} | {loop} | {rows} x {classes} | {path} | {threading} | {r['p50']:.3f} | "
                             f"{floor['p50']:.3f} | {_ratio(r['p50'], floor['p50'])} | {_ratio(r['mean'], floor['mean'])} |")
        lines += ["", "The sum-only Metric sums its batch into two (C,) states: an update's floor (the goal: the default "
                  "path, numba, within 3x at 32 x 80 and 256 x 527)."]
    lines += ["", "Ratios: default threading over one thread under the same load (the goals: busy mean and p90 at most "
              "1.5x for the default path, numba). Speed-up: one thread's p50 over the default's (the goal: at least "
              "1.6x idle, in the loop, at 20,000 x 527 on 2 cores)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", nargs=7, help=argparse.SUPPRESS)
    parser.add_argument("--spin", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="two sizes, short runs: a smoke test")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per case (default 1)")
    parser.add_argument("--loads", default="idle,busy", help="comma-separated: idle, busy")
    parser.add_argument("--paths", default=",".join(PATHS), help="comma-separated: numba, torch, torchmetrics, sumonly")
    parser.add_argument("--loops", default=",".join(LOOPS), help="comma-separated: plain, loop (a matmul before each "
                        "update)")
    parser.add_argument("--call", choices=["update", "forward"], default="update", help="what is timed: update "
                        "(default), or forward, metric(preds, target) as a training step calls it")
    parser.add_argument("--omp-wait-policy", choices=["unset", "passive", "active"], default="unset",
                        help="OMP_WAIT_POLICY of every case's process (default: unset, torch's own spin-wait)")
    parser.add_argument("--sizes", default=None, help="comma-separated NxC, replacing the default sizes")
    parser.add_argument("--before", type=Path, default=None, help="an earlier torch_lwlrap source tree to time too")
    parser.add_argument("--busy-limit", type=float, default=1800, help="seconds after which busy processes stop")
    add_output_arguments(parser, "latency")
    args = parser.parse_args(argv)
    if args.child:
        path, threading, rows, classes, seconds, loop, call = args.child
        print(json.dumps(_child(path, threading, int(rows), int(classes), float(seconds), loop, call)))
        return 0
    if args.spin:
        print(json.dumps(_spin_child()))
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
        "loadavg": _loadavg(),
        "after": str(ROOT),
        "before": str(args.before.resolve()) if args.before else None,
        "call": args.call,
        "omp_wait_policy": args.omp_wait_policy,
        "torch_spin_ms": torch_spin_ms(args.omp_wait_policy),
    }
    sizes = [(32, 80), (2048, 527)] if args.quick else SIZES
    if args.sizes:
        try:
            sizes = [tuple(int(x) for x in size.lower().split("x")) for size in args.sizes.split(",")]
        except ValueError:
            sizes = []
        if not sizes or any(len(size) != 2 or min(size) < 1 for size in sizes):
            parser.error(f"--sizes takes comma-separated NxC with positive N and C, such as 32x527, got {args.sizes!r}")
    trees = [("after", ROOT)] + ([("before", args.before.resolve())] if args.before else [])
    seconds = 0.2 if args.quick else args.seconds
    paths = args.paths.split(",")
    records = []
    for load in args.loads.split(","):
        busy = BusyCores(args.busy_limit) if load == "busy" else None
        if busy is not None:
            busy.__enter__()
        try:
            for (rows, classes), path, loop, threading in itertools.product(
                sizes, paths, args.loops.split(","), THREADINGS
            ):
                for tree, source in trees if len(records) % 2 == 0 else trees[::-1]:  # alternate which goes first
                    if tree == "before" and path in ("torchmetrics", "sumonly"):
                        continue
                    result = run_case(path, threading, rows, classes, seconds, loop, source, args.call,
                                      args.omp_wait_policy)
                    record = dict(load=load, path=path, threading=threading, rows=rows, classes=classes, loop=loop,
                                  tree=tree, **result)
                    records.append(record)
                    print(
                        f"{load:4} {tree:6} {loop:5} {rows:6} x {classes:3} {path:12} {threading:7} "
                        f"mean {result['mean']:8.3f} p50 {result['p50']:8.3f} p90 {result['p90']:8.3f} "
                        f"p99 {result['p99']:8.3f} ms",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            if busy is not None:
                busy.__exit__(None, None, None)
    write_tables(args.out / args.name, {"metadata": meta, "records": records}, format_tables(records, meta))
    print(f"written: {args.out / args.name}.md", file=sys.stderr)
    return 0


def _loadavg() -> str:
    try:
        with open("/proc/loadavg") as loadavg:
            return " ".join(loadavg.read().split()[:3])
    except OSError:  # not Linux
        return "?"


if __name__ == "__main__":
    sys.exit(main())
