"""``torch-lwlrap compare``: two submissions scored on the same ground truth, and their paired difference.

All scoring goes through :func:`torch_lwlrap.compare_lwlrap`: both systems are resampled with the same bootstrap
weights, so the interval and p-value are those of the difference itself.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from torch_lwlrap.cli._files import CommandError, file_name
from torch_lwlrap.cli._inputs import Inputs, add_input_options, input_options, read_inputs
from torch_lwlrap.cli._report import (
    check_bootstrap_args,
    check_plot_target,
    ignored_rows_note,
    labels_summary,
    level_name,
    no_interval_reason,
    pad_to,
    print_output,
    summary_line,
    text_width,
    unlabelled_note,
)

__all__ = ["add_parser", "compare_files", "format_comparison", "run"]

#: Classes listed per direction with ``--per-class``.
TOP_CLASSES = 5


def compare_files(
    truth_path: str,
    a_path: str,
    b_path: str,
    *,
    num_bootstrap: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    ties: str = "max",
    where: Sequence[Tuple[str, str]] = (),
    classes_path: Optional[str] = None,
    unknown: Optional[str] = None,
    agreement: Optional[int] = None,
) -> Dict[str, object]:
    """Read the truth and two submissions, match rows by ``fname`` and classes by name, and compare them.

    ``ties``, ``where``, ``classes_path`` and ``unknown`` mean what they mean for
    :func:`torch_lwlrap.cli.score.score_files`; both submissions must score the same (selected) rows and classes.
    With ``agreement=K``, also the mean Kendall distance at ``K`` between the two submissions' rankings of each
    row's classes (:func:`torch_lwlrap.multilabel_kendall_distance_at_k`; ties at the K-th place broken by the
    files' column order, or by the class names' sorted order where the two files list their classes in different
    orders, so that swapping A and B never changes it).

    Returns:
        A JSON-able dict: both lwlrap values, ``difference`` (A - B) with its ``interval`` and ``p_value``, the
        resampling settings, ``per_class`` entries (NaN values as None) in system A's column order,
        ``agreement`` (``{"k": K, "kendall_distance": value}``, or None without ``agreement``) and ``options``:
        every option that shaped the numbers.

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
    inputs = read_inputs(truth_path, [a_path, b_path], where=where, classes_path=classes_path, unknown=unknown)
    _check_index_ties(ties, inputs)
    import torch

    from torch_lwlrap.functional._intervals import compare_lwlrap
    from torch_lwlrap.functional._ltr import multilabel_kendall_distance_at_k

    agreement_result = None
    if agreement is not None:
        scores = [torch.from_numpy(values) for values in inputs.scores]
        if inputs.predictions[0].classes != inputs.predictions[1].classes:
            # No one column order to break ties at the K-th place by: the class names' sorted order serves, the same
            # whichever file is A (swapping A and B never changes the agreement).
            order = torch.tensor(sorted(range(len(inputs.classes)), key=inputs.classes.__getitem__))
            scores = [values[:, order] for values in scores]
        distance = multilabel_kendall_distance_at_k(*scores, agreement)
        agreement_result = {"k": agreement, "kendall_distance": float(distance)}
    result = compare_lwlrap(
        torch.from_numpy(inputs.scores[0]),
        torch.from_numpy(inputs.scores[1]),
        torch.from_numpy(inputs.target),
        ties=ties,
        ignore_index=inputs.ignore_index,
        num_bootstrap=num_bootstrap,
        level=level,
        seed=seed,
    )

    def number(value: float) -> Optional[float]:
        value = float(value)
        return None if math.isnan(value) else value

    counts = inputs.counts.tolist()
    per_class = {}
    for i, name in enumerate(inputs.classes):
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
        "num_samples": len(inputs.target),
        "rows_without_label": int(((inputs.target == 1).sum(axis=1) == 0).sum()),
        "num_labels": int(sum(counts)),
        "num_unknown": inputs.num_unknown,
        "lwlrap_a": float(result.value_a),
        "lwlrap_b": float(result.value_b),
        "difference": float(result.difference),
        "interval": None if number(result.low) is None else [float(result.low), float(result.high)],
        "p_value": number(result.p_value),
        "level": level,
        "num_bootstrap": num_bootstrap,
        "seed": seed,
        "selection": None
        if not where
        else {
            "where": dict(where),
            "truth_rows": inputs.truth_rows,
            "selected_rows": len(inputs.target),
            "ignored_prediction_rows": {"a": inputs.ignored_pred_rows[0], "b": inputs.ignored_pred_rows[1]},
        },
        "vocabulary": classes_path,
        "agreement": agreement_result,
        "per_class": per_class,
        "options": {
            **input_options(ties, where, classes_path, unknown),
            "bootstrap": num_bootstrap,
            "level": level,
            "seed": seed,
            "agreement": agreement,
        },
    }


