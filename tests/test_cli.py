"""The command line (``torch-lwlrap score``) against scikit-learn and the naive references.

Files are written with rows and columns in different orders in the truth and the prediction; the expected values
are computed on the matrices before they were written, in the prediction file's column order.
"""

from __future__ import annotations

import csv
import json
import warnings
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import label_ranking_average_precision_score

import torch_lwlrap
from tests.cli_output import is_error_line, without_compile_notice
from tests.reference import naive_lwlrap_per_class
from torch_lwlrap.cli import main

REPO = Path(__file__).resolve().parents[1]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------------------------
# Helpers


def make_case(seed, num_rows=40, num_classes=7):
    """Random scores with ties (one decimal) and labels, including a row without positive, a row with all labels
    positive and a class (the last) without positive."""
    rng = np.random.default_rng(seed)
    preds = np.round(rng.random((num_rows, num_classes)), 1)
    target = (rng.random((num_rows, num_classes)) < 0.3).astype(np.int64)
    target[:, -1] = 0
    target[0] = 0
    target[1, :-1] = 1
    target[2] = 0
    target[2, 0] = 1
    classes = [f"class {j}" for j in range(num_classes)]
    classes[1] = "Fill_(with_liquid)"
    fnames = [f"{rng.integers(16**6):06x}_{i}.wav" for i in range(num_rows)]
    return fnames, classes, preds, target


def write_csv(path, header, rows):
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def write_challenge_truth(path, fnames, classes, target, row_order):
    rows = [[fnames[i], ",".join(classes[j] for j in np.flatnonzero(target[i]))] for i in row_order]
    return write_csv(path, ["fname", "labels"], rows)


def write_wide_truth(path, fnames, classes, target, row_order, col_order):
    rows = [[fnames[i]] + [str(int(target[i, j])) for j in col_order] for i in row_order]
    return write_csv(path, ["fname"] + [classes[j] for j in col_order], rows)


def write_predictions(path, fnames, classes, preds, row_order, col_order):
    rows = [[fnames[i]] + [repr(float(preds[i, j])) for j in col_order] for i in row_order]
    return write_csv(path, ["fname"] + [classes[j] for j in col_order], rows)


def shuffled_files(tmp_path, seed, layout="challenge", **case):
    """Truth and prediction files with rows and columns shuffled differently; returns paths and the expected
    matrices in the prediction file's column order."""
    fnames, classes, preds, target = make_case(seed, **case)
    rng = np.random.default_rng(seed + 1000)
    num_rows, num_classes = preds.shape
    pred_cols = rng.permutation(num_classes)
    pred_path = write_predictions(
        tmp_path / f"pred_{seed}.csv", fnames, classes, preds, rng.permutation(num_rows), pred_cols
    )
    truth_rows = rng.permutation(num_rows)
    if layout == "challenge":
        truth_path = write_challenge_truth(tmp_path / f"truth_{seed}.csv", fnames, classes, target, truth_rows)
    else:  # wide; the class without positive (the last) is left out: a prediction column only
        truth_cols = rng.permutation(num_classes - 1)
        truth_path = write_wide_truth(
            tmp_path / f"truth_wide_{seed}.csv", fnames, classes, target, truth_rows, truth_cols
        )
    return truth_path, pred_path, [classes[j] for j in pred_cols], preds[:, pred_cols], target[:, pred_cols]


def reference(preds, target, classes, ties="max"):
    """Expected JSON-like values: sklearn for the overall scores (ties="max"), naive loops per class."""
    per_class, weights, counts = naive_lwlrap_per_class(preds, target, ties=ties)
    expected = {
        "num_samples": preds.shape[0],
        "num_labels": int(target.sum()),
        "per_class": {
            name: {"lwlrap": None if math.isnan(v) else v, "weight": w, "count": c}
            for name, v, w, c in zip(classes, per_class, weights, counts)
        },
    }
    if ties == "max":
        expected["lrap"] = label_ranking_average_precision_score(target, preds)
        expected["lwlrap"] = label_ranking_average_precision_score(target, preds, sample_weight=target.sum(axis=1))
    else:
        expected["lwlrap"] = sum(w * v for v, w in zip(per_class, weights) if not math.isnan(v))
    return expected


