"""``torch-lwlrap compare``: two submissions scored on the same ground truth, and their paired difference.

All scoring goes through :func:`torch_lwlrap.compare_lwlrap`: both systems are resampled with the same bootstrap
weights, so the interval and p-value are those of the difference itself.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Dict, List, Optional

import numpy as np

from torch_lwlrap.cli._files import CommandError, CsvFormatError, align, read_predictions, read_truth
from torch_lwlrap.cli._report import check_bootstrap_args, print_output, summary_line

__all__ = ["add_parser", "compare_files", "format_comparison", "run"]

#: Classes listed per direction with ``--per-class``.
TOP_CLASSES = 5


def _reorder(pred_b, pred_a) -> np.ndarray:
    """System B's scores in system A's row and column order (both must list the same fnames and classes)."""
    rows = {fname: row for row, fname in enumerate(pred_b.fnames)}
    columns = {name: column for column, name in enumerate(pred_b.classes)}
    for fname in pred_a.fnames:
        if fname not in rows:
            raise CsvFormatError(f"fname {fname!r} of prediction file {pred_a.path!r} is missing from {pred_b.path!r}.")
    for name in pred_a.classes:
        if name not in columns:
            raise CsvFormatError(
                f"class column {name!r} of prediction file {pred_a.path!r} is not a column of {pred_b.path!r}."
            )
    if len(pred_b.fnames) != len(pred_a.fnames) or len(pred_b.classes) != len(pred_a.classes):
        raise CsvFormatError(
            f"prediction files {pred_a.path!r} and {pred_b.path!r} must score the same rows and classes, but have "
            f"{len(pred_a.fnames)} x {len(pred_a.classes)} and {len(pred_b.fnames)} x {len(pred_b.classes)}."
        )
    row_order = [rows[f] for f in pred_a.fnames]
    column_order = [columns[c] for c in pred_a.classes]
    return pred_b.scores[np.ix_(row_order, column_order)]


def compare_files(
    truth_path: str,
    a_path: str,
    b_path: str,
    *,
    num_bootstrap: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    ties: str = "max",
) -> Dict[str, object]:
    """Read the truth and two submissions, match rows by ``fname`` and classes by name, and compare them.

    Returns:
        A JSON-able dict: both lwlrap values, ``difference`` (A - B) with its ``interval`` and ``p_value``, the
        resampling settings, and ``per_class`` entries (NaN values as None) in system A's column order.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> def write(name, text):
        ...     with open(os.path.join(folder, name), "w") as f:
        ...         _ = f.write(text)
        ...     return os.path.join(folder, name)
        >>> truth = write("t.csv", 'fname,labels\\nx.wav,"a,c"\\ny.wav,b\\n')
        >>> a = write("a.csv", "fname,a,b,c\\nx.wav,0.9,0.1,0.8\\ny.wav,0.2,0.7,0.1\\n")
        >>> result = compare_files(truth, a, a, num_bootstrap=50)
        >>> result["difference"], result["interval"], result["p_value"]
        (0.0, [0.0, 0.0], 1.0)
    """
    import torch

    from torch_lwlrap.intervals import compare_lwlrap

    truth = read_truth(truth_path)
    pred_a = read_predictions(a_path)
    pred_b = read_predictions(b_path)
    target_np, _ = align(truth, pred_a)  # every row of A: no truth row is left out here
    if target_np.sum() == 0:
        raise CsvFormatError(f"truth file {truth.path!r} has no positive label at all: lwlrap is undefined.")
    scores_b = _reorder(pred_b, pred_a)
    result = compare_lwlrap(
        torch.from_numpy(pred_a.scores),
        torch.from_numpy(scores_b),
        torch.from_numpy(target_np),
        ties=ties,
        num_bootstrap=num_bootstrap,
        level=level,
        seed=seed,
    )

    def number(value: float) -> Optional[float]:
        value = float(value)
        return None if math.isnan(value) else value

    counts = target_np.sum(axis=0, dtype=np.int64).tolist()
    per_class = {}
    for i, name in enumerate(pred_a.classes):
        low, high = number(result.per_class_low[i]), number(result.per_class_high[i])
        per_class[name] = {
            "lwlrap_a": number(result.per_class_a[i]),
            "lwlrap_b": number(result.per_class_b[i]),
            "difference": number(result.per_class_difference[i]),
            "interval": None if low is None else [low, high],
            "p_value": number(result.per_class_p_value[i]),
            "count": int(counts[i]),
        }
    return {
        "truth": truth_path,
        "a": a_path,
        "b": b_path,
        "num_samples": len(pred_a.fnames),
        "num_labels": int(sum(counts)),
        "lwlrap_a": float(result.value_a),
        "lwlrap_b": float(result.value_b),
        "difference": float(result.difference),
        "interval": [float(result.low), float(result.high)],
        "p_value": float(result.p_value),
        "level": level,
        "num_bootstrap": num_bootstrap,
        "seed": seed,
        "per_class": per_class,
    }


def _changed_most(result: Dict, sign: int) -> List[str]:
    rows = [(name, c) for name, c in result["per_class"].items() if c["difference"] is not None]
    rows = [(name, c) for name, c in rows if sign * c["difference"] > 0]
    rows.sort(key=lambda item: -sign * item[1]["difference"])
    return [name for name, _ in rows[:TOP_CLASSES]]


def format_comparison(result: Dict, per_class: bool = False) -> str:
    """The plain-text report of ``torch-lwlrap compare``.

    Example:
        >>> result = {"truth": "t.csv", "a": "a.csv", "b": "b.csv", "num_samples": 2, "num_labels": 3,
        ...           "lwlrap_a": 0.9, "lwlrap_b": 0.8, "difference": 0.1, "interval": [0.02, 0.2],
        ...           "p_value": 0.01, "level": 0.95, "num_bootstrap": 1000, "seed": 0, "per_class": {}}
        >>> print(format_comparison(result))
        truth        t.csv
        A            a.csv
        B            b.csv
        samples      2
        labels       3 positive
        lwlrap A     0.900000
        lwlrap B     0.800000
        A - B        +0.100000  95% interval [+0.020000, +0.200000]  p = 0.0100
        <BLANKLINE>
        paired bootstrap over the evaluation rows: B=1000, seed 0
    """
    level = f"{100 * result['level']:g}%"
    low, high = result["interval"]
    lines = [
        summary_line("truth", result["truth"]),
        summary_line("A", result["a"]),
        summary_line("B", result["b"]),
        summary_line("samples", result["num_samples"]),
        summary_line("labels", f"{result['num_labels']} positive"),
        summary_line("lwlrap A", f"{result['lwlrap_a']:.6f}"),
        summary_line("lwlrap B", f"{result['lwlrap_b']:.6f}"),
        summary_line(
            "A - B", f"{result['difference']:+.6f}  {level} interval [{low:+.6f}, {high:+.6f}]  "
            f"p = {result['p_value']:.4f}"
        ),
        "",
        f"paired bootstrap over the evaluation rows: B={result['num_bootstrap']}, seed {result['seed']}",
    ]
    if per_class:
        classes = result["per_class"]
        width = max([len("class")] + [len(name) for name in classes])
        for title, names in (("A better", _changed_most(result, 1)), ("B better", _changed_most(result, -1))):
            lines += ["", f"classes where {title} most:"]
            if not names:
                lines.append("(none)")
                continue
            lines.append(
                f"{'class':<{width}}  {'A':>8}  {'B':>8}  {'A - B':>9}  {level + ' interval':>22}  {'p':>6}  "
                f"{'count':>5}"
            )
            for name in names:
                c = classes[name]
                bounds = "-" if c["interval"] is None else f"[{c['interval'][0]:+.4f}, {c['interval'][1]:+.4f}]"
                lines.append(
                    f"{name:<{width}}  {c['lwlrap_a']:>8.4f}  {c['lwlrap_b']:>8.4f}  {c['difference']:>+9.4f}  "
                    f"{bounds:>22}  {c['p_value']:>6.3f}  {c['count']:>5}"
                )
    return "\n".join(lines)


def write_plot(result: Dict, path: str) -> None:
    """Per-class differences A - B with their intervals, largest first (needs matplotlib)."""
    from torch_lwlrap.plot import _pyplot

    plt = _pyplot()
    rows = [(name, c) for name, c in result["per_class"].items() if c["difference"] is not None]
    rows.sort(key=lambda item: item[1]["difference"])
    names = [name for name, _ in rows]
    diff = np.array([c["difference"] for _, c in rows])
    low = np.array([c["interval"][0] for _, c in rows])
    high = np.array([c["interval"][1] for _, c in rows])
    fig, ax = plt.subplots(figsize=(7, 1.5 + 0.3 * len(rows)))
    colors = ["tab:blue" if d >= 0 else "tab:orange" for d in diff]
    ax.barh(range(len(rows)), diff, color=colors, xerr=np.vstack([diff - low, high - diff]), capsize=2)
    ax.axvline(0.0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), names)
    level = f"{100 * result['level']:g}%"
    ax.set_xlabel(f"per-class lwlrap A - B, with {level} paired bootstrap intervals")
    ax.set_title(
        f"A - B = {result['difference']:+.4f} [{result['interval'][0]:+.4f}, {result['interval'][1]:+.4f}], "
        f"p = {result['p_value']:.3f}"
    )
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=100)
    except (OSError, ValueError) as err:
        message = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise CommandError(f"cannot write the plot to {path!r}: {message}.") from None
    finally:
        plt.close(fig)


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    """Add the ``compare`` subcommand; :func:`run` runs it."""
    parser = commands.add_parser(
        "compare",
        help="compare two submissions on the same ground truth (paired bootstrap)",
        description="Score two submissions against the same ground truth and test their difference: lwlrap of "
        "each, A - B with a paired bootstrap interval and a two-sided p-value. Both are resampled with the same "
        "weights, so the interval reflects how much the difference would move on another evaluation set.",
        epilog="Exit status: 0 on success, 2 on a bad file or bad arguments (one line on stderr).",
    )
    parser.add_argument("truth", metavar="TRUTH.csv", help="ground truth, as for `torch-lwlrap score`")
    parser.add_argument("a", metavar="A.csv", help="submission of system A")
    parser.add_argument("b", metavar="B.csv", help="submission of system B (same fnames and classes as A)")
    parser.add_argument("--bootstrap", metavar="B", type=int, default=1000, help="replicates (default 1000)")
    parser.add_argument("--level", type=float, default=0.95, help="the interval's coverage (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    parser.add_argument("--per-class", action="store_true", help="list the classes that changed most either way")
    parser.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    parser.add_argument("--plot", metavar="OUT.png", help="write per-class differences with their intervals")
    parser.add_argument("--ties", choices=("max", "index"), default="max", help="tie rule, as for `score`")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run ``torch-lwlrap compare`` with the parsed arguments; raises :class:`CommandError` for the user to fix."""
    check_bootstrap_args(args.bootstrap, args.level, "--bootstrap", seed=args.seed, pred_path=args.a, systems=2)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CommandError(
                "--plot needs matplotlib, which is not installed: pip install matplotlib (the package's plot extra)."
            ) from None
    result = compare_files(
        args.truth, args.a, args.b, num_bootstrap=args.bootstrap, level=args.level, seed=args.seed, ties=args.ties
    )
    if args.plot:
        write_plot(result, args.plot)
    if args.json:
        text = json.dumps(result)
    else:
        text = format_comparison(result, per_class=args.per_class)
        if args.plot:
            text += f"\n\nper-class chart written to {args.plot}"
    print_output(text)
    return 0
