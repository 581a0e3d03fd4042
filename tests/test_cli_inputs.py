"""The command line as a user runs it, on files written by pandas: the options ``score`` and ``compare`` share
(``--where``, ``--classes``, ``--ties``, ``--unknown``), ``--json``'s ``"options"``, the tie block's cause and
advice, standard input, gzip files, other separators and swapped files, and ``score --plot --ci``.

Each run goes through the command's entry point, ``main(argv)``, the function ``python -m torch_lwlrap`` and the
``torch-lwlrap`` script call, in this process (a fresh interpreter for each run took 5 s, most of this file's time),
with the warning filters the program runs under and its own standard input and output; the tests of standard input
also run it as a subprocess, fed through a real pipe. ``tests/test_cli_errors.py`` runs the program as a subprocess
throughout. Values are checked against scikit-learn, the naive loops of ``tests/reference.py`` or
:func:`torch_lwlrap.compare_lwlrap` on arrays the test builds itself.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score

from tests.cli_output import is_error_line, without_compile_notice
from tests.reference import naive_lwlrap
from torch_lwlrap import compare_lwlrap, multilabel_lwlrap_ci
from torch_lwlrap.cli import main

pd = pytest.importorskip("pandas")

REPO = Path(__file__).resolve().parents[1]
CLASSES = ["Bark", "Fill_(with_liquid)", "Hi-hat", "Purr", "Zipper_(clothing)", "Yell"]


def _added_by_the_suite(entry) -> bool:
    action, message, category, module, _ = entry
    deprecations = (DeprecationWarning, PendingDeprecationWarning)
    return action == "error" or (action == "always" and category in deprecations and message is module is None)


def cli(*args, stdin=None, process=False):
    """``torch-lwlrap ARGS``: (exit status, stdout, stderr), with ``stdin`` (bytes) as standard input.

    In this process: ``main(argv)`` with standard input and output replaced, under the warning filters of the process
    less those the suite adds, which a user's run does not have (pyproject.toml's ``error``, and pytest's ``always``
    for deprecations, which Python ignores outside ``__main__``): a library warning is then printed as the program
    prints it, not raised. ``process=True``: ``python -m torch_lwlrap ARGS`` in a subprocess, ``stdin`` through a
    pipe."""
    argv = [str(arg) for arg in args]
    if process:
        done = subprocess.run([sys.executable, "-m", "torch_lwlrap", *argv], input=stdin, capture_output=True,
                              cwd=REPO, timeout=300)
        return done.returncode, done.stdout.decode("utf-8"), without_compile_notice(done.stderr.decode("utf-8"))
    out, err = io.StringIO(), io.StringIO()
    piped = sys.stdin if stdin is None else io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        warnings.filters[:] = [entry for entry in warnings.filters if not _added_by_the_suite(entry)]
        saved, sys.stdin = sys.stdin, piped
        try:
            code = main(argv)
        finally:
            sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


def cli_json(*args, stdin=None, process=False):
    code, out, err = cli(*args, "--json", stdin=stdin, process=process)
    assert (code, err) == (0, ""), err
    return json.loads(out)


def cli_error(*args, stdin=None, process=False):
    """The one line on stderr of a run that must fail with status 2 and print nothing."""
    code, out, err = cli(*args, stdin=stdin, process=process)
    assert (code, out) == (2, ""), (code, out, err)
    assert is_error_line(err), err
    return err


def sklearn_lwlrap(scores, target):
    """Overall lwlrap: LRAP weighted by each row's positive count (scikit-learn's rule for ties, 'max')."""
    return label_ranking_average_precision_score(target, scores, sample_weight=target.sum(axis=1))


def arrays(seed, num_rows=50, decimals=1, scale=1.0):
    rng = np.random.default_rng(seed)
    scores = np.round(scale * rng.random((num_rows, len(CLASSES))), decimals)
    target = (rng.random((num_rows, len(CLASSES))) < 0.35).astype(np.int64)
    target[target.sum(axis=1) == 0, 0] = 1
    fnames = [f"{rng.integers(16**8):08x}.wav" for _ in range(num_rows)]
    return fnames, scores, target


def submission(fnames, scores, classes=CLASSES):
    frame = pd.DataFrame(scores, columns=classes)
    frame.insert(0, "fname", fnames)
    return frame


def challenge_truth(fnames, target, **metadata):
    labels = [",".join(CLASSES[j] for j in np.flatnonzero(row)) for row in target]
    return pd.DataFrame({"fname": fnames, "labels": labels, **metadata})


def wide_truth(fnames, target):
    frame = pd.DataFrame(target, columns=CLASSES)
    frame.insert(0, "fname", fnames)
    return frame


# ---------------------------------------------------------------------------------------------------------------
# compare: the options of score


@pytest.fixture
def two_systems(tmp_path):
    """The official test-label layout with usage, two public+private submissions written by pandas (B with its
    rows and columns in another order), and the arrays they hold."""
    fnames, scores_a, target = arrays(0, num_rows=60)
    scores_b = np.round(np.clip(scores_a + 0.3 * target - 0.15 + 0.2 * np.random.default_rng(1).random(target.shape),
                                0, 1), 1)
    usage = np.where(np.arange(60) % 3 == 0, "Private", "Public")
    challenge_truth(fnames, target, usage=usage, license="CC0").to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores_a).to_csv(tmp_path / "a.csv", index=False)
    order, columns = np.random.default_rng(2).permutation(60), CLASSES[::-1]
    submission([fnames[i] for i in order], scores_b[order][:, ::-1], columns).to_csv(tmp_path / "b.csv", index=False)
    (tmp_path / "vocabulary.csv").write_text("".join(f"{j},{name},/m/{j}\n" for j, name in enumerate(CLASSES)))
    return tmp_path, scores_a, scores_b, target, usage == "Public", fnames


@pytest.mark.parametrize("ties", ["max", "expected"])
def test_compare_takes_where_classes_and_ties_expected(two_systems, ties):
    folder, scores_a, scores_b, target, public, fnames = two_systems
    result = cli_json("compare", folder / "truth.csv", folder / "a.csv", folder / "b.csv", "--where", "usage=Public",
                      "--classes", folder / "vocabulary.csv", "--ties", ties, "--bootstrap", "200", "--seed", "3")
    rows = sorted(np.flatnonzero(public), key=fnames.__getitem__)  # the command resamples rows in fname order
    a, b, t = scores_a[rows], scores_b[rows], target[rows]
    assert result["num_samples"] == int(public.sum()) and result["num_labels"] == int(t.sum())
    assert result["lwlrap_a"] == pytest.approx(naive_lwlrap(a, t, ties), abs=1e-12)
    assert result["lwlrap_b"] == pytest.approx(naive_lwlrap(b, t, ties), abs=1e-12)
    if ties == "max":
        assert result["lwlrap_a"] == pytest.approx(sklearn_lwlrap(a, t), abs=1e-12)
    expected = compare_lwlrap(torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(t), ties=ties,
                              num_bootstrap=200, seed=3)
    assert result["difference"] == pytest.approx(float(expected.difference), abs=1e-12)
    assert result["interval"] == pytest.approx([float(expected.low), float(expected.high)], abs=1e-12)
    assert result["selection"] == {"where": {"usage": "Public"}, "truth_rows": 60, "selected_rows": int(public.sum()),
                                   "ignored_prediction_rows": {"a": int((~public).sum()), "b": int((~public).sum())}}
    assert result["options"] == {"ties": ties, "where": {"usage": "Public"}, "classes": str(folder / "vocabulary.csv"),
                                 "unknown": None, "bootstrap": 200, "level": 0.95, "seed": 3, "agreement": None}


def test_compare_checks_the_options_as_score_does(two_systems):
    folder = two_systems[0]
    files = [folder / "truth.csv", folder / "a.csv"]
    (folder / "short_vocabulary.txt").write_text("\n".join(CLASSES[:-1]) + "\n")
    for option in (["--where", "usage=Secret"], ["--where", "split=test"], ["--classes", folder / "short_vocabulary.txt"]):
        error = cli_error("score", *files, *option)
        assert cli_error("compare", *files, folder / "b.csv", *option) == error.replace("score", "compare")
    assert "--where usage=Secret selects no row" in cli_error("compare", *files, folder / "b.csv", "--where", "usage=Secret")


def test_one_prediction_row_outside_the_selection_is_one_row(tmp_path):
    fnames, scores, target = arrays(9, num_rows=12)
    usage = ["Public"] * 11 + ["Private"]
    challenge_truth(fnames, target, usage=usage).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "a.csv", index=False)
    submission(fnames, scores[:, ::-1]).to_csv(tmp_path / "b.csv", index=False)
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "a.csv", "--where", "usage=Public")
    assert code == 0, err
    assert f"predictions  {tmp_path / 'a.csv'} (1 row outside the selection ignored)\n" in out
    code, out, err = cli("compare", tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "b.csv", "--where",
                         "usage=Public", "--bootstrap", "20")
    assert code == 0, err
    assert f"B            {tmp_path / 'b.csv'} (1 row outside the selection ignored)\n" in out


def test_compare_report_names_the_files_and_says_replicates(two_systems):
    folder = two_systems[0]
    code, out, err = cli("compare", folder / "truth.csv", folder / "a.csv", folder / "b.csv", "--bootstrap", "150",
                         "--where", "usage=Public", "--ties", "expected")
    assert (code, err) == (0, "")
    assert "paired bootstrap over the evaluation rows: 150 replicates, seed 0" in out
    assert "B=" not in out  # B is system B, never the number of replicates
    assert f"A            {folder / 'a.csv'} (20 rows outside the selection ignored)" in out
    assert "ties         --ties expected" in out
    _, usage, _ = cli("compare", "--help")
    assert "--bootstrap N" in usage and "--ci [N]" in usage and "--bootstrap B" not in usage


def test_compare_plot_title_names_both_files(two_systems, monkeypatch, capsys):
    """The chart's title says which file is A and which B (read from the figure as saved)."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure


    folder = two_systems[0]
    titles = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: titles.append(fig.get_suptitle()))
    code = main(["compare", str(folder / "truth.csv"), str(folder / "a.csv"), str(folder / "b.csv"), "--bootstrap",
                 "100", "--plot", str(folder / "d.png")])
    assert code == 0, capsys.readouterr().err
    assert titles and titles[0].splitlines()[0] == "A = a.csv, B = b.csv"