def run_main(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def parse_text(out):
    values = dict(re.findall(r"^(lwlrap|LRAP|samples|classes|labels) +(\S+)", out, flags=re.M))
    table = {}
    if "per-class lwlrap, worst first:" in out:
        lines = out.split("per-class lwlrap, worst first:\n", 1)[1].splitlines()[1:]
        for line in lines:
            if not line.strip():
                break
            name, value, weight, count = re.match(r"^(.*\S)\s+(\S+)\s+(\S+)\s+(\d+)$", line).groups()
            table[name] = (value, float(weight), int(count))
    return values, table


def assert_matches_json(result, expected):
    assert result["num_samples"] == expected["num_samples"]
    assert result["num_labels"] == expected["num_labels"]
    assert result["lwlrap"] == pytest.approx(expected["lwlrap"], abs=1e-12)
    if "lrap" in expected:
        assert result["lrap"] == pytest.approx(expected["lrap"], abs=1e-12)
    assert list(result["per_class"]) == list(expected["per_class"])
    for name, want in expected["per_class"].items():
        got = result["per_class"][name]
        assert got["count"] == want["count"], name
        assert got["weight"] == pytest.approx(want["weight"], abs=1e-12), name
        if want["lwlrap"] is None:
            assert got["lwlrap"] is None, name
        else:
            assert got["lwlrap"] == pytest.approx(want["lwlrap"], abs=1e-12), name


# ---------------------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_text_output_matches_sklearn_and_naive(tmp_path, capsys, seed):
    truth, pred, classes, preds, target = shuffled_files(tmp_path, seed)
    expected = reference(preds, target, classes)
    code, out, err = run_main(capsys, "score", truth, pred, "--per-class")
    assert (code, err) == (0, "")
    values, table = parse_text(out)
    assert float(values["lwlrap"]) == pytest.approx(expected["lwlrap"], abs=5e-7)
    assert float(values["LRAP"]) == pytest.approx(expected["lrap"], abs=5e-7)
    assert int(values["samples"]) == preds.shape[0]
    assert int(values["classes"]) == preds.shape[1]
    assert int(values["labels"]) == int(target.sum())

    assert set(table) == set(classes)
    for name, want in expected["per_class"].items():
        value, weight, count = table[name]
        assert count == want["count"]
        assert weight == pytest.approx(want["weight"], abs=5e-7)
        if want["lwlrap"] is None:
            assert value == "-"
        else:
            assert float(value) == pytest.approx(want["lwlrap"], abs=5e-7)
    # Worst first, the class without positive last.
    names = list(table)
    shown = [table[name][0] for name in names]
    assert shown[-1] == "-" and "-" not in shown[:-1]
    numbers = [float(v) for v in shown[:-1]]
    assert numbers == sorted(numbers)


@pytest.mark.parametrize("seed", [3, 4])
def test_json_output_matches_reference(tmp_path, capsys, seed):
    truth, pred, classes, preds, target = shuffled_files(tmp_path, seed)
    code, out, err = run_main(capsys, "score", truth, pred, "--json", "--per-class")
    assert (code, err) == (0, "")
    result = json.loads(out)  # exactly one JSON document on stdout
    assert out.strip().count("\n") == 0
    assert_matches_json(result, reference(preds, target, classes))
    assert result["num_classes"] == len(classes)
    assert result["per_class"]["class 6"]["lwlrap"] is None  # the class without positive: null
    assert result["per_class"]["class 6"]["count"] == 0


def test_both_truth_layouts_agree(tmp_path, capsys):
    truth_challenge, pred, classes, preds, target = shuffled_files(tmp_path, 5)
    truth_wide, *_ = shuffled_files(tmp_path, 5, layout="wide")
    results = []
    for truth in (truth_challenge, truth_wide):
        code, out, err = run_main(capsys, "score", truth, pred, "--json")
        assert (code, err) == (0, "")
        results.append(json.loads(out))
    assert results[0] == results[1]
    assert_matches_json(results[0], reference(preds, target, classes))


@pytest.mark.parametrize("layout", ["challenge", "wide"])
def test_ties_index_matches_naive(tmp_path, capsys, layout):
    truth, pred, classes, preds, target = shuffled_files(tmp_path, 6, layout=layout)
    expected = reference(preds, target, classes, ties="index")
    code, out, err = run_main(capsys, "score", truth, pred, "--json", "--ties", "index")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert_matches_json(result, expected)
    # Ties are frequent (one decimal), so the two rules really differ here.
    code, out, _ = run_main(capsys, "score", truth, pred, "--json")
    assert json.loads(out)["lwlrap"] != pytest.approx(result["lwlrap"], abs=1e-9)
    # The text report says which rule its values follow, above them (its tie block shows 'max' beside them).
    code, out, _ = run_main(capsys, "score", truth, pred, "--ties", "index")
    lines = out.splitlines()
    assert lines.index("tie rule     --ties index") < lines.index(f"lwlrap       {result['lwlrap']:.6f}")
    code, out, _ = run_main(capsys, "score", truth, pred)
    assert "tie rule" not in out  # the default, max, goes unsaid


def test_extra_whitespace_blank_lines_and_bom(tmp_path, capsys):
    truth = tmp_path / "truth.csv"
    truth.write_bytes(b'\xef\xbb\xbffname,labels\r\nx.wav," a , c "\r\n\r\ny.wav,"b,c"\r\nz.wav,\r\n')
    pred = tmp_path / "pred.csv"
    pred.write_text("fname, a ,b,c\ny.wav,0.1,0.7,0.2\n z.wav ,1,2,3\nx.wav,0.1,0.7,0.2\n\n")
    code, out, err = run_main(capsys, "score", truth, pred, "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    preds = np.array([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2], [1, 2, 3]])
    target = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 0]])
    assert_matches_json(result, reference(preds, target, ["a", "b", "c"]))
    assert result["lwlrap"] == pytest.approx(19 / 24, rel=1e-12)  # worked example: (2/3 + 1 + 3/4 * 2) / 4


# ---------------------------------------------------------------------------------------------------------------
# Plot, version, help, processes


def test_plot_writes_png(tmp_path, capsys):
    truth, pred, *_ = shuffled_files(tmp_path, 7)
    out_png = tmp_path / "per_class.png"
    code, out, err = run_main(capsys, "score", truth, pred, "--plot", out_png, "--json")
    assert (code, err) == (0, "")
    json.loads(out)  # --json keeps stdout to the one object
    data = out_png.read_bytes()
    assert len(data) > 1000
    assert data[:8] == PNG_SIGNATURE


@pytest.mark.parametrize("command", ["score", "compare"])
def test_plot_without_a_format_names_the_file_written(tmp_path, capsys, command):
    """``--plot chart``: matplotlib adds ``.png``; the report names that file, not the one asked for."""
    truth, pred, *_ = shuffled_files(tmp_path, 7)
    preds = [pred] if command == "score" else [pred, pred]
    code, out, err = run_main(capsys, command, truth, *preds, "--plot", f"{tmp_path / 'chart'}.")
    assert (code, err) == (0, "")
    assert out.rstrip().endswith(f"per-class chart written to {tmp_path / 'chart.png'}"), out
    assert (tmp_path / "chart.png").read_bytes()[:8] == PNG_SIGNATURE
    assert not (tmp_path / "chart").exists()


