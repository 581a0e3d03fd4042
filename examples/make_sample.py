"""Write the small sample files used by the README: a ground truth and a submission in the Kaggle layouts.

``examples/data/sample_truth.csv`` is in the Freesound Audio Tagging 2019 layout (``fname,labels`` with the
labels of a row comma-joined in one quoted field); ``examples/data/sample_submission.csv`` holds one score per
class from a noisy "model", rounded to two decimals so that some scores tie, with the rows in another order;
``examples/data/sample_submission_b.csv`` is a second "model" for the same rows (a little better on some classes,
worse on others, rows in yet another order), for ``torch-lwlrap compare``. Its draws come after the first files',
which stay as they were.

The output is deterministic (fixed seed; only uniform draws of a PCG64 ``numpy.random.Generator``, turned into
choices and normal noise here, so it does not depend on NumPy's samplers): running the script twice gives
byte-identical files.

Usage::

    python examples/make_sample.py [--out-dir examples/data]
"""

from __future__ import annotations

import argparse
import csv
import math
import os
from typing import List, Optional, Sequence

import numpy as np

SEED = 2019
NUM_ROWS = 300
CLASSES = [
    "Accordion",
    "Applause",
    "Bark",
    "Bass_drum",
    "Bicycle_bell",
    "Burping_and_eructation",
    "Bus",
    "Car_passing_by",
    "Chink_and_clink",
    "Cricket",
    "Drip",
    "Female_singing",
    "Fill_(with_liquid)",
    "Finger_snapping",
    "Guitar",
    "Harmonica",
    "Hi-hat",
    "Keys_jangling",
    "Meow",
    "Purr",
]
TRUTH_NAME = "sample_truth.csv"
SUBMISSION_NAME = "sample_submission.csv"
SUBMISSION_B_NAME = "sample_submission_b.csv"


def _choice(u: float, weights: Sequence[float]) -> int:
    """Index drawn from ``weights`` with the uniform ``u`` in [0, 1)."""
    total = sum(weights)
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w / total
        if u < acc:
            return i
    return len(weights) - 1


def _normal(rng: np.random.Generator) -> float:
    """One standard normal draw (Box-Muller) from two uniform draws."""
    u1, u2 = rng.random(2).tolist()
    return math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)


def make_sample(out_dir: str, seed: int = SEED, num_rows: int = NUM_ROWS) -> List[str]:
    """Write the truth and submission CSV files into ``out_dir``; returns their paths.

    Example:
        >>> import tempfile
        >>> paths = make_sample(tempfile.mkdtemp(), num_rows=5)
        >>> [os.path.basename(p) for p in paths]
        ['sample_truth.csv', 'sample_submission.csv', 'sample_submission_b.csv']
    """
    rng = np.random.Generator(np.random.PCG64(seed))
    num_classes = len(CLASSES)
    # Uneven class frequencies, as in a real data set; every class keeps some examples.
    popularity = [1.0 + 3.0 * rng.random() for _ in range(num_classes)]
    # How hard each class is for the "model": the gap between positive and negative logits.
    separation = [1.2 + 2.0 * rng.random() for _ in range(num_classes)]

    fnames: List[str] = []
    labels: List[List[int]] = []
    seen = set()
    while len(fnames) < num_rows:
        fname = f"{int(rng.random() * 16**8):08x}.wav"
        if fname in seen:
            continue
        seen.add(fname)
        fnames.append(fname)
        how_many = 1 + _choice(rng.random(), [0.75, 0.2, 0.05])  # mostly single-label, some multi-label rows
        chosen: List[int] = []
        while len(chosen) < how_many:
            label = _choice(rng.random(), [0.0 if j in chosen else popularity[j] for j in range(num_classes)])
            chosen.append(label)
        labels.append(sorted(chosen))

    scores = []
    for row in labels:
        logits = [separation[j] * (j in row) - 1.0 + 1.1 * _normal(rng) for j in range(num_classes)]
        scores.append([1.0 / (1.0 + math.exp(-x)) for x in logits])
    order = sorted(range(num_rows), key=lambda i: rng.random())  # the submission lists rows in another order

    os.makedirs(out_dir, exist_ok=True)
    truth_path = os.path.join(out_dir, TRUTH_NAME)
    submission_path = os.path.join(out_dir, SUBMISSION_NAME)
    with open(truth_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["fname", "labels"])
        for fname, row in zip(fnames, labels):
            writer.writerow([fname, ",".join(CLASSES[j] for j in row)])
    with open(submission_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["fname"] + CLASSES)
        for i in order:
            writer.writerow([fnames[i]] + [f"{value:.2f}" for value in scores[i]])

    # System B: the same rows scored by another "model", better on some classes and worse on others.
    separation_b = [s * (0.7 + 0.6 * rng.random()) + 0.3 for s in separation]
    scores_b = []
    for row in labels:
        logits = [separation_b[j] * (j in row) - 1.0 + 1.1 * _normal(rng) for j in range(num_classes)]
        scores_b.append([1.0 / (1.0 + math.exp(-x)) for x in logits])
    order_b = sorted(range(num_rows), key=lambda i: rng.random())
    submission_b_path = os.path.join(out_dir, SUBMISSION_B_NAME)
    with open(submission_b_path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["fname"] + CLASSES)
        for i in order_b:
            writer.writerow([fnames[i]] + [f"{value:.2f}" for value in scores_b[i]])
    return [truth_path, submission_path, submission_b_path]


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command line: ``python examples/make_sample.py [--out-dir DIR]``."""
    parser = argparse.ArgumentParser(description="Write the sample truth and submission CSV files.")
    parser.add_argument(
        "--out-dir",
        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data"),
        help="folder to write into (default: examples/data next to this script)",
    )
    args = parser.parse_args(argv)
    if os.path.exists(args.out_dir) and not os.path.isdir(args.out_dir):
        parser.error(f"--out-dir {args.out_dir} is a file, not a folder: name a folder to write the samples into")
    for path in make_sample(args.out_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
