"""ties="expected" against ties="max" on the default path, side by side: ``python -m benchmarks.ties``.

Both rules rank the same inputs in alternation (so the machine's load weighs on both alike); the table gives the
median time of each and their ratio. Cases at 20,000 x 527 (FSDKaggle2019's size): sparse labels with continuous
scores (no ties), the same scores saturated like float32 sigmoid outputs (many ties at 1.0), and denser labels.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from torch_lwlrap import multilabel_lwlrap


def cases(num_samples: int, num_classes: int):
    generator = torch.Generator().manual_seed(0)
    sparse = torch.rand(num_samples, num_classes, generator=generator) < 1.2 / num_classes
    logits = 6 * torch.randn(num_samples, num_classes, generator=generator) + 8 * sparse
    yield "1.2 labels per row, logits (no ties)", logits, sparse
    yield "1.2 labels per row, sigmoid(3 x logits) (ties at 1.0)", torch.sigmoid(3 * logits), sparse
    dense = torch.rand(num_samples, num_classes, generator=generator) < 0.05
    yield "5% labels, logits", 6 * torch.randn(num_samples, num_classes, generator=generator) + 8 * dense, dense


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20_000)
    parser.add_argument("--classes", type=int, default=527)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| case | max (ms) | expected (ms) | expected / max |")
    print("| --- | --- | --- | --- |")
    for name, preds, target in cases(args.samples, args.classes):
        times = {"max": [], "expected": []}
        for rule in times:  # warm up (compiles the numba passes on a first run)
            multilabel_lwlrap(preds, target, ties=rule)
        for _ in range(args.repeats):
            for rule, spent in times.items():
                start = time.perf_counter()
                multilabel_lwlrap(preds, target, ties=rule)
                spent.append(time.perf_counter() - start)
        fastest = {rule: statistics.median(spent) * 1e3 for rule, spent in times.items()}
        ratio = fastest["expected"] / fastest["max"]
        print(f"| {name} | {fastest['max']:.1f} | {fastest['expected']:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