@pytest.mark.parametrize("command, extra", [("compare", ["--bootstrap", "50"]), ("score", ["--ci", "50"]),
                                            ("score", [])])
@pytest.mark.parametrize("num_classes", [4, 100, 527])
def test_plot_titles_stay_above_the_bars_and_their_labels(tmp_path, capsys, monkeypatch, command, extra,
                                                        num_classes):
    """compare's three-line title, and score's title over several panels, had fallen over the top bar's label: as
    each chart is saved, every axes (its labels included) lies below the figure's title."""
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    truth, pred, *_ = shuffled_files(tmp_path, 11, num_rows=60, num_classes=num_classes)
    checked = []
    save = Figure.savefig

    def savefig(fig, *args, **kwargs):
        renderer = fig.canvas.get_renderer()
        to_figure = fig.transFigure.inverted()
        title = fig._suptitle if getattr(fig, "_suptitle", None) is not None else fig.axes[0].title
        title_bottom = to_figure.transform(title.get_window_extent(renderer))[0, 1]
        for ax in fig.axes:
            top = to_figure.transform(ax.get_tightbbox(renderer))[1, 1] if ax.title is not title else None
            if top is not None:
                assert top <= title_bottom + 1e-9, (top, title_bottom, title.get_text())
        checked.append(len(fig.axes))
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    preds = [pred] if command == "score" else [pred, pred]
    code, out, err = run_main(capsys, command, truth, *preds, "--plot", tmp_path / "chart.png", *extra)
    assert (code, err) == (0, ""), err
    assert checked and (tmp_path / "chart.png").read_bytes()[:8] == PNG_SIGNATURE


def test_version_and_help(capsys):
    code, out, _ = run_main(capsys, "--version")
    assert code == 0
    assert out.strip() == f"torch-lwlrap {torch_lwlrap.__version__}"
    code, out, _ = run_main(capsys, "score", "--help")
    assert code == 0
    for word in ("TRUTH.csv", "PRED.csv", "--per-class", "--json", "--plot", "--ties"):
        assert word in out


@pytest.mark.parametrize(
    "argv, command, words",
    [
        ([], "torch-lwlrap", ["required: COMMAND"]),
        (["score"], "torch-lwlrap score", ["required: TRUTH.csv, PRED.csv"]),
        (["score", "only_truth.csv"], "torch-lwlrap score", ["required: PRED.csv"]),
        (["score", "t.csv", "p.csv", "--ties", "min"], "torch-lwlrap score", ["--ties", "'min'", "'expected'"]),
        (["rank", "a", "b"], "torch-lwlrap", ["invalid choice: 'rank'", "'compare'"]),
        # an option of another subcommand is named by the subcommand it was given to
        (["compare", "t.csv", "a.csv", "b.csv", "--top", "3"], "torch-lwlrap compare",
         ["unrecognized arguments: --top 3"]),
        # `--ci` before the files takes the truth file as its count: the message says where it goes
        (["score", "--ci", "t.csv", "p.csv"], "torch-lwlrap score", ["--ci", "'t.csv'", "after the files"]),
        (["compare", "t.csv", "a.csv", "b.csv", "--agreement", "0"], "torch-lwlrap compare", ["--agreement", "'0'"]),
        # an option given before the subcommand is the program's
        (["--bogus", "score", "t.csv", "p.csv"], "torch-lwlrap", ["unrecognized arguments: --bogus"]),
    ],
)
def test_usage_errors_exit_2(capsys, argv, command, words):
    """A bad argument is one line on stderr, as a bad file is: the command, what was wrong, where to read more."""
    code, out, err = run_main(capsys, *argv)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith(f"{command}: error: "), err
    assert err.rstrip().endswith(f"(see {command} --help)"), err
    for word in words:
        assert word in err, (word, err)


def test_a_count_that_is_no_number_is_not_taken_for_a_file(capsys):
    code, _, err = run_main(capsys, "score", "t.csv", "p.csv", "--ci", "x")
    assert code == 2 and "invalid int value: 'x'" in err and "after the files" not in err


