"""End-to-end time of ``torch-lwlrap score`` on a challenge-sized submission, against its floor.

The floor is what any Python scorer pays: a process that imports torch (``python -c "import torch"``) plus a
process that reads the submission's scores with numpy's ``loadtxt``. The three commands run alternately in one
run, ``--repeats`` times each, and the medians are compared as a ratio (the goal: at most 1.5x). Wall time is what
a user waits; CPU time (user + system, of the child process) is steadier on a machine shared with other jobs.

    python -m benchmarks.cli_speed                       # 20,000 x 527 (74 MB), 5 repeats
    python -m benchmarks.cli_speed --rows 2000 --repeats 1

Files are generated deterministically (seed 0) in a temporary folder: a submission ``fname,<527 classes>`` with
4-decimal scores, and the official test-label layout ``fname,labels,usage,freesound_id,license`` with 1 to 3 labels
a row. The command scored is ``torch-lwlrap score TRUTH PRED`` (``python -m torch_lwlrap``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
GOAL = 1.5


def write_files(folder: Path, num_rows: int, num_classes: int) -> Dict[str, Path]:
    rng = np.random.default_rng(0)
    classes = [f"Class_{j:03d}_(sound)" for j in range(num_classes)]
    fnames = [f"{i:08x}.wav" for i in range(num_rows)]
    pred = folder / "submission.csv"
    with open(pred, "w") as handle:
        handle.write("fname," + ",".join(classes) + "\n")
        for start in range(0, num_rows, 1000):
            block = rng.random((min(1000, num_rows - start), num_classes))
            for offset, row in enumerate(block):
                handle.write(fnames[start + offset] + "," + ",".join(f"{value:.4f}" for value in row) + "\n")
    truth = folder / "test_post_competition.csv"
    with open(truth, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["fname", "labels", "usage", "freesound_id", "license"])
        for i in rng.permutation(num_rows):
            labels = rng.choice(num_classes, size=rng.integers(1, 4), replace=False)
            usage = "Public" if rng.random() < 0.3 else "Private"
            writer.writerow([fnames[i], ",".join(classes[j] for j in labels), usage, 100000 + i, "CC-BY"])
    # The same labels without the metadata columns, for versions of the command line that predate them.
    plain = folder / "truth_fname_labels.csv"
    with open(truth, newline="") as source, open(plain, "w", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(row[:2] for row in csv.reader(source))
    return {"pred": pred, "truth": truth, "plain_truth": plain}


def timed(command: List[str], cwd: Path = ROOT) -> Dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu, "stdout": done.stdout}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--classes", type=int, default=527)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="OUT.json", help="also write every timing to this file")
    parser.add_argument(
        "--before",
        metavar="DIR",
        help="also time the command line of another checkout of torch_lwlrap (e.g. `git worktree add DIR COMMIT`), "
        "run in DIR (so that `python -m torch_lwlrap` imports it) on the truth without metadata columns",
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1 (the table is a median), got {args.repeats}")
    if args.before and not (Path(args.before) / "torch_lwlrap").is_dir():
        parser.error(f"--before {args.before!r} holds no torch_lwlrap checkout (no torch_lwlrap folder in it)")

    with tempfile.TemporaryDirectory() as folder:
        files = write_files(Path(folder), args.rows, args.classes)
        size_mb = files["pred"].stat().st_size / 1e6
        commands = {
            "torch-lwlrap score": [sys.executable, "-m", "torch_lwlrap", "score", str(files["truth"]),
                                   str(files["pred"]), "--json"],
            "import torch": [sys.executable, "-c", "import torch"],
            "numpy loadtxt": [
                sys.executable,
                "-c",
                "import sys, numpy as np; "
                "np.loadtxt(sys.argv[1], delimiter=',', skiprows=1, usecols=range(1, int(sys.argv[2]) + 1))",
                str(files["pred"]),
                str(args.classes),
            ],
        }
        folders: Dict[str, Path] = {}
        if args.before:
            commands["before: score (fname,labels)"] = [sys.executable, "-m", "torch_lwlrap", "score",
                                                        str(files["plain_truth"]), str(files["pred"]), "--json"]
            folders["before: score (fname,labels)"] = Path(args.before).resolve()  # `-m` imports from there
        times: Dict[str, Dict[str, List[float]]] = {name: {"wall": [], "cpu": []} for name in commands}
        for name, command in commands.items():  # untimed: a cold kernel cache compiles in the first run
            timed(command, folders.get(name, ROOT))
        for repeat in range(args.repeats):
            for name, command in commands.items():
                result = timed(command, folders.get(name, ROOT))
                times[name]["wall"].append(result["wall"])
                times[name]["cpu"].append(result["cpu"])
                if name == "torch-lwlrap score" and repeat == 0:
                    score = json.loads(result["stdout"])
                print(f"repeat {repeat + 1}/{args.repeats}  {name:<20} {result['wall']:6.2f} s wall "
                      f"{result['cpu']:6.2f} s cpu", file=sys.stderr)

    medians = {name: {kind: statistics.median(values) for kind, values in kinds.items()}
               for name, kinds in times.items()}
    ratios = {
        kind: medians["torch-lwlrap score"][kind] / (medians["import torch"][kind] + medians["numpy loadtxt"][kind])
        for kind in ("wall", "cpu")
    }
    print(f"# torch-lwlrap score end to end: {args.rows:,} x {args.classes} ({size_mb:.0f} MB), "
          f"median of {args.repeats}")
    print()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores visible, "
          f"load average {os.getloadavg()[0]:.1f} at the end; python {platform.python_version()}")
    print()
    print("| command | wall s | cpu s |")
    print("| --- | --- | --- |")
    for name, median in medians.items():
        print(f"| {name} | {median['wall']:.2f} | {median['cpu']:.2f} |")
    floor = {kind: medians["import torch"][kind] + medians["numpy loadtxt"][kind] for kind in ("wall", "cpu")}
    print(f"| floor: import torch + loadtxt | {floor['wall']:.2f} | {floor['cpu']:.2f} |")
    print(f"| **ratio** (goal <= {GOAL}x) | **{ratios['wall']:.2f}x** | **{ratios['cpu']:.2f}x** |")
    for name, median in medians.items():
        if name.startswith("before"):
            print(f"| {name}: ratio | {median['wall'] / floor['wall']:.2f}x | {median['cpu'] / floor['cpu']:.2f}x |")
    print()
    print(f"lwlrap {score['lwlrap']:.6f} over {score['num_samples']:,} rows and {score['num_classes']} classes")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"rows": args.rows, "classes": args.classes, "repeats": args.repeats, "times": times,
             "medians": medians, "ratios": ratios, "goal": GOAL, "lwlrap": score["lwlrap"]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
