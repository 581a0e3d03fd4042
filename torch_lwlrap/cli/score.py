"""``torch-lwlrap score``: score a submission CSV against a ground-truth CSV.

All scoring goes through :func:`torch_lwlrap.multilabel_lwlrap_per_class`, :func:`torch_lwlrap.multilabel_lwlrap`
and :func:`torch_lwlrap.multilabel_lrap`.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from torch_lwlrap.cli._files import UNKNOWN_TARGET, CommandError, file_name
from torch_lwlrap.cli._inputs import add_input_options, input_options, read_inputs
from torch_lwlrap.cli._report import (
    Score,
    check_bootstrap_args,
    check_plot_target,
    format_report,
    print_output,
    summary_line,
    write_plot,
)

__all__ = ["add_parser", "run", "score_files"]


def score_files(
    truth_path: str,
    pred_path: str,
    *,
    ties: str = "max",
    where: Sequence[Tuple[str, str]] = (),
    classes_path: Optional[str] = None,
    unknown: Optional[str] = None,
    num_bootstrap: int = 0,
    level: float = 0.95,
    seed: int = 0,
) -> Score:
    """Read a truth and a submission CSV, match rows by ``fname`` and classes by name, and score them.

    Args:
        truth_path: ground truth, challenge layout (``fname,labels[,metadata...]``) or wide 0/1 table; ``-`` reads
            standard input, ``.gz`` is gzip-compressed.
        pred_path: submission, ``fname,<class>,...`` with scores; ``-`` and ``.gz`` as for ``truth_path`` (at
            most one of the two may be ``-``).
        ties: ``"max"`` (tied scores share the lowest rank, scikit-learn's rule), ``"index"`` (tied scores are
            ordered by the prediction file's column order, leftmost first) or ``"expected"`` (the mean over random
            orders of tied scores).
        num_bootstrap: with ``B > 0``, bootstrap percentile intervals of lwlrap, overall and per class, at
            ``level`` (seeded with ``seed``), in ``Score.extra["ci"]``.
        where: ``(column, value)`` conditions on the truth's metadata columns, all of which a truth row must meet
            to be scored (``[("usage", "Public")]``); prediction rows of the other truth rows are left out.
        classes_path: a vocabulary file (:func:`read_classes`): the prediction's columns must be its classes.
        unknown: in a wide truth table, the value that marks an unknown label (``"-1"``): such entries are
            neither positive nor ranked (the functions' ``ignore_index``).

    Returns:
        A :class:`Score`; classes are listed in the prediction file's column order. When a positive label's score
        ties another label's, ``score.extra["ties"]`` holds the :func:`torch_lwlrap.tie_report` (as a dict) and
        what the tied scores show (:func:`tie_causes`). ``score.extra["options"]`` holds every option that shaped
        the numbers.

    Raises:
        CsvFormatError: a bad file (see :func:`read_truth`, :func:`read_predictions`), an fname in one file but
            not the other (outside the rows ``where`` leaves out), a truth class that is not a prediction column,
            or a truth without any positive label.
        CommandError: a ``where`` condition that names no metadata column or selects no row; a prediction
            column outside the vocabulary of ``classes_path``, or a vocabulary class without a column.

    Example:
        >>> import os, tempfile
        >>> folder = tempfile.mkdtemp()
        >>> with open(os.path.join(folder, "truth.csv"), "w") as f:
        ...     _ = f.write('fname,labels\\nx.wav,"a,c"\\ny.wav,"b,c"\\n')
        >>> with open(os.path.join(folder, "pred.csv"), "w") as f:
        ...     _ = f.write("fname,a,b,c\\ny.wav,0.1,0.7,0.2\\nx.wav,0.1,0.7,0.2\\n")
        >>> score = score_files(os.path.join(folder, "truth.csv"), os.path.join(folder, "pred.csv"))
        >>> round(score.lwlrap, 4), round(score.lrap, 4), score.num_labels
        (0.7917, 0.7917, 4)
        >>> [round(value, 4) for value in score.per_class]
        [0.6667, 1.0, 0.75]
    """
    inputs = read_inputs(truth_path, [pred_path], where=where, classes_path=classes_path, unknown=unknown)
    scores, target_np, ignore_index = inputs.scores[0], inputs.target, inputs.ignore_index
    # torch only now: a bad file is reported without waiting for it.
    import torch

    from torch_lwlrap import tie_report
    from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class

    preds = torch.from_numpy(scores)  # float64
    target = torch.from_numpy(target_np)
    rule = dict(ties=ties, ignore_index=ignore_index)
    per_class, weights = multilabel_lwlrap_per_class(preds, target, **rule)
    lwlrap = multilabel_lwlrap(preds, target, **rule)
    lrap = multilabel_lrap(preds, target, **rule)
    ties_found = tie_report(preds, target, ignore_index=ignore_index)
    extra: Dict[str, object] = {}
    if ties_found.has_ties:
        extra["ties"] = {**ties_found.as_dict(), **tie_causes(scores, target_np)}
    if num_bootstrap:
        from torch_lwlrap.functional._intervals import multilabel_lwlrap_ci

        options = dict(num_bootstrap=num_bootstrap, level=level, seed=seed, **rule)
        _, low, high = multilabel_lwlrap_ci(preds, target, **options)
        _, class_low, class_high = multilabel_lwlrap_ci(preds, target, average="none", **options)
        extra["ci"] = {
            "level": level,
            "num_bootstrap": num_bootstrap,
            "seed": seed,
            "lwlrap": None if math.isnan(low) else [float(low), float(high)],
            "per_class": {
                name: None if math.isnan(lo) else [lo, hi]
                for name, lo, hi in zip(inputs.classes, class_low.tolist(), class_high.tolist())
            },
        }
    extra["options"] = {
        **input_options(ties, where, classes_path, unknown),
        "bootstrap": num_bootstrap or None,
        "level": level if num_bootstrap else None,
        "seed": seed if num_bootstrap else None,
    }
    return Score(
        lwlrap=float(lwlrap),
        lrap=float(lrap),
        num_samples=len(target_np),
        num_labels=int(inputs.counts.sum()),
        classes=inputs.classes,
        per_class=[float(value) for value in per_class.tolist()],
        weights=[float(value) for value in weights.tolist()],
        counts=[int(value) for value in inputs.counts.tolist()],
        truth_layout=inputs.truth.layout,
        extra=extra,
        metadata_columns=list(inputs.truth.metadata),
        where=list(where),
        truth_rows=inputs.truth_rows,
        ignored_pred_rows=inputs.ignored_pred_rows[0],
        vocabulary=classes_path,
        num_unknown=inputs.num_unknown,
        rows_without_label=int(((target_np == 1).sum(axis=1) == 0).sum()),
    )


#: Scores with at most this many decimals, or this many significant digits, count as rounded (``%g`` writes 6).
_MAX_ROUNDED_DECIMALS = 6

#: The distinct scores whose significant digits are counted (spread over their range): enough to catch a file
#: written with every digit, without formatting millions of numbers.
_DIGITS_SAMPLE = 2000


def _significant_digits(finite: np.ndarray) -> Optional[int]:
    """The fewest significant digits (1 to :data:`_MAX_ROUNDED_DECIMALS`) that every nonzero score of ``finite``
    is written with (``1.23e-01``: 3), read on up to :data:`_DIGITS_SAMPLE` distinct scores; None beyond.

    Example:
        >>> _significant_digits(np.array([0.123, 4.5e-07, 0.5, 12300.0])), _significant_digits(np.array([1 / 3]))
        (3, None)
    """
    distinct = np.unique(finite[finite != 0])
    if distinct.size > _DIGITS_SAMPLE:
        distinct = distinct[np.linspace(0, distinct.size - 1, _DIGITS_SAMPLE).astype(np.int64)]
    values = distinct.tolist()
    return next(
        (d for d in range(1, _MAX_ROUNDED_DECIMALS + 1) if all(float(f"{v:.{d - 1}e}") == v for v in values)), None
    ) if values else None


def tie_causes(scores: np.ndarray, target: np.ndarray) -> Dict[str, object]:
    """What the tied scores show: how many tied positive labels are scored exactly 0 or 1 while every score is a
    probability (saturated), and the fewest decimals every score is written with (rounded), None beyond 6; and the
    fewest significant digits (``%.2e``, ``%g``) where those are fewer than the decimals or the decimals are beyond
    6 (``%.1e`` of probabilities above 1e-5 has at most 6 decimals, but 2 digits tell how coarse it is), else None;
    and whether each row's ranked scores are one value (``ranks_nothing``: no row orders any label); and whether a
    positive label ties a negative one or a negative scores above a tied positive (``tie_orders_matter``: else every
    tie rule and order gives each positive the same precision, 1 for a tied one).

    Unknown labels (:data:`UNKNOWN_TARGET`) are not ranked, so they tie nothing.

    Example:
        >>> causes = tie_causes(np.array([[1.0, 1.0, 0.25], [0.5, 0.5, 0.75]]), np.array([[1, 0, 0], [0, 1, 0]]))
        >>> causes["saturated_tied_label_count"], causes["score_decimals"], causes["score_significant_digits"]
        (1, 2, None)
    """
    ranked = np.where(target == UNKNOWN_TARGET, np.nan, scores)  # NaN ties no score
    order = np.argsort(ranked, axis=1, kind="stable")
    ordered = np.take_along_axis(ranked, order, axis=1)
    equal = ordered[:, 1:] == ordered[:, :-1]
    tied_in_order = np.zeros(ordered.shape, dtype=bool)
    tied_in_order[:, 1:] |= equal
    tied_in_order[:, :-1] |= equal
    tied = np.empty_like(tied_in_order)
    np.put_along_axis(tied, order, tied_in_order, axis=1)
    tied_positive = tied & (target == 1)
    # Tie orders change a precision where a positive ties a negative, or where a negative scores above a tied
    # positive (its precision then depends on its place in its group: `max` gives each the group's last place).
    ordered_target = np.take_along_axis(target, order, axis=1)  # in a run of equal scores: 0 and 1 (unknowns are NaN)
    negatives_above = np.cumsum((ordered_target == 0)[:, ::-1], axis=1)[:, ::-1]  # at or above each place (ascending)
    orders_matter = bool((equal & (ordered_target[:, 1:] != ordered_target[:, :-1])).any()) or bool(
        (tied_in_order & (ordered_target == 1) & (negatives_above > 0)).any()
    )
    values = ranked[~np.isnan(ranked)]
    probabilities = values.size > 0 and values.min() >= 0.0 and values.max() <= 1.0
    saturated = int((tied_positive & ((scores == 0.0) | (scores == 1.0))).sum()) if probabilities else 0
    finite = values[np.isfinite(values)]
    decimals = next(
        (d for d in range(_MAX_ROUNDED_DECIMALS + 1) if np.array_equal(np.round(finite, d), finite)), None
    ) if finite.size else None  # no finite score (every one +-inf): nothing was rounded
    # Digits can say more than the decimals only where there are more than one (or none within 6).
    digits = _significant_digits(finite) if finite.size and (decimals is None or decimals > 1) else None
    if digits is not None and decimals is not None and digits >= decimals:
        digits = None  # the decimals say it as well
    # Each row's ranked scores one value (unknown labels, NaN here, left out): no row orders anything.
    low, high = np.fmin.reduce(ranked, axis=1), np.fmax.reduce(ranked, axis=1)
    ranks_nothing = bool(values.size) and bool(((low == high) | np.isnan(low)).all())
    return {"saturated_tied_label_count": saturated, "score_decimals": decimals, "score_significant_digits": digits,
            "ranks_nothing": ranks_nothing, "tie_orders_matter": orders_matter}


def tie_section(score: Score) -> list:
    """The report's tie block: printed whenever a positive label's score ties another label's; says what the tied
    scores show and advises only what the run did not already do."""
    report = score.extra.get("ties")
    if not report:
        return []
    lines = [
        summary_line(
            "ties",
            f"{report['tied_label_count']} of {report['label_count']} positive labels "
            f"({100 * report['tied_share']:.1f}%) tie with another label's score",
        ),
        summary_line(
            "tied lwlrap",
            f"max {report['lwlrap_max']:.6f}, expected {report['lwlrap_expected']:.6f}, "
            f"{report['lwlrap_worst']:.6f} to {report['lwlrap_best']:.6f} over tie orders",
        ),
    ]
    if not report.get("tie_orders_matter", True):  # no order of the ties changes lwlrap (nor LRAP)
        lines.append(summary_line(
            "effect", "none: each tied positive ties only other positives (or unknown labels), with no negative "
                      "above them, so every tie rule and order gives the same lwlrap"))
        return lines
    advice = []
    every_digit = "write the scores with every digit (pandas' to_csv does unless given float_format=)"
    decimals = report.get("score_decimals")
    digits = report.get("score_significant_digits")
    saturated = report.get("saturated_tied_label_count", 0)
    if report.get("ranks_nothing"):  # the one cause: rounding or saturation would only say it less plainly
        lines.append(summary_line(
            "cause", "each row's scores are equal: the file ranks nothing (small scores rounded away, as "
                     "float_format='%.2f' does to probabilities below 0.005, or a constant output)"))
        advice.append(every_digit)
    else:
        if decimals is not None or digits is not None:
            if digits is None:
                places = "1 decimal" if decimals == 1 else f"{decimals} decimals"
                rounded = "whole numbers" if decimals == 0 else f"rounded: none has more than {places}"
            else:
                places = "1 significant digit" if digits == 1 else f"{digits} significant digits"
                rounded = f"rounded: none has more than {places}"
            lines.append(summary_line("cause", f"the scores are {rounded}, so nearby scores collide"))
            advice.append(every_digit)
        if saturated and 2 * saturated >= report["tied_label_count"]:
            lines.append(
                summary_line(
                    "cause",
                    f"{saturated} of the {report['tied_label_count']} tied positive labels are scored exactly 0 or "
                    f"1: saturated probabilities (float32 sigmoid is exactly 1.0 from a logit of about 17)",
                )
            )
            advice.append("score the logits")
    if not advice:
        lines.append(summary_line("cause", "equal scores within a row (neither rounded nor saturated at 0 or 1)"))
    if score.extra.get("options", {}).get("ties") != "expected":
        advice.append("--ties expected gives the mean over tie orders")
    if advice:
        lines.append(summary_line("advice", "; ".join(advice)))
    return lines


def add_parser(commands: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    """Add the ``score`` subcommand to the command line's subparsers; :func:`run` runs it."""
    parser = commands.add_parser(
        "score",
        help="score a submission CSV against a ground-truth CSV",
        description="Score a Kaggle-format submission against the ground truth: prints lwlrap (label-weighted "
        "label-ranking average precision) and LRAP. Rows are matched by fname and classes by column name, both "
        "in any order; every fname must be in both files (with --where, every selected one). Truth columns "
        "besides fname and labels are metadata: not scored, named in the report.",
        epilog="Exit status: 0 on success, 2 on a bad file or bad arguments (one line on stderr).",
    )
    parser.add_argument(
        "truth",
        metavar="TRUTH.csv",
        help="ground truth: 'fname,labels' with the positive class names of a row comma-joined in one quoted "
        'field (a.wav,"Bark,Dog"), or a wide 0/1 table \'fname,<class>,...\'. In the first layout the classes '
        "are the prediction's columns; in the second every class must be a prediction column. A .gz file is "
        "read gzip-compressed; '-' reads standard input (at most one of the two files).",
    )
    parser.add_argument(
        "pred",
        metavar="PRED.csv",
        help="submission: 'fname,<class>,...' with one score per class (probabilities, logits or any real "
        "number, ranked as given); extra classes without a positive are allowed. '-' and .gz as for TRUTH.csv.",
    )
    parser.add_argument(
        "--per-class", action="store_true", help="add a table of per-class lwlrap, weight and count, worst first"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object and nothing else: "lwlrap", "lrap", "num_samples", "num_labels", "num_classes", '
        '"num_unknown", "rows_without_label", "per_class", "classes_without_positive", "metadata_columns", '
        '"selection", "vocabulary", "options", and "ties" when positives are tied, "ci" with --ci (the README\'s '
        "Command line section, also the package's description: `python -c \"import importlib.metadata as m; "
        "print(m.metadata('torch_lwlrap')['Description'])\"`, lists their fields)",
    )
    parser.add_argument(
        "--plot",
        metavar="OUT.png",
        help="write a per-class bar chart, worst first, with each class's interval under --ci (needs matplotlib)",
    )
    parser.add_argument(
        "--ci",
        metavar="B",
        nargs="?",
        type=int,
        const=1000,
        default=None,
        help="add a bootstrap confidence interval of lwlrap (overall, --per-class rows and --json) from B "
        "replicates (default B: 1000): the sampling variability of the evaluation set",
    )
    parser.add_argument("--level", type=float, help="the interval's coverage (default 0.95; with --ci)")
    parser.add_argument(
        "--seed", type=int, help="seed of the bootstrap (default 0; with --ci): same seed, same interval"
    )
    add_input_options(parser)
    parser.add_argument(
        "--top",
        metavar="K",
        type=_top,
        help="show only the K worst classes in the per-class table and the plot (-K: the K best); implies "
        "--per-class",
    )
    parser.set_defaults(run=run)
    return parser


def _top(text: str) -> int:
    try:
        top = int(text)
    except ValueError:
        top = 0
    if top == 0:
        raise argparse.ArgumentTypeError(
            f"expected a non-zero whole number (10: the 10 worst classes, -10: the 10 best), but got {text!r}"
        )
    return top


def run(args: argparse.Namespace) -> int:
    """Run ``torch-lwlrap score`` with the parsed arguments; raises :class:`CommandError` for the user to fix."""
    if args.plot:
        args.plot = check_plot_target(args.plot)

    if args.ci is None and (args.level is not None or args.seed is not None):
        given = " and ".join(f"--{name}" for name in ("level", "seed") if getattr(args, name) is not None)
        verb = "set" if " and " in given else "sets"
        raise CommandError(f"{given} {verb} the bootstrap interval, which --ci asks for: add --ci (1000 replicates) "
                           f"or --ci B, or leave {given} out.")
    level = 0.95 if args.level is None else args.level
    seed = 0 if args.seed is None else args.seed
    num_bootstrap = 0 if args.ci is None else check_bootstrap_args(
        args.ci, level, "--ci", seed=seed, pred_path=args.pred
    )
    score = score_files(
        args.truth, args.pred, ties=args.ties, where=args.where, classes_path=args.classes_path,
        unknown=args.unknown, num_bootstrap=num_bootstrap, level=level, seed=seed,
    )
    if args.plot:
        write_plot(score, args.plot, top=args.top)

    if args.json:
        text = json.dumps(score.to_dict())
    else:
        text = format_report(
            score, file_name(args.truth), file_name(args.pred), per_class=args.per_class, top=args.top,
            sections=[tie_section],
        )
        if args.plot:
            text += f"\n\nper-class chart written to {args.plot}"
    print_output(text)
    return 0