def _check_index_ties(ties: str, inputs: Inputs) -> None:
    """``--ties index`` orders tied scores by each file's column order, so both files must share it."""
    if ties == "index" and inputs.predictions[0].classes != inputs.predictions[1].classes:
        a, b = (pred.path for pred in inputs.predictions)
        raise CommandError(
            f"--ties index orders tied scores by the prediction file's column order, but {a!r} and {b!r} list "
            f"their classes in different orders: write both in the same order, or use --ties max or expected."
        )


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
        ...           "p_value": 0.01, "level": 0.95, "num_bootstrap": 1000, "seed": 0, "per_class": {},
        ...           "options": {"ties": "max"}}
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
        paired bootstrap over the evaluation rows: 1000 replicates, seed 0
    """
    level = level_name(result["level"])
    selection = result.get("selection")
    lines = [summary_line("truth", file_name(result["truth"]))]
    if selection:
        conditions = " and ".join(f"{column}={value}" for column, value in selection["where"].items())
        lines.append(
            summary_line("where", f"{conditions}: {selection['selected_rows']} of {selection['truth_rows']} truth rows")
        )
    for system in ("a", "b"):
        ignored = selection["ignored_prediction_rows"][system] if selection else 0
        lines.append(summary_line(system.upper(), file_name(result[system]) + ignored_rows_note(ignored)))
    if result.get("vocabulary") is not None:
        lines.append(summary_line("vocabulary", f"{result['vocabulary']} (every class, no other)"))
    lines += [
        summary_line("samples",
                     str(result["num_samples"]) + unlabelled_note(result.get("rows_without_label", 0), lrap=False)),
        summary_line("labels", labels_summary(result["num_labels"], result.get("num_unknown", 0))),
    ]
    if result["options"]["ties"] != "max":
        lines.append(summary_line("ties", f"--ties {result['options']['ties']}"))
    lines += [
        summary_line("lwlrap A", f"{result['lwlrap_a']:.6f}"),
        summary_line("lwlrap B", f"{result['lwlrap_b']:.6f}"),
        summary_line("A - B", f"{result['difference']:+.6f}  {_overall_interval_text(result, level)}"),
    ]
    agreement = result.get("agreement")
    if agreement:
        lines.append(
            summary_line("agreement", f"{agreement['kendall_distance']:.6f}  Kendall distance at {agreement['k']} "
                         f"between A's and B's rankings (0: same order, 1: reversed)")
        )
    lines += [
        "",
        f"paired bootstrap over the evaluation rows: {result['num_bootstrap']} replicates, seed {result['seed']}",
    ]
    if per_class:
        classes = result["per_class"]
        width = max([len("class")] + [text_width(name) for name in classes])
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
                p_value = "-" if c["p_value"] is None else f"{c['p_value']:.3f}"
                lines.append(
                    f"{pad_to(name, width)}  {c['lwlrap_a']:>8.4f}  {c['lwlrap_b']:>8.4f}  {c['difference']:>+9.4f}  "
                    f"{bounds:>22}  {p_value:>6}  {c['count']:>5}"
                )
        listed = _changed_most(result, 1) + _changed_most(result, -1)
        missing = [classes[name]["count"] for name in listed if classes[name]["interval"] is None]
        if missing:
            lines += ["", "-: a class with a single positive label has no interval or p-value (every replicate that "
                      "draws it gives the same difference)"]
        if any(count >= 2 for count in missing):
            lines[-1] += (f"; nor has a class whose positive labels none of the {result['num_bootstrap']} replicates "
                          f"drew (use more replicates: 1000 is usual)")
    return "\n".join(lines)


def _overall_interval_text(result: Dict, level: str) -> str:
    """The difference's interval and p-value, or why there are none (fewer than two rows with a positive label)."""
    if result["interval"] is None:
        labelled = result["num_samples"] - result.get("rows_without_label", 0)
        return "no interval or p-value: " + no_interval_reason(labelled, result["num_bootstrap"])
    low, high = result["interval"]
    return f"{level} interval [{low:+.6f}, {high:+.6f}]  p = {result['p_value']:.4f}"


def plot_title(result: Dict) -> str:
    """The chart's title: which file is A and which B, and their overall difference.

    Example:
        >>> print(plot_title({"a": "runs/new.csv", "b": "runs/old.csv", "difference": 0.0322,
        ...                   "interval": [-0.0119, 0.0792], "p_value": 0.1818}))
        A = new.csv, B = old.csv
        A - B = +0.0322 [-0.0119, +0.0792], p = 0.182
    """
    interval = result["interval"]
    bounds = "" if interval is None else f" [{interval[0]:+.4f}, {interval[1]:+.4f}], p = {result['p_value']:.3f}"
    return (
        f"A = {os.path.basename(file_name(result['a']))}, B = {os.path.basename(file_name(result['b']))}\n"
        f"A - B = {result['difference']:+.4f}{bounds}"
    )