def test_python_dash_m_subprocess(tmp_path, capsys):
    truth, pred, classes, preds, target = shuffled_files(tmp_path, 8)
    done = subprocess.run(
        [sys.executable, "-m", "torch_lwlrap", "score", truth, pred, "--per-class"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert without_compile_notice(done.stderr) == ""
    code, out, _ = run_main(capsys, "score", truth, pred, "--per-class")
    assert code == 0 and done.stdout == out
    values, _ = parse_text(done.stdout)
    expected = reference(preds, target, classes)
    assert float(values["lwlrap"]) == pytest.approx(expected["lwlrap"], abs=5e-7)
    assert float(values["LRAP"]) == pytest.approx(expected["lrap"], abs=5e-7)


@pytest.mark.skipif(shutil.which("torch-lwlrap") is None, reason="the torch-lwlrap console script is not on PATH")
def test_console_script_bad_file(tmp_path):
    pred = write_csv(tmp_path / "pred.csv", ["fname", "a"], [["x.wav", "0.5"]])
    missing = str(tmp_path / "no_such_truth.csv")
    done = subprocess.run(
        ["torch-lwlrap", "score", missing, pred], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "no_such_truth.csv" in done.stderr and "does not exist" in done.stderr


# ---------------------------------------------------------------------------------------------------------------
# Bad files

GOOD_TRUTH = 'fname,labels\na.wav,"Bark,Dog"\nb.wav,Cat\n'
GOOD_PRED = "fname,Bark,Cat,Dog\na.wav,0.9,0.1,0.5\nb.wav,0.2,0.8,0.3\n"

BAD_FILES = {
    # id: (truth text or None for a missing file, prediction text or None, words the error must contain)
    "truth missing": (None, GOOD_PRED, ["truth.csv", "does not exist"]),
    "pred missing": (GOOD_TRUTH, None, ["pred.csv", "does not exist"]),
    "truth empty": ("", GOOD_PRED, ["truth.csv", "empty"]),
    "pred empty": (GOOD_TRUTH, "\n", ["pred.csv", "empty"]),
    "truth without header": ('a.wav,"Bark,Dog"\nb.wav,Cat\n', GOOD_PRED, ["truth.csv", "'fname'", "header"]),
    "pred without fname column": (GOOD_TRUTH, "file,Bark,Cat,Dog\na.wav,1,2,3\n", ["pred.csv", "'fname'"]),
    "truth header only": ("fname,labels\n", GOOD_PRED, ["truth.csv", "no rows"]),
    "truth duplicated fname": (GOOD_TRUTH + "a.wav,Cat\n", GOOD_PRED, ["truth.csv", "'a.wav'", "duplicated", "line 4"]),
    "pred duplicated fname": (GOOD_TRUTH, GOOD_PRED + "b.wav,1,2,3\n", ["pred.csv", "'b.wav'", "duplicated"]),
    "fname missing from pred": (GOOD_TRUTH + "c.wav,Dog\nd.wav,Dog\n", GOOD_PRED, ["'c.wav'", "pred.csv", "missing"]),
    "fname missing from truth": (GOOD_TRUTH, GOOD_PRED + "e.wav,1,2,3\n", ["'e.wav'", "truth.csv", "missing"]),
    "label not a column": (
        'fname,labels\na.wav,"Bark,Wolf"\nb.wav,Cat\n',
        GOOD_PRED,
        ["'Wolf'", "'a.wav'", "pred.csv"],
    ),
    "wide class not a column": ("fname,Bark,Wolf\na.wav,1,0\nb.wav,0,1\n", GOOD_PRED, ["'Wolf'", "truth.csv"]),
    "score not a number": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Dog\na.wav,0.9,0.1,0.5\nb.wav,0.2,high,0.3\n",
        ["pred.csv", "'b.wav'", "'Cat'", "'high'", "not a number"],
    ),
    "score NaN": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Dog\na.wav,0.9,nan,0.5\nb.wav,0.2,0.8,0.3\n",
        ["'a.wav'", "'Cat'", "NaN"],
    ),
    "score empty": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Dog\na.wav,0.9,0.1,\nb.wav,0.2,0.8,0.3\n",
        ["'a.wav'", "'Dog'", "empty"],
    ),
    "pred row too short": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Dog\na.wav,0.9,0.1\nb.wav,0.2,0.8,0.3\n",
        ["'a.wav'", "3 fields", "header has 4"],
    ),
    "truth labels not quoted": (
        "fname,labels\na.wav,Bark,Dog\nb.wav,Cat\n",
        GOOD_PRED,
        ["'a.wav'", "3 fields", "quoted"],
    ),
    "wide value not 0/1": ("fname,Bark,Cat\na.wav,1,0\nb.wav,0,2\n", GOOD_PRED, ["'b.wav'", "'Cat'", "'2'", "0 or 1"]),
    "wide value empty": ("fname,Bark,Cat\na.wav,1,\nb.wav,0,1\n", GOOD_PRED, ["'a.wav'", "'Cat'", "0 or 1"]),
    "duplicated column": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Bark\na.wav,1,2,3\nb.wav,1,2,3\n",
        ["pred.csv", "'Bark'", "twice"],
    ),
    "no positive label": ("fname,labels\na.wav,\nb.wav,\n", GOOD_PRED, ["truth.csv", "no positive"]),
    # Python's float() reads these (10.0 and 0.8); pandas and numpy refuse them, and so does the reader.
    "score with an underscore": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Dog\na.wav,1_0,0.1,0.5\nb.wav,0.2,0.8,0.3\n",
        ["'a.wav'", "'Bark'", "'1_0'", "not a number"],
    ),
    "score in fullwidth digits": (
        GOOD_TRUTH,
        "fname,Bark,Cat,Dog\na.wav,0.9,0.1,0.5\nb.wav,0.2,\uff10.8,0.3\n",
        ["'b.wav'", "'Cat'", "not a number"],
    ),
    "wide label with an underscore": (
        "fname,Bark,Cat\na.wav,1,0\nb.wav,0,0_1\n", GOOD_PRED, ["'b.wav'", "'Cat'", "'0_1'", "0 or 1"]
    ),
}


def check_one_line_error(code, out, err, words):
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert is_error_line(err), err
    for word in words:
        assert word in err, (word, err)


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_bad_file_exits_2_with_one_line(tmp_path, capsys, case):
    truth_text, pred_text, words = BAD_FILES[case]
    truth, pred = tmp_path / "truth.csv", tmp_path / "pred.csv"
    if truth_text is not None:
        truth.write_text(truth_text)
    if pred_text is not None:
        pred.write_text(pred_text)
    check_one_line_error(*run_main(capsys, "score", truth, pred), words)


