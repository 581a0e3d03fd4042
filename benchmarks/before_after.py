"""Two versions of the package side by side in one run: the same cases timed in alternating fresh processes, one
source tree each (``--before`` and ``--after``, e.g. a ``git worktree`` of an earlier commit and the checkout).

Cases at 20,000 x 527 (float32 scores, bool targets, 1 to 3 positives per row), each a call a user makes:
``multilabel_lwlrap`` (``ties="max"``), ``multilabel_lwlrap(ties="expected")``, a bootstrap ``MultilabelLWLRAP``
update (``num_bootstrap=1000``), a ``MultilabelRankingMetrics`` update (every metric, k = 1, 5, 10), and against
a second system's scores (the first plus normal noise) ``multilabel_rank_correlation`` (Spearman, Kendall) and
``multilabel_kendall_distance_at_k`` (k = 10). Each round starts one process per version, which warms up (numba's
compile or cache load, ``benchmarks.run.WARM_UP_CALLS`` calls) and takes the median of ``--calls`` calls; the
table gives each version's median over ``--rounds`` rounds and the ratio after / before. The machine's load changes
between rounds, so only the ratios of one run compare.

Run ``python -m benchmarks.before_after --before ../old --after .`` (about 5 minutes on 2 cores once compiled). It
prints the table and writes ``<out>/<name>.md`` and ``.json`` (``--out``, default the scratch folder; ``--name``,
default ``before_after``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.run import (
    WARM_UP_CALLS, add_output_arguments, count_argument, machine_metadata, sizes_argument, write_tables,
)

CASES = ["lwlrap", "expected", "bootstrap", "ranking_collection", "spearman", "kendall", "distance"]

_CHILD = r"""
import json, statistics, sys, time
import torch
import torch_lwlrap
case, calls, n, c, warm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
g = torch.Generator().manual_seed(0)
preds = torch.randn(n, c, generator=g)
target = torch.zeros(n, c, dtype=torch.bool)
counts = torch.randint(1, 4, (n,), generator=g)
for i, k in enumerate(counts.tolist()):
    target[i, torch.randperm(c, generator=g)[:k]] = True
other = preds + torch.randn(n, c, generator=g)
if case == "lwlrap":
    call = lambda: torch_lwlrap.multilabel_lwlrap(preds, target)
elif case == "expected":
    call = lambda: torch_lwlrap.multilabel_lwlrap(preds, target, ties="expected")
elif case == "bootstrap":
    metric = torch_lwlrap.MultilabelLWLRAP(num_labels=c, num_bootstrap=1000, bootstrap_seed=0)
    call = lambda: metric.update(preds, target)
elif case == "ranking_collection":
    metric = torch_lwlrap.MultilabelRankingMetrics(num_labels=c)
    call = lambda: metric.update(preds, target)
elif case in ("spearman", "kendall"):
    call = lambda: torch_lwlrap.multilabel_rank_correlation(preds, other, method=case)
else:
    call = lambda: torch_lwlrap.multilabel_kendall_distance_at_k(preds, other, 10)
for _ in range(warm):
    call()
times = []
for _ in range(calls):
    start = time.perf_counter()
    call()
    times.append(time.perf_counter() - start)
print(json.dumps({"median_ms": 1000 * statistics.median(times), "source": torch_lwlrap.__file__}))
"""


def _time(source: Path, case: str, calls: int, size=(20000, 527)) -> float:
    env = dict(os.environ, PYTHONPATH=str(source))
    command = [sys.executable, "-c", _CHILD, case, str(calls), *map(str, size), str(WARM_UP_CALLS)]
    done = subprocess.run(command, env=env, cwd=source, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["source"].startswith(str(source)):
        raise RuntimeError(f"the child imported {result['source']}, not the tree under {source}")
    return result["median_ms"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="source tree of the earlier version")
    parser.add_argument("--after", type=Path, required=True, help="source tree of the later version")
    parser.add_argument("--rounds", type=count_argument, default=5)
    parser.add_argument("--calls", type=count_argument, default=15)
    parser.add_argument("--cases", nargs="+", default=CASES, choices=CASES)
    parser.add_argument("--size", type=sizes_argument, default="20000x527",
                        help="NxC of the batch (the default is the issue's size)")
    add_output_arguments(parser, "before_after")
    args = parser.parse_args(argv)
    if len(args.size) != 1 or args.size[0][2] is not None:
        parser.error(f"--size takes one NxC, without a density: got {args.size}")
    size = args.size[0][:2]
    before, after = args.before.resolve(), args.after.resolve()
    for option, folder in (("--before", before), ("--after", after)):
        if not (folder / "torch_lwlrap").is_dir():
            parser.error(f"{option} {str(folder)!r} holds no torch_lwlrap source tree (no torch_lwlrap folder in it)")
    results = {case: {"before": [], "after": []} for case in args.cases}
    for round_ in range(args.rounds):
        for case in args.cases:
            order = (("before", before), ("after", after)) if round_ % 2 == 0 else (("after", after), ("before", before))
            for name, source in order:
                results[case][name].append(_time(source, case, args.calls, size))
        print(f"round {round_ + 1} of {args.rounds} done", flush=True)
    lines = [f"| case ({size[0]:,} x {size[1]:,}) | before ms | after ms | after / before |"]
    lines.append("| --- | ---: | ---: | ---: |")
    table = {}
    for case, runs in results.items():
        b, a = statistics.median(runs["before"]), statistics.median(runs["after"])
        table[case] = {"before_ms": b, "after_ms": a, "ratio": a / b, "runs": runs}
        lines.append(f"| {case} | {b:.2f} | {a:.2f} | {a / b:.2f}x |")
    report = {"machine": machine_metadata(["cpu"]), "before": str(before), "after": str(after), "rounds": args.rounds,
              "calls": args.calls, "size": list(size), "cases": table}
    write_tables(args.out / args.name, report, "\n".join(lines))


if __name__ == "__main__":
    main()