def test_intervals_depend_on_no_file_layout_and_swapping_mirrors_them(two_systems, tmp_path):
    """The bootstrap resamples rows in fname order: shuffling a file's rows (or the truth's) changes no interval,
    and swapping A and B negates the difference and mirrors its interval."""
    folder, scores_a, scores_b, target, _, fnames = two_systems
    order = np.random.default_rng(7).permutation(len(fnames))
    submission([fnames[i] for i in order], scores_a[order]).to_csv(tmp_path / "a_shuffled.csv", index=False)
    pd.read_csv(folder / "truth.csv").iloc[order[::-1]].to_csv(tmp_path / "truth_shuffled.csv", index=False)
    ci = [cli_json("score", truth, a, "--ci", "200", "--seed", "1")["ci"]
          for truth, a in ((folder / "truth.csv", folder / "a.csv"), (tmp_path / "truth_shuffled.csv",
                                                                      tmp_path / "a_shuffled.csv"))]
    assert ci[0] == ci[1]
    forward = cli_json("compare", folder / "truth.csv", tmp_path / "a_shuffled.csv", folder / "b.csv",
                       "--bootstrap", "200")
    backward = cli_json("compare", tmp_path / "truth_shuffled.csv", folder / "b.csv", folder / "a.csv",
                        "--bootstrap", "200")
    # (B's columns are in another order: class sums added in another order, equal up to rounding)
    assert backward["difference"] == pytest.approx(-forward["difference"], abs=1e-15)
    assert backward["interval"] == pytest.approx([-forward["interval"][1], -forward["interval"][0]], abs=1e-15)
    assert backward["p_value"] == forward["p_value"]
    # the same interval as the function on the rows sorted by fname
    rows = sorted(range(len(fnames)), key=fnames.__getitem__)
    expected = compare_lwlrap(*(torch.from_numpy(x[rows]) for x in (scores_a, scores_b, target)), num_bootstrap=200,
                              seed=0)
    assert forward["interval"] == pytest.approx([float(expected.low), float(expected.high)], abs=1e-12)


