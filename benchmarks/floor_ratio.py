"""``multilabel_lwlrap`` against one read of its inputs, alternated call by call: ``python -m benchmarks.floor_ratio``.

    python -m benchmarks.floor_ratio                            # 20,000 x 527, tables in benchmarks/out/floor_ratio.*
    python -m benchmarks.floor_ratio --out benchmarks/results   # the committed tables

``benchmarks.run`` times the floor (one read of every input byte, :func:`benchmarks.anchors.read_inputs`) and each
entry in turn, seconds apart: on a shared machine whose speed drifts between runs, their ratio moves with it. Here
the two alternate call by call (which goes first alternating too) on rotated copies of the inputs (as in
``benchmarks.run``: each call reads a copy that the last two calls did not), so the load weighs on both alike; the table gives both medians and their ratio,
for the default settings (threads, engine, value checks) of the function. Not a test: the test suite checks values.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Dict, Optional, Sequence

import torch

from benchmarks.anchors import read_inputs
from benchmarks.run import add_output_arguments, count_argument, machine_metadata, make_inputs, write_tables
from torch_lwlrap import multilabel_lwlrap

#: Copies of the inputs taken in turn.
COPIES = 4


def run(num_samples: int, num_classes: int, calls: int) -> Dict:
    """Medians of ``calls`` alternating calls of the floor and of ``multilabel_lwlrap``, in seconds."""
    copies = [make_inputs(num_samples, num_classes, None, seed=seed) for seed in range(COPIES)]
    entries = {"floor": read_inputs, "multilabel_lwlrap": multilabel_lwlrap}
    for preds, target in copies:  # warm up: numba's compile or cache load, the thread decision's first timings
        for entry in entries.values():
            entry(preds, target)
    times = {name: [] for name in entries}
    for call in range(calls):
        # Each entry reads a copy that no call read since the other copies went through the cache (inputs of 50
        # MiB, more than a 32 MiB L3), and which goes first alternates.
        order = list(entries) if call % 2 == 0 else list(entries)[::-1]
        for offset, name in enumerate(order):
            preds, target = copies[(2 * call + offset) % COPIES]
            start = time.perf_counter()
            entries[name](preds, target)
            times[name].append(time.perf_counter() - start)
    floor, ours = (statistics.median(times[name]) for name in entries)
    return {
        "num_samples": num_samples,
        "num_classes": num_classes,
        "calls": calls,
        "input_bytes": copies[0][0].nbytes + copies[0][1].nbytes,
        "floor_seconds": floor,
        "lwlrap_seconds": ours,
        "ratio": ours / floor,
        "torch_threads": torch.get_num_threads(),
    }


def markdown(record: Dict, machine: Dict) -> str:
    return "\n".join([
        f"### `multilabel_lwlrap` / one read of the inputs, {record['num_samples']:,} x {record['num_classes']} "
        f"(`python -m benchmarks.floor_ratio`)",
        "",
        f"Machine: {machine.get('cpu', '?')}, {record['torch_threads']} torch threads, torch {machine.get('torch', '?')}; "
        f"{machine.get('date', '?')}. Float32 scores, bool targets with 1 to 3 positives per row "
        f"({record['input_bytes'] / 2**20:.1f} MiB); medians of {record['calls']} calls of each, alternated.",
        "",
        "| floor (one read) | `multilabel_lwlrap`, default settings | ratio |",
        "| ---: | ---: | ---: |",
        f"| {record['floor_seconds'] * 1e3:.2f} ms | {record['lwlrap_seconds'] * 1e3:.2f} ms | {record['ratio']:.2f}x |",
    ])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=527)
    parser.add_argument("--calls", type=count_argument, default=60, help="calls of each (default: 60)")
    add_output_arguments(parser, "floor_ratio")
    args = parser.parse_args(argv)
    record = run(args.samples, args.classes, args.calls)
    machine = machine_metadata(["cpu"])
    write_tables(args.out / args.name, {"machine": machine, **record}, markdown(record, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