def test_good_base_files_score(tmp_path, capsys):
    truth = write_csv(tmp_path / "truth.csv", ["fname", "labels"], [["a.wav", "Bark,Dog"], ["b.wav", "Cat"]])
    pred = tmp_path / "pred.csv"
    pred.write_text(GOOD_PRED)
    assert Path(truth).read_text() == GOOD_TRUTH
    code, out, err = run_main(capsys, "score", truth, pred, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["lwlrap"] == pytest.approx(1.0, rel=1e-12)  # every positive ranked above every negative


def test_not_utf8_and_directory(tmp_path, capsys):
    pred = tmp_path / "pred.csv"
    pred.write_text(GOOD_PRED)
    truth = tmp_path / "truth.csv"
    truth.write_bytes(b"fname,labels\na.wav,Caf\xe9\n")
    check_one_line_error(*run_main(capsys, "score", truth, pred), ["truth.csv', line 2 (fname 'a.wav') is not UTF-8",
                                                                    "character 10 of the line", "encoding='utf-8'"])
    # pandas' to_csv(encoding="latin-1"): the line and fname of the first byte that is not UTF-8 (it had given the
    # byte's offset in the file only)
    truth.write_text(GOOD_TRUTH)
    pred.write_bytes(GOOD_PRED.replace("b.wav", "b\xe9.wav").encode("latin-1"))
    code, out, err = run_main(capsys, "score", truth, pred)
    check_one_line_error(code, out, err, ["prediction file", "line 3 (fname 'b\ufffd.wav') is not UTF-8",
                                          "character 2 of the line"])
    check_one_line_error(*run_main(capsys, "score", tmp_path, pred), [str(tmp_path), "directory"])


def test_plot_errors(tmp_path, capsys, monkeypatch):
    truth, pred = tmp_path / "truth.csv", tmp_path / "pred.csv"
    truth.write_text(GOOD_TRUTH)
    pred.write_text(GOOD_PRED)
    bad_target = tmp_path / "no_such_folder" / "out.png"
    check_one_line_error(
        *run_main(capsys, "score", truth, pred, "--plot", bad_target), ["does not exist", "no_such_folder"]
    )  # checked before the scoring, whose report the error would otherwise throw away
    # A folder, or a format matplotlib does not write, is refused before scoring too (the format had failed after it)
    check_one_line_error(
        *run_main(capsys, "score", truth, pred, "--plot", tmp_path), ["that is a folder", "per_class.png"]
    )
    check_one_line_error(
        *run_main(capsys, "compare", truth, pred, pred, "--plot", tmp_path / "chart.xyz"), ["'.xyz'", ".png", ".svg"]
    )
    assert sorted(path.name for path in tmp_path.iterdir()) == ["pred.csv", "truth.csv"]
    # .pgf needs a LaTeX install to write: refused up front where there is none (it had failed after the scoring)
    monkeypatch.setattr("shutil.which", lambda name: None)
    check_one_line_error(*run_main(capsys, "score", truth, pred, "--plot", tmp_path / "c.pgf"), ["'.pgf'", ".png"])
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    check_one_line_error(*run_main(capsys, "score", truth, pred, "--plot", tmp_path / "x.png"), ["matplotlib"])
    assert not (tmp_path / "x.png").exists()


# ---------------------------------------------------------------------------------------------------------------
# Sample files


def test_sample_maker_refuses_a_file_as_its_folder(tmp_path):
    (tmp_path / "taken").write_text("x")
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_sample.py"), "--out-dir", str(tmp_path / "taken")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().endswith(f"--out-dir {tmp_path / 'taken'} is a file, not a folder: name a folder to write "
                                        f"the samples into"), done.stderr
    assert (tmp_path / "taken").read_text() == "x"


def test_sample_files_regenerate_identically_and_score(tmp_path, capsys):
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_sample.py"), "--out-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    data = REPO / "examples" / "data"
    for name in ("sample_truth.csv", "sample_submission.csv"):
        assert (tmp_path / name).read_bytes() == (data / name).read_bytes(), name

    with open(data / "sample_truth.csv", newline="") as handle:
        truth_rows = list(csv.reader(handle))
    with open(data / "sample_submission.csv", newline="") as handle:
        pred_rows = list(csv.reader(handle))
    assert truth_rows[0] == ["fname", "labels"]
    assert 200 <= len(truth_rows) - 1 <= 500
    assert any("," in labels for _, labels in truth_rows[1:])  # multi-label rows (quoted)
    classes = pred_rows[0][1:]
    assert 15 <= len(classes) <= 30
    fnames = [row[0] for row in truth_rows[1:]]
    assert [row[0] for row in pred_rows[1:]] != fnames and sorted(row[0] for row in pred_rows[1:]) == sorted(fnames)
    by_fname = {row[0]: [float(v) for v in row[1:]] for row in pred_rows[1:]}
    preds = np.array([by_fname[f] for f in fnames])
    target = np.array([[int(c in labels.split(",")) for c in classes] for _, labels in truth_rows[1:]])
    assert any(len(set(row)) < len(row) for row in preds.tolist())  # tied scores

    code, out, err = run_main(capsys, "score", data / "sample_truth.csv", data / "sample_submission.csv", "--json")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert_matches_json(result, reference(preds, target, classes))
    assert 0.6 <= result["lwlrap"] <= 0.9


# ---------------------------------------------------------------------------------------------------------------
# Ties: --ties expected and the tie report


@pytest.mark.parametrize("layout", ["challenge", "wide"])
def test_ties_expected_and_tie_block(tmp_path, capsys, layout):
    """Scores rounded to one decimal tie: --ties expected matches the naive expectation, the text report prints the
    tie block with what the scores show (rounded, not saturated) and its advice, and --json carries the same
    numbers."""
    truth, pred, classes, preds, target = shuffled_files(tmp_path, 7, layout=layout)
    code, out, err = run_main(capsys, "score", truth, pred, "--json", "--ties", "expected")
    assert (code, err) == (0, "")
    result = json.loads(out)
    assert_matches_json(result, reference(preds, target, classes, ties="expected"))
    report = result["ties"]
    rows = [(list(p), list(t)) for p, t in zip(preds.tolist(), target.tolist())]
    tied = sum(1 for p, t in rows for j in range(len(p)) if t[j] and p.count(p[j]) > 1)
    assert (report["tied_label_count"], report["label_count"]) == (tied, int(target.sum()))
    assert report["lwlrap_expected"] == pytest.approx(result["lwlrap"], abs=1e-12)
    assert report["lwlrap_max"] == pytest.approx(reference(preds, target, classes)["lwlrap"], abs=1e-12)
    assert report["lwlrap_worst"] <= report["lwlrap_expected"] <= report["lwlrap_best"]
    code, out, err = run_main(capsys, "score", truth, pred)
    assert (code, err) == (0, "")
    assert f"ties         {tied} of {int(target.sum())} positive labels" in out
    assert f"max {report['lwlrap_max']:.6f}, expected {report['lwlrap_expected']:.6f}" in out
    assert "cause        the scores are rounded: none has more than 1 decimal," in out
    assert "score the logits" not in out and "saturated" not in out  # not one score is 0 or 1 and tied
    assert "write the scores with every digit" in out and "--ties expected gives the mean" in out
    assert (report["score_decimals"], report["saturated_tied_label_count"]) == (1, 0)


