"""``torch-lwlrap score``: score a submission CSV against a ground-truth CSV.

All scoring goes through :func:`torch_lwlrap.multilabel_lwlrap_per_class`, :func:`torch_lwlrap.multilabel_lwlrap`
and :func:`torch_lwlrap.multilabel_lrap`.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Optional, Sequence, Tuple

import numpy as np

from torch_lwlrap._options import TIES
from torch_lwlrap.cli._files import (
    CommandError,
    CsvFormatError,
    align,
    check_vocabulary,
    read_classes,
    read_predictions,
    read_truth,
    select_rows,
)
from torch_lwlrap.cli._report import (
    Score,
    check_bootstrap_args,
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
    num_bootstrap: int = 0,
    level: float = 0.95,
    seed: int = 0,
) -> Score:
    """Read a truth and a submission CSV, match rows by ``fname`` and classes by name, and score them.

    Args:
        truth_path: ground truth, challenge layout (``fname,labels[,metadata...]``) or wide 0/1 table.
        pred_path: submission, ``fname,<class>,...`` with scores.
        ties: ``"max"`` (tied scores share the lowest rank, scikit-learn's rule), ``"index"`` (tied scores are
            ordered by the prediction file's column order, leftmost first) or ``"expected"`` (the mean over random
            orders of tied scores).
        num_bootstrap: with ``B > 0``, bootstrap percentile intervals of lwlrap, overall and per class, at
            ``level`` (seeded with ``seed``), in ``Score.extra["ci"]``.
        where: ``(column, value)`` conditions on the truth's metadata columns, all of which a truth row must meet
            to be scored (``[("usage", "Public")]``); prediction rows of the other truth rows are left out.
        classes_path: a vocabulary file (:func:`read_classes`): the prediction's columns must be its classes.

    Returns:
        A :class:`Score`; classes are listed in the prediction file's column order. When a positive label's score
        ties another label's, ``score.extra["ties"]`` holds the :func:`torch_lwlrap.tie_report` (as a dict).

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
    all_truth = read_truth(truth_path)
    pred = read_predictions(pred_path)
    truth = select_rows(all_truth, where)
    if classes_path is not None:
        check_vocabulary(read_classes(classes_path), classes_path, truth, pred)
    unselected = set(all_truth.fnames).difference(truth.fnames) if where else set()
    target_np, kept_rows = align(truth, pred, unselected=unselected)
    counts = target_np.sum(axis=0, dtype=np.int64)
    if counts.sum() == 0:
        rows = "the truth rows selected by " + " ".join(f"--where {c}={v}" for c, v in where) if where else "it"
        raise CsvFormatError(
            f"truth file {truth.path!r} has no positive label at all ({rows}): lwlrap is undefined without one."
        )
    scores = pred.scores if len(kept_rows) == len(pred.fnames) else pred.scores[kept_rows]
    # torch only now: a bad file is reported without waiting for it.
    import torch

    from torch_lwlrap import tie_report
    from torch_lwlrap.functional import multilabel_lrap, multilabel_lwlrap, multilabel_lwlrap_per_class

    preds = torch.from_numpy(scores)  # float64
    target = torch.from_numpy(target_np)
    per_class, weights = multilabel_lwlrap_per_class(preds, target, ties=ties)
    lwlrap = multilabel_lwlrap(preds, target, ties=ties)
    lrap = multilabel_lrap(preds, target, ties=ties)
    ties_found = tie_report(preds, target)
    extra = {"ties": ties_found.as_dict()} if ties_found.has_ties else {}
    if num_bootstrap:
        from torch_lwlrap.intervals import multilabel_lwlrap_ci

        options = dict(ties=ties, num_bootstrap=num_bootstrap, level=level, seed=seed)
        _, low, high = multilabel_lwlrap_ci(preds, target, **options)
        _, class_low, class_high = multilabel_lwlrap_ci(preds, target, average="none", **options)
        extra["ci"] = {
            "level": level,
            "num_bootstrap": num_bootstrap,
            "seed": seed,
            "lwlrap": [float(low), float(high)],
            "per_class": {
                name: None if math.isnan(lo) else [lo, hi]
                for name, lo, hi in zip(pred.classes, class_low.tolist(), class_high.tolist())
            },
        }
    return Score(
        lwlrap=float(lwlrap),
        lrap=float(lrap),
        num_samples=len(kept_rows),
        num_labels=int(counts.sum()),
        classes=list(pred.classes),
        per_class=[float(value) for value in per_class.tolist()],
        weights=[float(value) for value in weights.tolist()],
        counts=[int(value) for value in counts.tolist()],
        truth_layout=truth.layout,
        extra=extra,
        metadata_columns=list(truth.metadata),
        where=list(where),
        truth_rows=len(all_truth.fnames),
        ignored_pred_rows=len(pred.fnames) - len(kept_rows),
        vocabulary=classes_path,
    )