def write_plot(result: Dict, path: str) -> None:
    """Per-class differences A - B with their intervals, largest first (needs matplotlib); many classes are split
    into side-by-side panels, as ``score``'s chart is."""
    from torch_lwlrap.plot import _pyplot, layout_below_title, panel_slices

    plt = _pyplot()
    rows = [(name, c) for name, c in result["per_class"].items() if c["difference"] is not None]
    rows.sort(key=lambda item: -item[1]["difference"])
    chunks = panel_slices(len(rows))
    panels = len(chunks)
    per_panel = max(1, math.ceil(len(rows) / panels))
    level = level_name(result["level"])
    height = 1.6 + (0.3 if panels == 1 else 0.16) * per_panel
    fig, axes = plt.subplots(1, panels, figsize=(7.5 * panels, height), squeeze=False)
    try:
        for ax, chunk in zip(axes[0], chunks):
            chosen = rows[chunk]
            diff = np.array([c["difference"] for _, c in chosen])
            ax.barh(range(len(chosen)), diff, color=["tab:blue" if d >= 0 else "tab:orange" for d in diff])
            bars = [(y, c["interval"]) for y, (_, c) in enumerate(chosen) if c["interval"] is not None]
            if bars:
                # Centred on the interval, not on the difference: a percentile interval need not hold the value
                # in its middle (nor hold it at all, with few replicates).
                ax.errorbar(
                    [(low + high) / 2 for _, (low, high) in bars],
                    [y for y, _ in bars],
                    xerr=[(high - low) / 2 for _, (low, high) in bars],
                    fmt="none", ecolor="black", elinewidth=1, capsize=2,
                )
            ax.axvline(0.0, color="black", linewidth=0.8)
            ax.set_yticks(range(len(chosen)), [name for name, _ in chosen], fontsize=8 if panels > 1 else None)
            ax.set_ylim(len(chosen) - 0.5, -0.5)  # largest difference on top
            ax.set_xlabel(f"A - B per class, {level} interval")
        fig.suptitle(
            f"{plot_title(result)}\nper-class intervals: paired bootstrap, {result['num_bootstrap']} replicates"
            + ("; none for a class with one positive label" if any(c["interval"] is None for _, c in rows) else "")
            + (" or none drawn" if any(c["interval"] is None and c["count"] >= 2 for _, c in rows) else "")
        )
        layout_below_title(fig)
        fig.savefig(path, dpi=100)
    except (OSError, ValueError, RuntimeError) as err:  # RuntimeError: a writer's missing tool (LaTeX for .pgf)
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
    parser.add_argument(
        "truth", metavar="TRUTH.csv", help="ground truth, as for `torch-lwlrap score` ('-': standard input)"
    )
    parser.add_argument("a", metavar="A.csv", help="submission of system A ('-': standard input)")
    parser.add_argument(
        "b", metavar="B.csv", help="submission of system B, the same fnames and classes as A ('-': standard input)"
    )
    parser.add_argument(
        "--bootstrap", metavar="N", type=int, default=None, help="bootstrap replicates (default 1000)"
    )
    parser.add_argument(
        "--ci", metavar="N", nargs="?", type=int, const=1000, help="the same as --bootstrap N, as `score` spells it"
    )
    parser.add_argument("--level", type=float, default=0.95, help="the interval's coverage (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0)")
    parser.add_argument("--per-class", action="store_true", help="list the classes that changed most either way")
    parser.add_argument(
        "--agreement",
        metavar="K",
        type=_positive_int,
        help="also report the mean Kendall distance at K between A's and B's rankings of each row's classes (over "
        "the union of their top K; 0: the same order, 1: reversed); ties at the K-th place are broken by the files' "
        "column order, or by the sorted class names where the two files' orders differ",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object and nothing else")
    parser.add_argument("--plot", metavar="OUT.png", help="write per-class differences with their intervals")
    add_input_options(parser)
    parser.set_defaults(run=run)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value < 2**63:
        raise argparse.ArgumentTypeError(f"expected a positive integer below 2**63, such as 10, but got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    """Run ``torch-lwlrap compare`` with the parsed arguments; raises :class:`CommandError` for the user to fix."""
    if args.ci is not None and args.bootstrap is not None:
        raise CommandError(f"--ci {args.ci} and --bootstrap {args.bootstrap} both set the replicates: give one.")
    option, given = ("--bootstrap", args.bootstrap) if args.ci is None else ("--ci", args.ci)
    args.bootstrap = 1000 if given is None else given
    check_bootstrap_args(args.bootstrap, args.level, option, seed=args.seed, pred_path=args.a, systems=2)
    if args.plot:
        args.plot = check_plot_target(args.plot)
    result = compare_files(
        args.truth, args.a, args.b, num_bootstrap=args.bootstrap, level=args.level, seed=args.seed, ties=args.ties,
        where=args.where, classes_path=args.classes_path, unknown=args.unknown, agreement=args.agreement,
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