def test_a_reset_index_column_is_refused_and_a_whole_number_column_flagged(tmp_path):
    """pandas' reset_index() keeps the old index as a column named 'index': after filtering or shuffling it holds
    row numbers that do not count 0, 1, 2, ..., and it was scored as a class without a positive label (lwlrap
    0.55 instead of 0.91, exit 0). A 'fold' column of whole numbers is scored (it may be a class) with a warning."""
    fnames, scores, target = arrays(4, num_rows=30)
    usage = ["Public" if i % 3 else "Private" for i in range(30)]
    challenge_truth(fnames, target, usage=usage).to_csv(tmp_path / "truth.csv", index=False)
    frame = submission(fnames, scores)
    frame[[u == "Public" for u in usage]].reset_index().to_csv(tmp_path / "public.csv", index=False)
    frame.sample(frac=1.0, random_state=0).reset_index().to_csv(tmp_path / "shuffled.csv", index=False)
    for name, extra in (("public.csv", ["--where", "usage=Public"]), ("shuffled.csv", [])):
        err = cli_error("score", tmp_path / "truth.csv", tmp_path / name, *extra)
        assert "column 1 ('index') holds distinct whole numbers" in err and "reset_index(drop=True)" in err, err
    frame.assign(fold=np.arange(30) % 5).to_csv(tmp_path / "fold.csv", index=False)
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "fold.csv", "--json")
    assert code == 0 and err.count("\n") == 1, err
    assert "warning: prediction file" in err and "the column 'fold' holds whole numbers" in err, err
    with_fold = np.hstack([scores, (np.arange(30) % 5)[:, None]])
    assert json.loads(out)["lwlrap"] == pytest.approx(
        sklearn_lwlrap(with_fold, np.hstack([target, np.zeros((30, 1), dtype=np.int64)])), abs=1e-12
    )
    # hard 0/1 predictions of a class without a positive label are no cause for a warning
    frame.assign(Extra=np.arange(30) % 2).to_csv(tmp_path / "binary.csv", index=False)
    code, _, err = cli("score", tmp_path / "truth.csv", tmp_path / "binary.csv")
    assert (code, err) == (0, "")


def test_a_public_subset_of_one_labelled_row_gets_no_interval_or_p_value(tmp_path):
    """--where picks one clip with labels: every replicate is that clip, so the command says there is no interval
    (text) and writes null (JSON) instead of a zero-width interval and p = 0.003."""
    fnames, scores_a, target = arrays(8, num_rows=12)
    usage = ["Public"] + ["Private"] * 11
    challenge_truth(fnames, target, usage=usage).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores_a).to_csv(tmp_path / "a.csv", index=False)
    submission(fnames, scores_a[:, ::-1]).to_csv(tmp_path / "b.csv", index=False)
    files = (tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "b.csv")
    result = cli_json("compare", *files, "--where", "usage=Public")
    assert result["difference"] != 0 and result["interval"] is None and result["p_value"] is None
    code, out, err = cli("compare", *files, "--where", "usage=Public")
    assert (code, err) == (0, "")
    assert "no interval or p-value: one row with a positive label" in out
    scored = cli_json("score", files[0], files[1], "--where", "usage=Public", "--ci", "100")
    assert scored["ci"]["lwlrap"] is None
    assert scored["lwlrap"] == pytest.approx(sklearn_lwlrap(scores_a[:1], target[:1]), abs=1e-12)
    code, out, err = cli("score", files[0], files[1], "--where", "usage=Public", "--ci", "100")
    assert (code, err) == (0, "") and "no interval: one row with a positive label" in out
    # two rows: an interval again
    two = cli_json("compare", *files, "--where", "usage=Private")
    assert two["interval"][0] <= two["difference"] <= two["interval"][1] and two["p_value"] is not None