#: The advice printed under a tie report.
TIE_ADVICE = (
    "advice       saturated probabilities tie (float32 sigmoid is exactly 1.0 from about 17): score the logits; "
    "--ties expected gives the mean over tie orders"
)


def tie_section(score: Score) -> list:
    """The report's tie block: printed whenever a positive label's score ties another label's."""
    report = score.extra.get("ties")
    if not report:
        return []
    return [
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
        TIE_ADVICE,
    ]


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
        "are the prediction's columns; in the second every class must be a prediction column.",
    )
    parser.add_argument(
        "pred",
        metavar="PRED.csv",
        help="submission: 'fname,<class>,...' with one score per class (probabilities, logits or any real "
        "number, ranked as given); extra classes without a positive are allowed.",
    )
    parser.add_argument(
        "--per-class", action="store_true", help="add a table of per-class lwlrap, weight and count, worst first"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one JSON object {"lwlrap", "lrap", "num_samples", "num_labels", "num_classes", "per_class"} '
        "and nothing else",
    )
    parser.add_argument(
        "--plot", metavar="OUT.png", help="write a per-class bar chart, worst first (needs matplotlib)"
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
    parser.add_argument("--level", type=float, default=0.95, help="the interval's coverage (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the bootstrap (default 0): same seed, same interval")
    parser.add_argument(
        "--ties",
        choices=TIES,
        default="max",
        help="tied scores: 'max' shares the lowest rank (scikit-learn's rule, default); 'index' orders them by "
        "the prediction file's column order, leftmost first; 'expected' is the exact mean over random orders of "
        "tied scores (what sort-based code such as the challenge's gives on average)",
    )
    parser.add_argument(
        "--where",
        metavar="COLUMN=VALUE",
        action="append",
        type=_condition,
        default=[],
        help="score only the truth rows whose metadata column COLUMN holds VALUE (exactly), e.g. usage=Public for "
        "a public-leaderboard submission; repeat it to require several; prediction rows of the other truth rows "
        "are left out and counted in the report. Without it, every fname must be in both files",
    )
    parser.add_argument(
        "--classes",
        metavar="FILE",
        dest="classes_path",
        help="the class vocabulary: one class name a line, or the challenge's vocabulary CSV 'index,label[,mid]'; "
        "then the prediction columns must be exactly these classes (in any order)",
    )
    parser.add_argument(
        "--top",
        metavar="K",
        type=_top,
        help="show only the K worst classes in the per-class table and the plot (-K: the K best); implies "
        "--per-class",
    )
    parser.set_defaults(run=run)
    return parser


def _condition(text: str) -> Tuple[str, str]:
    column, equals, value = text.partition("=")
    if not equals or not column.strip():
        raise argparse.ArgumentTypeError(f"expected COLUMN=VALUE, such as usage=Public, but got {text!r}")
    return column.strip(), value.strip()


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
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise CommandError(
                "--plot needs matplotlib, which is not installed: pip install matplotlib (the package's plot extra)."
            ) from None

    num_bootstrap = 0 if args.ci is None else check_bootstrap_args(
        args.ci, args.level, "--ci", seed=args.seed, pred_path=args.pred
    )
    score = score_files(
        args.truth, args.pred, ties=args.ties, where=args.where, classes_path=args.classes_path,
        num_bootstrap=num_bootstrap, level=args.level, seed=args.seed,
    )
    if args.plot:
        write_plot(score, args.plot, top=args.top)

    if args.json:
        text = json.dumps(score.to_dict())
    else:
        text = format_report(
            score, args.truth, args.pred, per_class=args.per_class, top=args.top, sections=[tie_section]
        )
        if args.plot:
            text += f"\n\nper-class chart written to {args.plot}"
    print_output(text)
    return 0