def test_no_tie_block_without_tied_positive(tmp_path, capsys):
    truth, pred, classes, preds, target = shuffled_files(tmp_path, 8)
    distinct = np.arange(preds.size, dtype=np.float64).reshape(preds.shape) / preds.size
    pred = write_csv(tmp_path / "distinct.csv", ["fname", *classes],
                     [[name, *row] for name, row in zip(read_fnames(pred), distinct.tolist())])
    code, out, err = run_main(capsys, "score", truth, pred)
    assert (code, err) == (0, "") and "ties " not in out and "advice" not in out
    code, out, err = run_main(capsys, "score", truth, pred, "--json")
    assert "ties" not in json.loads(out)


def read_fnames(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return [row[0] for row in list(csv.reader(handle))[1:]]


_TRUTH_META = 'fname,labels,usage\na.wav,"Bark,Cat",Public\nb.wav,Dog,Private\nc.wav,Cat,Public\n'
_PRED = "fname,Bark,Cat,Dog\na.wav,0.9,0.1,0.2\nb.wav,0.3,0.8,0.1\nc.wav,0.2,0.6,0.5\n"

# (truth text, prediction text, extra arguments, words the one error line must hold, words it must not)
MESSAGE_CASES = {
    "trailing comma on every line": (
        _TRUTH_META, "fname,Bark,Cat,Dog,\na.wav,0.9,0.1,0.2,\nb.wav,0.3,0.8,0.1,\nc.wav,0.2,0.6,0.5,\n", [],
        ["column 5 (no name) is empty in every row: the lines have an extra comma"], ["pandas"],
    ),
    "a header name left out": (
        _TRUTH_META, "fname,,Cat,Dog\na.wav,0.9,0.1,0.2\nb.wav,0.3,0.8,0.1\nc.wav,0.2,0.6,0.5\n", [],
        ["column 2 (no name) has no name in the header: name it, or drop the column"], ["pandas"],
    ),
    "a truth quote never closed": (
        'fname,labels\na.wav,"Bark\nb.wav,Cat\nc.wav,Dog\n', _PRED, [],
        ["truth file", "line 2: a quote opened on this line is never closed, so the rows below it"], ["missing"],
    ),
    "a prediction quote never closed": (
        _TRUTH_META, 'fname,Bark,Cat,Dog\na.wav,"0.9,0.1,0.2\nb.wav,0.3,0.8,0.1\nc.wav,0.2,0.6,0.5\n', [],
        ["line 2: a quote opened on this line is never closed"], ["line 4"],
    ),
    "a decimal comma": (
        _TRUTH_META, 'fname,Bark,Cat,Dog\na.wav,"0,9",0.1,0.2\nb.wav,0.3,0.8,0.1\nc.wav,0.2,0.6,0.5\n', [],
        ["'0,9' is not a number (a decimal comma: write the file with '.' as the decimal point"], [],
    ),
    "a two-column truth named label": (
        "fname,label\na.wav,Bark\nb.wav,Dog\nc.wav,Cat\n", _PRED, [],
        ["the value 'Bark' is not 0 or 1. A truth file of two columns", "rename 'label' to 'labels'"],
        ["--unknown"],
    ),
    "a public-only submission without --where": (
        _TRUTH_META, "fname,Bark,Cat,Dog\na.wav,0.9,0.1,0.2\nc.wav,0.2,0.6,0.5\n", [],
        ["is missing from prediction file", "it scores the truth rows of usage=Public alone; pass --where usage=Public"],
        [],
    ),
    "no positive label in the selection": (
        'fname,labels,usage\na.wav,,Public\nb.wav,Dog,Private\nc.wav,,Public\n', _PRED.replace("b.wav,0.3,0.8,0.1\n", ""),
        ["--where", "usage=Public"],
        ["has no positive label at all in the truth rows selected by --where usage=Public: lwlrap is undefined"],
        ["(it)"],
    ),
    "an empty score, as pandas writes NaN": (
        _TRUTH_META, "fname,Bark,Cat,Dog\na.wav,0.9,,0.2\nb.wav,0.3,0.8,0.1\nc.wav,0.2,0.6,0.5\n", [],
        ["line 2 (fname 'a.wav'), column 'Cat': the score is empty (pandas writes a NaN score so): fill or drop"],
        [],
    ),
    "a NaN score": (
        _TRUTH_META, "fname,Bark,Cat,Dog\na.wav,0.9,0.1,0.2\nb.wav,0.3,nan,0.1\nc.wav,0.2,0.6,0.5\n", [],
        ["line 3 (fname 'b.wav'), column 'Cat': the score is NaN, which cannot be ranked: find where the model"], [],
    ),
    "a class of the truth without a prediction column": (
        _TRUTH_META, "fname,Bark,Cat\na.wav,0.9,0.1\nb.wav,0.3,0.8\nc.wav,0.2,0.6\n", [],
        ["label 'Dog' is not a column of prediction file", "the predictions need a column for every class"], [],
    ),
    "labels written as a Python list (a list column through to_csv)": (
        'fname,labels\na.wav,"[\'Bark\', \'Cat\']"\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["label \"['Bark'\" is not a column", "reads like a Python list", "df['labels'].str.join(',')"],
        ["need a column for every class"],
    ),
    "labels joined by semicolons": (
        'fname,labels\na.wav,Bark;Cat\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["label 'Bark;Cat' is not a column", "the labels look separated by ';': separate a row's labels by commas"],
        ["need a column for every class"],
    ),
    "labels joined by spaces": (
        'fname,labels\na.wav,Bark Cat\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["the labels look separated by ' '"], [],
    ),
    "a label in another letter case": (
        'fname,labels\na.wav,"Bark,cat"\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["label 'cat' is not a column", "the predictions have 'Cat', which differs in letter case"], [],
    ),
    "a label in another Unicode form (decomposed accent)": (
        'fname,labels\na.wav,"Bark,Cafe\u0301"\nb.wav,Dog\nc.wav,Cat\n', _PRED.replace("Cat", "Caf\u00e9", 1), [],
        ["is not a column", "looks the same but is written with other Unicode code points", "normalize('NFC'"], [],
    ),
    "a space after the comma before one quoted label": (
        'fname,labels\na.wav, "Bark"\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["label '\"Bark\"' is not a column", "a space after the comma before it keeps the quote from opening"],
        ["Python list"],
    ),
    "a class whose name ends in a bracket": (
        'fname,labels\na.wav,"Bark,Speech [male]"\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["label 'Speech [male]' is not a column", "the predictions need a column for every class"], ["Python list"],
    ),
    "fnames in a column pandas named 'Unnamed: 0'": (
        _TRUTH_META, _PRED.replace("fname,", "Unnamed: 0,", 1), [],
        ["has no 'fname' column", "Its first column, 'Unnamed: 0', is the name pandas gives a column without one",
         "df.rename(columns={'Unnamed: 0': 'fname'})"], ["index_label"],
    ),
    "a space after the comma before a quoted labels field": (
        'fname,labels\na.wav, "Bark,Cat"\nb.wav,Dog\nc.wav,Cat\n', _PRED, [],
        ["3 fields, but the header has 2", "a space after a comma keeps the quote after it from opening a field"],
        ["put the labels of a row in one quoted field"],
    ),
    "fnames in pandas' unnamed index column": (
        _TRUTH_META, _PRED.replace("fname,", ",", 1), [],
        ["has no 'fname' column", "Its first column has no name", "to_csv(path, index_label='fname')"], [],
    ),
    "fnames in another letter case": (
        _TRUTH_META, _PRED.replace("b.wav", "B.wav"), [],
        ["fname 'b.wav'", "is missing from prediction file", "it has 'B.wav', which differs in letter case"], [],
    ),
    "the truth file given as the predictions too": (
        _TRUTH_META, _TRUTH_META, [],
        ["column 'labels': the score 'Bark,Cat' is not a number (this file reads like a truth file of fname and "
         "labels: give a prediction file here"], [],
    ),
    "the truth file given as the predictions too, a row without labels first": (
        _TRUTH_META, 'fname,labels\na.wav,\nb.wav,Dog\nc.wav,Cat\n', [],
        ["column 'labels': the score is empty (this file reads like a truth file of fname and labels"], ["pandas"],
    ),
    "a plot into a folder that is not there": (
        _TRUTH_META, _PRED, ["--plot", "/nonexistent-folder/chart.png"],
        ["--plot /nonexistent-folder/chart.png: the folder '/nonexistent-folder' does not exist"], [],
    ),
}