def test_compare_of_a_class_with_one_positive_and_few_replicates(tmp_path, monkeypatch, capsys):
    """A class with a single positive label is reported without an interval or p-value ('-', null), and a chart
    from a handful of replicates (intervals that need not hold their value) is drawn without an error; many
    classes are split into panels."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure


    fnames, scores_a, target = arrays(4, num_rows=40)
    target[:, 3] = 0
    target[5, 3] = 1  # Purr: one positive
    scores_b = scores_a.copy()
    scores_a[5, 3], scores_b[5, 3] = 0.99, 0.01
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores_a).to_csv(tmp_path / "a.csv", index=False)
    submission(fnames, scores_b).to_csv(tmp_path / "b.csv", index=False)
    result = cli_json("compare", tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "b.csv")
    purr = result["per_class"]["Purr"]
    assert purr["difference"] > 0 and purr["interval"] is None and purr["p_value"] is None and purr["count"] == 1
    code, out, err = cli("compare", tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "b.csv", "--per-class")
    assert (code, err) == (0, "")
    line = next(line for line in out.splitlines() if line.startswith("Purr "))
    assert line.split()[-3:] == ["-", "-", "1"]
    assert "a class with a single positive label has no interval or p-value" in out
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: saved.append(len(fig.axes)))
    for seed in range(4):
        with warnings.catch_warnings():  # shown on stderr by the command, as a user sees it
            warnings.simplefilter("always")
            code = main(["compare", str(tmp_path / "truth.csv"), str(tmp_path / "a.csv"), str(tmp_path / "b.csv"),
                         "--bootstrap", "3", "--seed", str(seed), "--plot", str(tmp_path / "d.png")])
        err = capsys.readouterr().err
        assert code == 0 and "warning: A 0.95 percentile interval from 3 bootstrap replicate" in err, err
    many = [f"class_{j:03d}" for j in range(250)]
    rng = np.random.default_rng(0)
    wide = (rng.random((30, 250)) < 0.2).astype(int)
    wide[:, :] |= np.eye(30, 250, dtype=int)
    frame = pd.DataFrame(wide, columns=many)
    frame.insert(0, "fname", fnames[:30])
    frame.to_csv(tmp_path / "wide.csv", index=False)
    for name in ("a", "b"):
        sub = pd.DataFrame(rng.random((30, 250)), columns=many)
        sub.insert(0, "fname", fnames[:30])
        sub.to_csv(tmp_path / f"{name}_many.csv", index=False)
    code = main(["compare", str(tmp_path / "wide.csv"), str(tmp_path / "a_many.csv"), str(tmp_path / "b_many.csv"),
                 "--bootstrap", "50", "--plot", str(tmp_path / "many.png")])
    assert code == 0, capsys.readouterr().err
    assert saved[:4] == [1, 1, 1, 1] and saved[4] == 3  # 250 classes: three panels of at most 110 bars


def test_a_wide_truth_of_pandas_bools_and_a_misnamed_labels_column(tmp_path):
    """pandas writes a bool column as True/False: read as 1/0. A two-column truth whose labels column has another
    name is read as a wide table, and its error says to name the column 'labels'."""
    fnames, scores, target = arrays(5, num_rows=30)
    wide_truth(fnames, target.astype(bool)).to_csv(tmp_path / "bools.csv", index=False)
    assert "True" in (tmp_path / "bools.csv").read_text()
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    result = cli_json("score", tmp_path / "bools.csv", tmp_path / "pred.csv")
    assert result["lwlrap"] == pytest.approx(sklearn_lwlrap(scores, target), abs=1e-12)
    challenge_truth(fnames, target).rename(columns={"labels": "tags"}).to_csv(tmp_path / "tags.csv", index=False)
    error = cli_error("score", tmp_path / "tags.csv", tmp_path / "pred.csv")
    assert "column 'tags'" in error and "rename 'tags' to 'labels'" in error


def test_fnames_without_their_extension_are_counted_and_shown(tmp_path):
    fnames, scores, target = arrays(6, num_rows=20)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission([f.removesuffix(".wav") for f in fnames], scores).to_csv(tmp_path / "pred.csv", index=False)
    error = cli_error("score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert f"fname {fnames[0]!r}" in error and "(and 19 more of its 20 fnames)" in error
    assert f"its fnames read like {fnames[0].removesuffix('.wav')!r}" in error


def test_missing_and_extra_rows_are_counted_and_the_fname_form_shown_only_where_it_differs(tmp_path):
    fnames, scores, target = arrays(6, num_rows=20)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    # Two rows left out of a submission whose fnames are written as the truth's: no hint about their form.
    submission(fnames[2:], scores[2:]).to_csv(tmp_path / "short.csv", index=False)
    error = cli_error("score", tmp_path / "truth.csv", tmp_path / "short.csv")
    assert f"fname {fnames[0]!r}" in error and "(and 1 more of its 20 fnames) is missing from prediction" in error
    assert "read like" not in error, error
    # Three rows the truth does not have: the first named, the others counted.
    extra = [f"extra{i}.wav" for i in range(3)]
    submission(fnames + extra, np.vstack([scores, scores[:3]])).to_csv(tmp_path / "long.csv", index=False)
    error = cli_error("score", tmp_path / "truth.csv", tmp_path / "long.csv")
    assert "fname 'extra0.wav' of prediction file" in error and "(and 2 more of its 23 fnames) is missing from truth" \
        in error, error


def test_rows_without_a_label_are_counted_on_the_samples_line(tmp_path):
    """An empty labels field (pandas writes an empty string as nothing) is a row without a positive: lwlrap leaves it
    out, LRAP counts it as 1 as scikit-learn does, and the report says how many there are."""
    fnames, scores, target = arrays(8, num_rows=25)
    target[[3, 11], :] = 0
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    assert f"{fnames[3]}," in (tmp_path / "truth.csv").read_text().splitlines()  # an empty labels field
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    result = cli_json("score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert result["rows_without_label"] == 2
    assert result["lrap"] == pytest.approx(label_ranking_average_precision_score(target, scores), abs=1e-12)
    assert result["lwlrap"] == pytest.approx(sklearn_lwlrap(scores, target), abs=1e-12)
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert (code, err) == (0, "")
    assert "samples      25 (2 without a positive label: left out of lwlrap; LRAP counts each as 1" in out
    # compare says it too (it reports no LRAP); its difference is that of the lwlrap scores computed above
    submission(fnames, scores[:, ::-1]).to_csv(tmp_path / "other.csv", index=False)
    result = cli_json("compare", tmp_path / "truth.csv", tmp_path / "pred.csv", tmp_path / "other.csv",
                      "--bootstrap", "40")
    assert result["rows_without_label"] == 2
    assert result["difference"] == pytest.approx(
        sklearn_lwlrap(scores, target) - sklearn_lwlrap(scores[:, ::-1], target), abs=1e-12)
    code, out, err = cli("compare", tmp_path / "truth.csv", tmp_path / "pred.csv", tmp_path / "other.csv",
                         "--bootstrap", "40")
    assert (code, err) == (0, "")
    samples = [line for line in out.splitlines() if line.startswith("samples ")]
    assert samples == ["samples      25 (2 without a positive label: left out of lwlrap)"], out


def test_compare_ties_index_needs_one_column_order(two_systems):
    folder = two_systems[0]
    error = cli_error("compare", folder / "truth.csv", folder / "a.csv", folder / "b.csv", "--ties", "index")
    assert "--ties index" in error and "different orders" in error


# ---------------------------------------------------------------------------------------------------------------
# --json "options"


def test_score_json_options_say_which_rule_gave_the_number(tmp_path):
    fnames, scores, target = arrays(3)
    usage = np.where(np.arange(50) % 2 == 0, "Public", "Private")
    challenge_truth(fnames, target, usage=usage).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    plain = cli_json("score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert plain["options"] == {"ties": "max", "where": None, "classes": None, "unknown": None, "bootstrap": None,
                                "level": None, "seed": None}
    assert plain["lwlrap"] == pytest.approx(sklearn_lwlrap(scores, target), abs=1e-12)
    chosen = cli_json("score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--ties", "expected", "--where",
                      "usage=Public", "--ci", "50", "--seed", "5", "--level", "0.9")
    assert chosen["options"] == {"ties": "expected", "where": {"usage": "Public"}, "classes": None, "unknown": None,
                                 "bootstrap": 50, "level": 0.9, "seed": 5}
    public = usage == "Public"
    assert chosen["lwlrap"] == pytest.approx(naive_lwlrap(scores[public], target[public], "expected"), abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# The tie block says what the data shows


def test_tie_block_on_rounded_logits_blames_rounding_not_saturation(tmp_path):
    fnames, _, target = arrays(4)
    logits = np.round(np.random.default_rng(4).standard_normal(target.shape) * 3, 1)  # 1 decimal: many ties
    wide_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, logits).to_csv(tmp_path / "logits.csv", index=False, float_format="%.1f")
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "logits.csv")
    assert (code, err) == (0, "")
    assert "cause        the scores are rounded: none has more than 1 decimal" in out
    assert "saturated" not in out and "score the logits" not in out
    assert "advice       write the scores with every digit" in out and "--ties expected gives the mean" in out
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "logits.csv", "--ties", "expected")
    assert "ties         " in out and "tie rule     --ties expected" in out
    assert "--ties expected gives the mean" not in out  # not advised when it was passed


def test_tie_causes_of_scores_that_are_all_infinite_blame_no_rounding():
    # No finite score: the fewest decimals of an empty set read as 0, and the block said "whole numbers".
    from torch_lwlrap.cli.score import tie_causes

    scores = np.array([[np.inf, np.inf, -np.inf], [-np.inf, np.inf, -np.inf]])
    target = np.array([[1, 0, 0], [0, 1, 0]])
    assert tie_causes(scores, target) == {"saturated_tied_label_count": 0, "score_decimals": None,
                                          "score_significant_digits": None, "ranks_nothing": False,
                                          "tie_orders_matter": True}  # +inf ties +inf: a positive and a negative
    assert tie_causes(np.array([[np.inf, 2.0, 2.0]]), np.array([[0, 1, 0]]))["score_decimals"] == 0


def test_tie_block_on_a_file_whose_rows_are_each_one_value_says_it_ranks_nothing(tmp_path):
    # Probabilities below 0.005 written with float_format="%.2f" are all 0.00: the block had called them "whole
    # numbers" and "saturated probabilities" (both true, neither the cause).
    fnames, _, target = arrays(13, num_rows=60)
    small = np.random.default_rng(13).random(target.shape) * 4e-3
    wide_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, small).to_csv(tmp_path / "p2f.csv", index=False, float_format="%.2f")
    result = cli_json("score", tmp_path / "truth.csv", tmp_path / "p2f.csv")
    assert result["ties"]["ranks_nothing"] is True and result["ties"]["tied_share"] == 1.0
    assert result["lwlrap"] == pytest.approx(naive_lwlrap(np.zeros_like(small), target, "max"), abs=1e-12)
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "p2f.csv")
    assert "cause        each row's scores are equal: the file ranks nothing (small scores rounded away" in out
    assert "advice       write the scores with every digit" in out and "saturated" not in out
    assert "whole numbers" not in out
    # each row one value of its own, or every score +inf (--json stays valid JSON): still nothing ranked
    flat = np.repeat(np.arange(len(fnames), dtype=np.float64)[:, None] / 100, len(CLASSES), axis=1)
    for name, scores in (("rows", flat), ("inf", np.full(flat.shape, np.inf))):
        submission(fnames, scores).to_csv(tmp_path / f"{name}.csv", index=False)
        code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / f"{name}.csv", "--json")
        assert code == 0, err
        ties = json.loads(out, parse_constant=lambda constant: pytest.fail(f"{constant} in --json"))["ties"]
        assert ties["ranks_nothing"] is True, name
    # one row that orders two labels: something is ranked, and the usual causes
    small[0, 0] = 0.5
    submission(fnames, small).to_csv(tmp_path / "p2f.csv", index=False, float_format="%.2f")
    assert cli_json("score", tmp_path / "truth.csv", tmp_path / "p2f.csv")["ties"]["ranks_nothing"] is False


def test_tie_block_on_probabilities_written_with_one_significant_digit_names_the_digits(tmp_path):
    # float_format="%.1e" of probabilities above 1e-5: at most 6 decimals, so the block had said "none has more than
    # 6 decimals" (true, but not why they collide); the 2 significant digits are the cause.
    fnames, _, target = arrays(12, num_rows=200)
    logits = np.random.default_rng(12).standard_normal(target.shape) * 2 + 2 * target
    probabilities = np.clip(1 / (1 + np.exp(-logits)), 1e-4, None)
    wide_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, probabilities).to_csv(tmp_path / "e1.csv", index=False, float_format="%.1e")
    written = pd.read_csv(tmp_path / "e1.csv").set_index("fname").loc[fnames, CLASSES].to_numpy()
    decimals = next(d for d in range(7) if np.array_equal(np.round(written, d), written))  # from the formula
    assert decimals > 2
    result = cli_json("score", tmp_path / "truth.csv", tmp_path / "e1.csv")
    assert (result["ties"]["score_decimals"], result["ties"]["score_significant_digits"]) == (decimals, 2)
    assert result["lwlrap"] == pytest.approx(naive_lwlrap(written, target, "max"), abs=1e-12)
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "e1.csv")
    assert "cause        the scores are rounded: none has more than 2 significant digits, so nearby" in out, out


def test_tie_block_on_scores_rounded_to_significant_digits_advises_every_digit(tmp_path):
    # Sigmoid outputs written with float_format="%.2e" (or "%g"): small probabilities have many decimals, so the
    # decimals test saw no rounding, and the block blamed "neither rounded nor saturated".
    fnames, _, target = arrays(11, num_rows=200)
    logits = np.random.default_rng(11).standard_normal(target.shape) * 3 + 2 * target
    probabilities = 1 / (1 + np.exp(-logits))
    wide_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, probabilities).to_csv(tmp_path / "sci.csv", index=False, float_format="%.2e")
    written = pd.read_csv(tmp_path / "sci.csv").set_index("fname").loc[fnames, CLASSES].to_numpy()
    assert (written < 1e-3).any()  # scores with more than 6 decimals are there
    result = cli_json("score", tmp_path / "truth.csv", tmp_path / "sci.csv")
    assert (result["ties"]["score_decimals"], result["ties"]["score_significant_digits"]) == (None, 3)
    assert result["lwlrap"] == pytest.approx(naive_lwlrap(written, target, "max"), abs=1e-12)
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "sci.csv")
    assert "cause        the scores are rounded: none has more than 3 significant digits, so nearby" in out, out
    assert "advice       write the scores with every digit" in out
    # Every digit written, ties at exactly 0.5 only: not called rounded.
    exact = probabilities.copy()
    exact[:, :2] = 0.5
    submission(fnames, exact).to_csv(tmp_path / "exact.csv", index=False)
    ties = cli_json("score", tmp_path / "truth.csv", tmp_path / "exact.csv")["ties"]
    assert (ties["score_decimals"], ties["score_significant_digits"]) == (None, None)


def test_tie_block_where_positives_tie_only_positives_says_the_ties_change_nothing(tmp_path):
    # A confident model's float32 sigmoids: every positive saturates at 1.0, every negative stays below. The
    # positives tie each other only, so no order of the ties moves a precision: no cause, no advice.
    fnames, _, target = arrays(6)
    rng = np.random.default_rng(6)
    logits = np.where(target == 1, 20 + 5 * rng.random(target.shape), -2 + 3 * rng.standard_normal(target.shape))
    probabilities = torch.sigmoid(torch.from_numpy(logits).float()).numpy()
    assert (probabilities[target == 1] == 1.0).all() and (probabilities[target == 0] < 1.0).all()
    wide_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, probabilities).to_csv(tmp_path / "sigmoids.csv", index=False)  # as pandas writes float32
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "sigmoids.csv")
    assert code == 0, err
    tied = int(sum(t.sum() for t in target if t.sum() > 1))  # rows with two or more positives tie them at 1.0
    assert f"ties         {tied} of {int(target.sum())} positive labels" in out
    assert "max 1.000000, expected 1.000000, 1.000000 to 1.000000 over tie orders" in out
    assert "effect       none: each tied positive ties only other positives (or unknown labels), with no " in out
    assert "cause" not in out and "advice" not in out
    ties = cli_json("score", tmp_path / "truth.csv", tmp_path / "sigmoids.csv")["ties"]
    assert ties["tie_orders_matter"] is False and ties["lwlrap_worst"] == ties["lwlrap_best"] == 1.0
    # one negative saturated beside a positive: now the order matters, and the block says why and what to do
    row = int(np.flatnonzero(target.sum(axis=1) >= 1)[0])
    probabilities[row, int(np.flatnonzero(target[row] == 0)[0])] = 1.0
    submission(fnames, probabilities).to_csv(tmp_path / "sigmoids.csv", index=False)
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "sigmoids.csv")
    assert code == 0 and "effect" not in out and "advice       score the logits" in out
    ties = cli_json("score", tmp_path / "truth.csv", tmp_path / "sigmoids.csv")["ties"]
    assert ties["tie_orders_matter"] is True and ties["lwlrap_worst"] < ties["lwlrap_best"]


def test_tied_positives_below_a_negative_keep_the_tie_block_s_advice(tmp_path):
    # Two positives tied with each other only, below a negative: every order gives the same lwlrap (0.722222), but
    # `max` gives both the group's last place (0.777778), so the rule matters and --ties expected is advised.
    (tmp_path / "truth.csv").write_text('fname,labels\nx.wav,"b,c"\ny.wav,a\n')
    (tmp_path / "pred.csv").write_text("fname,a,b,c,d\nx.wav,0.9,0.5,0.5,0.1\ny.wav,0.9,0.5,0.2,0.1\n")
    target = np.array([[0, 1, 1, 0], [1, 0, 0, 0]])
    scores = np.array([[0.9, 0.5, 0.5, 0.1], [0.9, 0.5, 0.2, 0.1]])
    ties = cli_json("score", tmp_path / "truth.csv", tmp_path / "pred.csv")["ties"]
    assert ties["tie_orders_matter"] is True
    assert ties["lwlrap_max"] == pytest.approx(naive_lwlrap(scores, target, "max"), abs=1e-12)  # 7 / 9
    assert ties["lwlrap_worst"] == ties["lwlrap_best"] == pytest.approx(naive_lwlrap(scores, target, "expected"))
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert code == 0 and "effect" not in out and "--ties expected gives the mean over tie orders" in out


def test_tie_block_on_saturated_probabilities_advises_the_logits(tmp_path):
    fnames, _, target = arrays(5)
    logits = np.random.default_rng(5).standard_normal(target.shape) * 12 + 12 * target
    probabilities = torch.sigmoid(torch.from_numpy(logits).float()).double().numpy()  # float32 saturates at 1.0
    wide_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, probabilities).to_csv(tmp_path / "probabilities.csv", index=False)
    result = cli_json("score", tmp_path / "truth.csv", tmp_path / "probabilities.csv", "--ties", "expected")
    ties = result["ties"]
    tied_at_one = sum(
        1 for p, t in zip(probabilities, target) for j in range(len(CLASSES))
        if t[j] and p[j] == 1.0 and (p == 1.0).sum() > 1
    )
    assert ties["saturated_tied_label_count"] == tied_at_one > 0 and ties["score_decimals"] is None
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "probabilities.csv", "--ties", "expected")
    assert f"cause        {tied_at_one} of the {ties['tied_label_count']} tied positive labels" in out
    assert "advice       score the logits\n" in out and "rounded" not in out
    assert result["lwlrap"] == pytest.approx(naive_lwlrap(probabilities, target, "expected"), abs=1e-12)


# ---------------------------------------------------------------------------------------------------------------
# Standard input, gzip, separators, swapped files


def test_submission_and_truth_from_standard_input(tmp_path):
    fnames, scores, target = arrays(6)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    piped = submission(fnames, scores).to_csv(index=False).encode("utf-8")
    want = sklearn_lwlrap(scores, target)
    for process in (False, True):  # in this process, and a subprocess fed through a real pipe
        result = cli_json("score", tmp_path / "truth.csv", "-", stdin=piped, process=process)
        assert result["lwlrap"] == pytest.approx(want, abs=1e-12)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    truth_piped = challenge_truth(fnames, target).to_csv(index=False).encode("utf-8")
    assert cli_json("score", "-", tmp_path / "pred.csv", stdin=truth_piped)["lwlrap"] == pytest.approx(want, abs=1e-12)
    code, out, err = cli("score", tmp_path / "truth.csv", "-", stdin=piped)
    assert code == 0 and "predictions  <stdin>" in out
    error = cli_error("score", "-", "-", stdin=piped, process=True)
    assert "both '-'" in error and "at most one" in error
    error = cli_error("score", tmp_path / "truth.csv", "-", stdin=b"fname,Bark\n")
    assert "prediction file '<stdin>' has a header but no rows" in error


def test_gzip_files_as_pandas_writes_them(tmp_path):
    fnames, scores, target = arrays(7)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv.gz", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv.gz", index=False)
    assert gzip.open(tmp_path / "pred.csv.gz").read(6) == b"fname,"  # pandas did compress it
    want = sklearn_lwlrap(scores, target)
    result = cli_json("score", tmp_path / "truth.csv.gz", tmp_path / "pred.csv.gz")
    assert result["lwlrap"] == pytest.approx(want, abs=1e-12)
    (tmp_path / "pred_gzip_without_suffix.csv").write_bytes((tmp_path / "pred.csv.gz").read_bytes())
    result = cli_json("score", tmp_path / "truth.csv.gz", tmp_path / "pred_gzip_without_suffix.csv")
    assert result["lwlrap"] == pytest.approx(want, abs=1e-12)
    piped = (tmp_path / "pred.csv.gz").read_bytes()
    assert cli_json("score", tmp_path / "truth.csv.gz", "-", stdin=piped)["lwlrap"] == pytest.approx(want, abs=1e-12)
    (tmp_path / "cut.csv.gz").write_bytes(piped[: len(piped) // 2])
    error = cli_error("score", tmp_path / "truth.csv.gz", tmp_path / "cut.csv.gz")
    assert "cut.csv.gz" in error and "not a complete gzip file" in error


def test_semicolon_file_names_its_separator(tmp_path):
    fnames, scores, target = arrays(8)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False, sep=";", decimal=",")
    error = cli_error("score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert "prediction file" in error and "looks separated by ';'" in error and "comma-separated" in error
    wide_truth(fnames, target).to_csv(tmp_path / "wide.csv", index=False, sep="\t")
    error = cli_error("score", tmp_path / "wide.csv", tmp_path / "pred.csv")
    assert "truth file" in error and "looks separated by tabs" in error


def test_swapped_files_get_a_hint(tmp_path):
    fnames, scores, target = arrays(9)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    wide_truth(fnames, target).to_csv(tmp_path / "wide.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    for truth in ("truth.csv", "wide.csv"):
        error = cli_error("score", tmp_path / "pred.csv", tmp_path / truth)
        assert "look swapped" in error and "the truth file comes first" in error
    error = cli_error("compare", tmp_path / "pred.csv", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert "look swapped" in error and "compare TRUTH.csv A.csv B.csv" in error
    # A hard 0/1 submission (thresholded predictions) reads as a wide truth table: the labels file in its place is
    # the one that fails, and the files are still called swapped.
    submission(fnames, (scores > 0.5).astype(np.int64)).to_csv(tmp_path / "hard.csv", index=False)
    error = cli_error("score", tmp_path / "hard.csv", tmp_path / "truth.csv")
    assert error.startswith("torch-lwlrap: error: prediction file") and "is not a number" in error, error
    assert f"look swapped: '{tmp_path / 'hard.csv'}' reads as a submission and '{tmp_path / 'truth.csv'}' as a" in error
    error = cli_error("compare", tmp_path / "hard.csv", tmp_path / "pred.csv", tmp_path / "truth.csv")
    assert "look swapped" in error and "compare TRUTH.csv A.csv B.csv" in error, error
    # A bad truth file next to a real submission is not called swapped; nor is a bad submission next to a truth.
    (tmp_path / "bad_truth.csv").write_text("fname,Bark\na.wav,0.5\n")
    assert "look swapped" not in cli_error("score", tmp_path / "bad_truth.csv", tmp_path / "pred.csv")
    (tmp_path / "bad_pred.csv").write_text("fname," + ",".join(CLASSES) + "\na.wav" + ",x" * len(CLASSES) + "\n")
    assert "look swapped" not in cli_error("score", tmp_path / "wide.csv", tmp_path / "bad_pred.csv")


# ---------------------------------------------------------------------------------------------------------------
# --unknown: unknown labels of a wide truth table


def naive_lwlrap_dropping(scores, target, unknown):
    """lwlrap from its definition with the unknown entries dropped from their rows: for each positive label, the
    share of positives among the kept labels scored at least as high; the mean over all positive labels."""
    precisions = []
    for row_scores, row_target, row_unknown in zip(scores, target, unknown):
        kept = ~row_unknown
        for j in np.flatnonzero((row_target == 1) & kept):
            above = kept & (row_scores >= row_scores[j])
            precisions.append((above & (row_target == 1)).sum() / above.sum())
    return float(np.mean(precisions))


def test_unknown_labels_are_neither_positive_nor_ranked(tmp_path):
    fnames, scores, target = arrays(10, num_rows=80, decimals=2)
    rng = np.random.default_rng(10)
    unknown = rng.random(target.shape) < 0.15
    marked = np.where(unknown, -1, target)
    marked[~(marked == 1).any(axis=1), 0] = 1  # every row keeps a positive
    unknown = marked == -1
    wide_truth(fnames, marked).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    positive = (marked == 1).astype(np.int64)
    want = naive_lwlrap_dropping(scores, positive, unknown)
    # scikit-learn, with each unknown label a negative scored below every score: it outranks no positive.
    lowered = np.where(unknown, scores.min() - 1.0, scores)
    assert sklearn_lwlrap(lowered, positive) == pytest.approx(want, abs=1e-12)
    assert want != pytest.approx(sklearn_lwlrap(scores, positive), abs=1e-6)  # the marks do change the score
    result = cli_json("score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--unknown", "-1")
    assert result["lwlrap"] == pytest.approx(want, abs=1e-12)
    assert (result["num_labels"], result["num_unknown"]) == (int(positive.sum()), int(unknown.sum()))
    assert result["options"]["unknown"] == "-1"
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--unknown", "-1")
    assert f"labels       {int(positive.sum())} positive, {int(unknown.sum())} unknown" in out
    compared = cli_json("compare", tmp_path / "truth.csv", tmp_path / "pred.csv", tmp_path / "pred.csv",
                        "--unknown", "-1", "--bootstrap", "50")
    assert compared["lwlrap_a"] == pytest.approx(want, abs=1e-12) and compared["num_unknown"] == int(unknown.sum())
    # A value written as pandas writes floats (-1.0) is the same mark.
    wide_truth(fnames, marked.astype(float)).to_csv(tmp_path / "truth_float.csv", index=False)
    again = cli_json("score", tmp_path / "truth_float.csv", tmp_path / "pred.csv", "--unknown", "-1")
    assert again["lwlrap"] == pytest.approx(want, abs=1e-12)


def test_unknown_option_errors(tmp_path):
    fnames, scores, target = arrays(11)
    marked = target.copy()
    marked[3, 2] = -1
    wide_truth(fnames, marked).to_csv(tmp_path / "truth.csv", index=False)
    challenge_truth(fnames, target).to_csv(tmp_path / "challenge.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    files = [tmp_path / "truth.csv", tmp_path / "pred.csv"]
    for command in (["score", *files], ["compare", *files, tmp_path / "pred.csv"]):
        error = cli_error(*command)
        assert "column 'Hi-hat': the value '-1' is not 0 or 1" in error and "--unknown -1" in error
        for value in ("0", "1", "1.0"):
            assert "--unknown takes the other value" in cli_error(*command, "--unknown", value)
        assert "or the --unknown value '-2'" in cli_error(*command, "--unknown", "-2")
    error = cli_error("score", tmp_path / "challenge.csv", tmp_path / "pred.csv", "--unknown", "-1")
    assert "challenge layout" in error and "--unknown" in error


# ---------------------------------------------------------------------------------------------------------------
# score --plot --ci


def test_score_plot_with_ci_draws_each_class_interval(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib")
    from matplotlib.collections import LineCollection
    from matplotlib.figure import Figure


    fnames, scores, target = arrays(12)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "pred.csv", index=False)
    files = [tmp_path / "truth.csv", tmp_path / "pred.csv"]
    # As a user runs it: the chart with intervals is another picture than the one without.
    assert cli("score", *files, "--plot", tmp_path / "plain.png")[0] == 0
    assert cli("score", *files, "--ci", "100", "--plot", tmp_path / "ci.png")[0] == 0
    assert (tmp_path / "ci.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "ci.png").read_bytes() != (tmp_path / "plain.png").read_bytes()
    # In the figure: one horizontal segment per class, from its interval's low to high bound, on its bar.
    ci = cli_json("score", *files, "--ci", "100")["ci"]["per_class"]
    drawn = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, path, **kw: drawn.append(fig.axes[0]))
    assert main(["score", *map(str, files), "--ci", "100", "--plot", str(tmp_path / "x.png")]) == 0
    capsys.readouterr()
    ax = drawn[0]
    names = [label.get_text() for label in ax.get_yticklabels()]
    segments = [seg for c in ax.collections if isinstance(c, LineCollection) for seg in c.get_segments()]
    bars = {tuple(np.round(seg[:, 0], 9)): seg[0, 1] for seg in segments if seg[0, 1] == seg[1, 1]}
    for name in CLASSES:
        low, high = ci[name]
        assert bars[(round(low, 9), round(high, 9))] == names.index(name), name
    # each value label right of its class's interval, not over it; no legend over the last bar
    for text in ax.texts:
        x, y = text.get_position()
        assert x > min(ci[names[round(y)]][1], 1.0), (names[round(y)], text.get_text())
    assert ax.get_legend() is None and "bootstrap interval (100 replicates)" in ax.get_xlabel()


def test_no_interval_from_replicates_that_drew_no_labelled_row_says_so(tmp_path):
    # With a replicate or two, every replicate can leave out every row with a positive label: the interval is then
    # missing, and both commands had blamed "one row with a positive label" on a file with three.
    target = np.array([[1, 1, 0], [0, 1, 0], [0, 0, 1], [0, 0, 0]])
    a = np.array([[0.9, 0.2, 0.1], [0.3, 0.6, 0.2], [0.5, 0.1, 0.4], [0.1, 0.1, 0.1]])
    b = np.array([[0.5, 0.2, 0.6], [0.7, 0.6, 0.2], [0.5, 0.1, 0.7], [0.3, 0.1, 0.1]])
    fnames, classes = ["a.wav", "b.wav", "c.wav", "d.wav"], CLASSES[:3]
    pd.DataFrame({"fname": fnames, "labels": [",".join(classes[j] for j in np.flatnonzero(r)) for r in target]}).to_csv(
        tmp_path / "truth.csv", index=False)
    submission(fnames, a, classes).to_csv(tmp_path / "a.csv", index=False)
    submission(fnames, b, classes).to_csv(tmp_path / "b.csv", index=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one replicate: the degenerate-interval warning
        seed = next(s for s in range(1000) if math.isnan(compare_lwlrap(
            torch.tensor(a), torch.tensor(b), torch.tensor(target), num_bootstrap=1, seed=s).low))
        assert math.isnan(multilabel_lwlrap_ci(torch.tensor(a), torch.tensor(target), num_bootstrap=1, seed=seed)[1])
    reason = "none of the 1 bootstrap replicate(s) drew a row with a positive label (use more replicates"
    code, out, _ = cli("score", tmp_path / "truth.csv", tmp_path / "a.csv", "--ci", "1", "--seed", str(seed))
    assert code == 0 and f"no interval: {reason}" in out and "one row with a positive label" not in out, out
    code, out, _ = cli("compare", *(tmp_path / f for f in ("truth.csv", "a.csv", "b.csv")), "--ci", "1", "--seed",
                       str(seed), "--per-class")
    assert code == 0 and f"no interval or p-value: {reason}" in out, out
    # the per-class note: a class with two positives has none for the same reason, not for a single positive
    assert "nor has a class whose positive labels none of the 1 replicates drew" in out, out


def test_a_level_is_printed_with_every_digit_it_was_given(tmp_path):
    # --level 0.9999999 was printed "100% interval" (6 significant digits), the warning "A 1 percentile interval".
    fnames, scores, target = arrays(3, num_rows=30)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "a.csv", index=False)
    options = ("--ci", "50", "--level", "0.9999999")
    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "a.csv", *options)
    assert code == 0 and "99.99999% interval [" in out and "100% interval" not in out, out
    assert "A 0.9999999 percentile interval from 50 bootstrap replicate(s)" in err, err
    code, out, _ = cli("compare", tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "a.csv", *options)
    assert code == 0 and "99.99999% interval [" in out, out


def test_more_replicates_than_the_quantile_takes_are_one_line(tmp_path):
    # 2**24 + 1 replicates of a few classes fit in memory, passed the checks, and ended in torch's traceback (status 1).
    fnames, scores, target = arrays(6, num_rows=4)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "sub.csv", index=False)
    for command, option in (("score", "--ci"), ("compare", "--bootstrap")):
        files = [tmp_path / "truth.csv", tmp_path / "sub.csv"] + ([tmp_path / "sub.csv"] if command == "compare" else [])
        err = cli_error(command, *files, option, str(2**24 + 1))
        assert f"{option} takes at most 2**24 (16777216) bootstrap replicates, not 16777217" in err, err


def test_too_many_replicates_are_refused_up_front_for_a_compressed_submission(tmp_path):
    # The memory check read the header of plain files only: a .gz submission went on to the allocation.
    fnames, scores, target = arrays(6, num_rows=20)
    challenge_truth(fnames, target).to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores).to_csv(tmp_path / "sub.csv.gz", index=False)
    err = cli_error("score", tmp_path / "truth.csv", tmp_path / "sub.csv.gz", "--ci", str(10**12))
    assert f"--ci {10**12} needs about" in err and f"x {len(CLASSES)} classes" in err and "use fewer replicates" in err
    err = cli_error("compare", tmp_path / "truth.csv", tmp_path / "sub.csv.gz", tmp_path / "sub.csv.gz",
                    "--bootstrap", str(10**12))
    assert "needs about" in err and "2 submissions" in err


def test_per_class_tables_line_up_class_names_of_wide_characters(tmp_path):
    """Class names in Japanese (two terminal columns a character) and with a combining accent (none): the tables'
    numbers start at one terminal column on every row, as a terminal shows them, and are the naive per-class
    lwlrap of the files as pandas writes them."""
    import unicodedata

    from tests.reference import naive_lwlrap_per_class

    def columns(text):
        return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
                   for ch in text)

    classes = ["犬の鳴き声", "Cafe\u0301", "Bark", "水", "Purr", "Yell"]
    fnames, scores, target = arrays(21, num_rows=30)
    frame = pd.DataFrame(target, columns=classes)
    frame.insert(0, "fname", fnames)
    frame.to_csv(tmp_path / "truth.csv", index=False)
    submission(fnames, scores, classes).to_csv(tmp_path / "a.csv", index=False)
    submission(fnames, scores[:, ::-1], classes).to_csv(tmp_path / "b.csv", index=False)
    per_class, _, _ = naive_lwlrap_per_class(scores, target)

    code, out, err = cli("score", tmp_path / "truth.csv", tmp_path / "a.csv", "--per-class")
    assert (code, err) == (0, ""), err
    lines = out.split("per-class lwlrap, worst first:\n", 1)[1].splitlines()
    header, rows = lines[0], lines[1:1 + len(classes)]
    start = columns(header[: header.index("lwlrap")]) - 2  # the value column's 8 places end under "lwlrap"
    for line in rows:
        name = next(c for c in classes if line.startswith(c + " "))
        value = line[len(name):].split()[0]
        assert columns(line[: line.index(value)]) + len(value) == start + 8, (line, header)
        assert float(value) == pytest.approx(per_class[classes.index(name)], abs=5e-7)

    code, out, err = cli("compare", tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "b.csv", "--per-class",
                         "--bootstrap", "40")
    assert code == 0, err
    tables = [block.splitlines() for block in out.split("most:\n")[1:]]
    assert tables and any(len(table) > 1 for table in tables)
    for table in tables:
        if table[0] == "(none)":
            continue
        header = table[0]
        end = columns(header[: header.index(" A ") + 2])  # the A column ends under "A"
        for line in table[1:]:
            if not line.strip():
                break
            name = next(c for c in classes if line.startswith(c + " "))
            value = line[len(name):].split()[0]
            assert columns(line[: line.index(value, len(name))]) + len(value) == end, (line, header)
            assert float(value) == pytest.approx(per_class[classes.index(name)], abs=5e-5)