@pytest.mark.parametrize("case", list(MESSAGE_CASES))
def test_file_mistakes_end_in_one_line_that_names_the_fix(tmp_path, capsys, case):
    truth_text, pred_text, extra, words, absent = MESSAGE_CASES[case]
    (tmp_path / "truth.csv").write_text(truth_text)
    (tmp_path / "pred.csv").write_text(pred_text)
    if "--plot" in extra:
        pytest.importorskip("matplotlib")
    code, out, err = run_main(capsys, "score", tmp_path / "truth.csv", tmp_path / "pred.csv", *extra)
    assert (code, out) == (2, "") and is_error_line(err), err
    for word in words:
        assert word in err, err
    for word in absent:
        assert word not in err, err


def test_a_truth_file_s_metadata_may_hold_a_quoted_line_break(tmp_path, capsys):
    (tmp_path / "truth.csv").write_text('fname,labels,note\na.wav,"Bark,Cat","two\nlines"\nb.wav,Dog,x\nc.wav,Cat,y\n')
    (tmp_path / "pred.csv").write_text(_PRED)
    code, out, err = run_main(capsys, "score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--json")
    assert (code, err) == (0, "")
    preds = np.array([[0.9, 0.1, 0.2], [0.3, 0.8, 0.1], [0.2, 0.6, 0.5]])
    target = np.array([[1, 1, 0], [0, 0, 1], [0, 1, 0]])
    assert json.loads(out)["lwlrap"] == pytest.approx(
        label_ranking_average_precision_score(target, preds, sample_weight=target.sum(1)), abs=1e-12
    )


def test_compare_takes_ci_as_score_does(tmp_path, capsys):
    (tmp_path / "truth.csv").write_text(_TRUTH_META)
    (tmp_path / "a.csv").write_text(_PRED)
    (tmp_path / "b.csv").write_text(_PRED.replace("0.9", "0.05"))
    files = [tmp_path / name for name in ("truth.csv", "a.csv", "b.csv")]
    results = []
    for option in (["--ci", "50"], ["--bootstrap", "50"]):
        code, out, err = run_main(capsys, "compare", *files, *option, "--json")
        assert (code, err) == (0, ""), err
        results.append(json.loads(out))
    assert results[0] == results[1] and results[0]["num_bootstrap"] == 50
    code, out, _ = run_main(capsys, "compare", *files, "--ci", "--json")
    assert code == 0 and json.loads(out)["num_bootstrap"] == 1000
    code, out, err = run_main(capsys, "compare", *files, "--ci", "0")
    assert (code, out) == (2, "") and "--ci takes a number of bootstrap replicates >= 1" in err
    code, out, err = run_main(capsys, "compare", *files, "--ci", "50", "--bootstrap", "60")
    assert (code, out) == (2, "") and "--ci 50 and --bootstrap 60 both set the replicates: give one" in err


def test_quoted_line_breaks_that_hold_no_rows_still_read(tmp_path, capsys):
    # Only a field that took whole rows in is an unclosed quote: a labels field "Bark,<newline>Dog" reads as
    # before, as two labels.
    (tmp_path / "truth.csv").write_text('fname,labels\na.wav,"Bark,\nCat"\nb.wav,Dog\nc.wav,Cat\n')
    (tmp_path / "pred.csv").write_text(_PRED)
    code, out, err = run_main(capsys, "score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--json")
    assert (code, err) == (0, ""), err
    preds = np.array([[0.9, 0.1, 0.2], [0.3, 0.8, 0.1], [0.2, 0.6, 0.5]])
    target = np.array([[1, 1, 0], [0, 0, 1], [0, 1, 0]])
    assert json.loads(out)["lwlrap"] == pytest.approx(
        label_ranking_average_precision_score(target, preds, sample_weight=target.sum(1)), abs=1e-12
    )


def test_a_class_named_index_in_the_truth_is_scored(tmp_path, capsys):
    # 'index' columns of distinct whole numbers are refused as reset_index() leftovers, unless the truth names a
    # class 'index' (whose scores may be ranks or counts).
    (tmp_path / "truth.csv").write_text('fname,labels\na.wav,"index,Cat"\nb.wav,Dog\nc.wav,Cat\n')
    (tmp_path / "pred.csv").write_text("fname,index,Cat,Dog\na.wav,3,1,0\nb.wav,0,2,5\nc.wav,1,4,2\n")
    code, out, err = run_main(capsys, "score", tmp_path / "truth.csv", tmp_path / "pred.csv", "--json")
    assert (code, err) == (0, ""), err
    preds = np.array([[3, 1, 0], [0, 2, 5], [1, 4, 2]], dtype=float)
    target = np.array([[1, 1, 0], [0, 0, 1], [0, 1, 0]])
    assert json.loads(out)["lwlrap"] == pytest.approx(
        label_ranking_average_precision_score(target, preds, sample_weight=target.sum(1)), abs=1e-12
    )


@pytest.mark.parametrize("column, warned", [
    ("2,0,2", True),              # a fold or id column beside fractional scores
    ("-inf,-inf,-inf", False),    # cannot outrank anything
    ("-100,-100,-100", False),    # constant
    ("0,1,0", False),             # hard 0/1 predictions
])
def test_the_whole_number_warning_names_only_columns_that_can_outrank_classes(tmp_path, capsys, column, warned):
    values = column.split(",")
    rows = _PRED.strip().split("\n")
    text = rows[0] + ",Extra\n" + "".join(f"{row},{value}\n" for row, value in zip(rows[1:], values))
    (tmp_path / "truth.csv").write_text(_TRUTH_META)
    (tmp_path / "pred.csv").write_text(text)
    (tmp_path / "b.csv").write_text(_PRED.replace("\n", ",0.5\n").replace("Dog,0.5", "Dog,Extra"))
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, _, err = run_main(capsys, "score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert code == 0
    assert ("the column 'Extra' holds whole numbers" in err) == warned, err
    # compare looks at both submissions: here the stray column is B's
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, _, err = run_main(capsys, "compare", tmp_path / "truth.csv", tmp_path / "b.csv", tmp_path / "pred.csv",
                                "--bootstrap", "50")
    assert code == 0 and ("pred.csv': the column 'Extra' holds whole numbers" in err) == warned, err


def test_a_submission_of_whole_numbers_throughout_is_not_warned_about(tmp_path, capsys):
    (tmp_path / "truth.csv").write_text(_TRUTH_META)
    (tmp_path / "pred.csv").write_text("fname,Bark,Cat,Dog,Extra\na.wav,4,3,1,2\nb.wav,1,4,3,2\nc.wav,2,4,3,1\n")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        code, _, err = run_main(capsys, "score", tmp_path / "truth.csv", tmp_path / "pred.csv")
    assert (code, err) == (0, "")


def test_compare_of_submissions_with_other_classes_names_the_column_and_the_fix(tmp_path, capsys):
    (tmp_path / "truth.csv").write_text(_TRUTH_META)
    (tmp_path / "a.csv").write_text(_PRED)
    (tmp_path / "b.csv").write_text("fname,Bark,Cat,Dog,fold\na.wav,0.9,0.1,0.2,1\nb.wav,0.3,0.8,0.1,1\n"
                                    "c.wav,0.2,0.6,0.5,1\n")  # A's scores and a column that is not a class
    code, out, err = run_main(capsys, "compare", tmp_path / "truth.csv", tmp_path / "a.csv", tmp_path / "b.csv")
    assert (code, out) == (2, "") and is_error_line(err), err
    assert "must score the same classes, but" in err and "has the column 'fold' that" in err, err
    assert "write both with one set of class columns (or drop a column that is not a class)" in err, err
