"""The command line on files in the layouts people actually have: the challenge's metadata columns, scored subsets
(``--where usage=Public``), pandas' index column, vocabulary files, class names with commas, parentheses and hyphens,
CRLF line ends and a BOM.

Files are written the way their users write them (pandas' ``to_csv``, the csv module); every score is compared with
scikit-learn, the naive per-class loops of ``tests/reference.py`` and the library's own function on the same arrays.
"""

from __future__ import annotations

import csv
import json
import math
import struct
import warnings

import numpy as np
import pytest
import torch
from sklearn.metrics import label_ranking_average_precision_score

from tests.cli_output import is_error_line
from tests.reference import naive_lwlrap_per_class
from torch_lwlrap import multilabel_lrap, multilabel_lwlrap
from torch_lwlrap.cli import main

pd = pytest.importorskip("pandas")

# Names as the challenges spell them: parentheses, hyphens, underscores.
CHALLENGE_CLASSES = [
    "Accelerating_and_revving_and_vroom",
    "Bass_drum",
    "Fill_(with_liquid)",
    "Hi-hat",
    "Chewing_and_mastication",
    "Walk_and_footsteps",
    "Zipper_(clothing)",
    "Yell",
]


def make_arrays(seed, num_rows=60, classes=CHALLENGE_CLASSES):
    """Scores with ties (one decimal), 1 to 3 labels a row; the last class has no positive label."""
    rng = np.random.default_rng(seed)
    num_classes = len(classes)
    preds = np.round(rng.random((num_rows, num_classes)), 1)
    target = np.zeros((num_rows, num_classes), dtype=np.int64)
    for i in range(num_rows):
        target[i, rng.choice(num_classes - 1, size=rng.integers(1, 4), replace=False)] = 1
    fnames = [f"{rng.integers(16**8):08x}.wav" for _ in range(num_rows)]
    return fnames, list(classes), preds, target


def expected(preds, target, classes):
    """sklearn for lwlrap and LRAP, the naive loops per class, and the library on the same arrays."""
    per_class, weights, counts = naive_lwlrap_per_class(preds, target)
    lwlrap = label_ranking_average_precision_score(target, preds, sample_weight=target.sum(axis=1))
    lrap = label_ranking_average_precision_score(target, preds)
    library = float(multilabel_lwlrap(torch.from_numpy(preds), torch.from_numpy(target)))
    assert library == pytest.approx(lwlrap, abs=1e-12)
    assert float(multilabel_lrap(torch.from_numpy(preds), torch.from_numpy(target))) == pytest.approx(lrap, abs=1e-12)
    return {
        "lwlrap": lwlrap,
        "lrap": lrap,
        "num_samples": preds.shape[0],
        "num_labels": int(target.sum()),
        "per_class": {
            name: (None if math.isnan(v) else v, w, c) for name, v, w, c in zip(classes, per_class, weights, counts)
        },
    }


def assert_scores(result, want):
    assert result["num_samples"] == want["num_samples"]
    assert result["num_labels"] == want["num_labels"]
    assert result["lwlrap"] == pytest.approx(want["lwlrap"], abs=1e-12)
    assert result["lrap"] == pytest.approx(want["lrap"], abs=1e-12)
    assert set(result["per_class"]) == set(want["per_class"])
    for name, (value, weight, count) in want["per_class"].items():
        got = result["per_class"][name]
        assert got["count"] == count, name
        assert got["weight"] == pytest.approx(weight, abs=1e-12), name
        assert (got["lwlrap"] is None) if value is None else got["lwlrap"] == pytest.approx(value, abs=1e-12), name


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run(capsys, *argv, "--json")
    assert (code, err) == (0, ""), err
    return json.loads(out)


def check_error(capsys, argv, words):
    code, out, err = run(capsys, *argv)
    assert (code, out) == (2, ""), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert is_error_line(err), err
    for word in words:
        assert word in err, (word, err)
    return err


def truth_frame(fnames, classes, target, **metadata):
    labels = [",".join(classes[j] for j in np.flatnonzero(row)) for row in target]
    return pd.DataFrame({"fname": fnames, "labels": labels, **metadata})


def pred_frame(fnames, classes, preds):
    frame = pd.DataFrame(preds, columns=classes)
    frame.insert(0, "fname", fnames)
    return frame


def challenge_files(tmp_path, seed, num_rows=60):
    """The official test-label layout (fname,labels,usage,freesound_id,license) and a full submission, both
    written by pandas, rows in different orders."""
    fnames, classes, preds, target = make_arrays(seed, num_rows)
    rng = np.random.default_rng(seed + 1)
    usage = np.where(rng.random(num_rows) < 0.4, "Public", "Private")
    usage[:2] = ["Public", "Private"]
    license_ = rng.choice(["CC0", "CC-BY", "CC-BY-NC"], num_rows)
    truth = truth_frame(fnames, classes, target, usage=usage, freesound_id=rng.integers(1e6, size=num_rows),
                        license=license_)
    truth_path = tmp_path / "test_post_competition.csv"
    truth.iloc[rng.permutation(num_rows)].to_csv(truth_path, index=False)
    pred_path = tmp_path / "submission.csv"
    pred_frame(fnames, classes, preds).to_csv(pred_path, index=False)
    return truth_path, pred_path, (fnames, classes, preds, target, usage, license_)


# ---------------------------------------------------------------------------------------------------------------
# Metadata columns and --where


def test_metadata_columns_are_not_scored_and_are_named(tmp_path, capsys):
    truth, pred, (_, classes, preds, target, *_) = challenge_files(tmp_path, 0)
    result = run_json(capsys, "score", truth, pred)
    assert_scores(result, expected(preds, target, classes))
    assert result["metadata_columns"] == ["usage", "freesound_id", "license"]
    assert result["selection"] is None
    code, out, err = run(capsys, "score", truth, pred)
    assert code == 0 and "not scored: usage, freesound_id, license" in out.splitlines()[0]


def test_fsd50k_layout_with_integer_fnames(tmp_path, capsys):
    fnames, classes, preds, target = make_arrays(1)
    fnames = [str(37199 + 13 * i) for i in range(len(fnames))]  # FSD50K's fnames are clip ids, without .wav
    mids = [",".join(f"/m/0{j}x" for j in np.flatnonzero(row)) for row in target]
    split = np.where(np.arange(len(fnames)) % 5 == 0, "val", "train")
    truth = tmp_path / "dev.csv"
    truth_frame(fnames, classes, target, mids=mids, split=split).to_csv(truth, index=False)
    pred = tmp_path / "pred.csv"
    pred_frame(fnames, classes, preds).iloc[::-1].to_csv(pred, index=False)
    result = run_json(capsys, "score", truth, pred)
    assert_scores(result, expected(preds, target, classes))
    assert result["metadata_columns"] == ["mids", "split"]
    keep = split == "val"
    result = run_json(capsys, "score", truth, pred, "--where", "split=val")
    assert_scores(result, expected(preds[keep], target[keep], classes))


def test_where_usage_public_on_a_public_submission(tmp_path, capsys):
    truth, _, (fnames, classes, preds, target, usage, _) = challenge_files(tmp_path, 2)
    public = usage == "Public"
    pred = tmp_path / "public_submission.csv"
    pred_frame(np.array(fnames)[public], classes, preds[public]).to_csv(pred, index=False)

    result = run_json(capsys, "score", truth, pred, "--where", "usage=Public")
    assert_scores(result, expected(preds[public], target[public], classes))
    assert result["selection"] == {
        "where": {"usage": "Public"},
        "truth_rows": len(fnames),
        "selected_rows": int(public.sum()),
        "ignored_prediction_rows": 0,
    }
    code, out, _ = run(capsys, "score", truth, pred, "--where", "usage=Public")
    assert code == 0
    assert f"where        usage=Public: {public.sum()} of {len(fnames)} truth rows" in out
    # Without --where nothing is dropped silently: the private rows are missing from the submission.
    first_private = fnames[int(np.flatnonzero(~public)[0])]
    check_error(capsys, ["score", truth, pred], ["missing from prediction file", "public_submission.csv"])
    assert first_private  # (some private fname is named; which one depends on the truth's row order)


def test_where_on_a_full_submission_ignores_and_counts_the_other_rows(tmp_path, capsys):
    truth, pred, (fnames, classes, preds, target, usage, license_) = challenge_files(tmp_path, 3)
    private = usage == "Private"
    result = run_json(capsys, "score", truth, pred, "--where", "usage=Private")
    assert_scores(result, expected(preds[private], target[private], classes))
    assert result["selection"]["ignored_prediction_rows"] == int((~private).sum())
    code, out, _ = run(capsys, "score", truth, pred, "--where", "usage=Private")
    assert f"({(~private).sum()} rows outside the selection ignored)" in out

    both = private & (license_ == "CC-BY")
    result = run_json(capsys, "score", truth, pred, "--where", "usage=Private", "--where", "license=CC-BY")
    assert_scores(result, expected(preds[both], target[both], classes))
    assert result["selection"]["where"] == {"usage": "Private", "license": "CC-BY"}


def test_where_errors(tmp_path, capsys):
    truth, pred, _ = challenge_files(tmp_path, 4)
    check_error(capsys, ["score", truth, pred, "--where", "usage=public"], ["'Private', 'Public'", "case"])
    check_error(capsys, ["score", truth, pred, "--where", "split=test"], ["no metadata column 'split'", "'usage'"])
    for option in (["--where", "usage"], ["--top", "0"], ["--top", "five"]):  # argparse's usage errors
        code, out, err = run(capsys, "score", truth, pred, *option)
        assert (code, out) == (2, "") and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"torch-lwlrap score: error: argument {option[0]}: expected"), err
    check_error(
        capsys, ["score", truth, pred, "--where", "usage=Public", "--where", "usage=Private"], ["together"]
    )
    wide = tmp_path / "wide.csv"
    wide.write_text("fname,Yell\na.wav,1\n")
    check_error(capsys, ["score", wide, pred, "--where", "usage=Public"], ["no metadata column", "wide"])
    empty = tmp_path / "empty_private.csv"
    empty.write_text('fname,labels,usage\na.wav,Yell,Public\nb.wav,,Private\n')
    small = tmp_path / "small_pred.csv"
    small.write_text("fname,Yell,Hi-hat\na.wav,0.5,0.2\nb.wav,0.1,0.3\n")
    check_error(capsys, ["score", empty, small, "--where", "usage=Private"], ["no positive label", "usage=Private"])
    # A submission row that is in no truth row at all is still an error with --where.
    extra = pd.read_csv(pred)
    extra.loc[len(extra)] = ["stray.wav"] + [0.5] * (extra.shape[1] - 1)
    extra.to_csv(pred, index=False)
    check_error(capsys, ["score", truth, pred, "--where", "usage=Public"], ["'stray.wav'", "missing from truth"])


# ---------------------------------------------------------------------------------------------------------------
# pandas' index column


def test_pandas_index_column_in_the_submission(tmp_path, capsys):
    truth, _, (fnames, classes, preds, target, *_) = challenge_files(tmp_path, 5)
    frame = pred_frame(fnames, classes, preds)
    pred = tmp_path / "pred.csv"

    frame.to_csv(pred)  # pandas' default index=True: an unnamed first column 0, 1, 2, ...
    err = check_error(capsys, ["score", truth, pred], ["pred.csv", "column 1 (no name)", "to_csv(path, index=False)"])
    assert "0, 1, 2" in err

    pd.read_csv(pred).to_csv(pred)  # read back and written again: an unnamed column and 'Unnamed: 0'
    check_error(capsys, ["score", truth, pred], ["column 1 (no name)", "index=False"])
    pd.read_csv(pred).iloc[:, 1:].to_csv(pred, index=False)
    check_error(capsys, ["score", truth, pred], ["column 1 ('Unnamed: 0')", "index=False"])

    frame.reset_index().to_csv(pred, index=False)  # a named column counting 0..N-1, written with index=False
    check_error(capsys, ["score", truth, pred], ["column 1 ('index')", "0, 1, 2", "reset_index(drop=True)"])

    # a frame whose index has a name ('id'), shuffled or filtered: the index comes first, before fname, and holds
    # distinct whole numbers that do not count 0..N-1; scored as a class it had lowered lwlrap with exit status 0
    named = frame.sample(frac=1.0, random_state=3).rename_axis("id")
    named.to_csv(pred)
    check_error(capsys, ["score", truth, pred], ["column 1 ('id') comes before fname", "distinct whole numbers",
                                                 "index=False"])
    named.iloc[::2].to_csv(pred)  # a subset of the rows: refused for the index, not for the missing fnames
    check_error(capsys, ["score", truth, pred], ["column 1 ('id') comes before fname"])
    named.to_csv(pred, index=False)  # the fix
    assert_scores(run_json(capsys, "score", truth, pred), expected(preds, target, classes))
    # the list column's fix as the message writes it, read back from the CSV first
    listed = pd.DataFrame({"fname": ["a.wav", "b.wav"], "labels": [["Bark", "Dog"], ["Cat"]]})
    listed.to_csv(tmp_path / "listed.csv", index=False)
    import ast

    back = pd.read_csv(tmp_path / "listed.csv")
    assert back["labels"].apply(ast.literal_eval).str.join(",").tolist() == ["Bark,Dog", "Cat"]
    assert listed["labels"].str.join(",").tolist() == ["Bark,Dog", "Cat"]


def test_a_whole_number_class_before_fname_is_scored_where_it_can_be_a_class(tmp_path, capsys):
    """Per-class ranks (a rank-averaged ensemble) with fname added last: the first column is a class of distinct
    whole numbers, here one without a positive label in a challenge-layout truth; it is scored. Beside fractional
    scores the same column reads as pandas' index and is refused, unless --classes names it."""
    truth, _, (fnames, classes, preds, target, *_) = challenge_files(tmp_path, 6)
    empty = [column for column in range(len(classes)) if not target[:, column].any()]
    assert empty  # a class without a positive label, to put first
    order = [empty[0]] + [column for column in range(len(classes)) if column != empty[0]]
    classes, preds, target = [classes[c] for c in order], preds[:, order], target[:, order]
    ranks = preds.argsort(0).argsort(0).astype(np.float64) + 1  # each column's ranks 1..N
    frame = pd.DataFrame(ranks, columns=classes)
    frame["fname"] = fnames
    pred = tmp_path / "ranks.csv"
    frame.to_csv(pred, index=False)
    assert_scores(run_json(capsys, "score", truth, pred), expected(ranks, target, classes))
    mixed = pd.DataFrame(preds, columns=classes)
    mixed[classes[0]] = ranks[:, 0]
    mixed["fname"] = fnames
    mixed.to_csv(pred, index=False)
    check_error(capsys, ["score", truth, pred], [f"column 1 ('{classes[0]}') comes before fname", "--classes"])
    vocabulary = tmp_path / "classes.txt"
    vocabulary.write_text("\n".join(classes) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("default")  # the command prints its warnings (pytest's filters make them errors)
        code, out, err = run(capsys, "score", truth, pred, "--classes", vocabulary, "--json")
    assert code == 0 and "holds whole numbers" in err, err  # scored, with the whole-number column's warning
    assert_scores(json.loads(out), expected(mixed[classes].to_numpy(), target, classes))


def test_pandas_index_column_in_the_truth(tmp_path, capsys):
    fnames, classes, preds, target = make_arrays(6)
    pred = tmp_path / "pred.csv"
    pred_frame(fnames, classes, preds).to_csv(pred, index=False)
    truth = tmp_path / "truth.csv"
    truth_frame(fnames, classes, target).to_csv(truth)
    check_error(capsys, ["score", truth, pred], ["truth.csv", "column 1 (no name)", "0, 1, 2", "index=False"])
    wide = pd.DataFrame(target, columns=classes)
    wide.insert(0, "fname", fnames)
    wide.reset_index().to_csv(truth, index=False)
    check_error(capsys, ["score", truth, pred], ["truth.csv", "column 1 ('index')", "reset_index(drop=True)"])


# ---------------------------------------------------------------------------------------------------------------
# Classes


def test_classes_without_positive_are_reported(tmp_path, capsys):
    truth, pred, (_, classes, preds, target, *_) = challenge_files(tmp_path, 7)
    code, out, _ = run(capsys, "score", truth, pred)
    assert code == 0
    assert f"classes      {len(classes)} (1 without a positive label: {classes[-1]})" in out
    assert run_json(capsys, "score", truth, pred)["classes_without_positive"] == [classes[-1]]

    many = [f"Class_{j:03d}" for j in range(40)]
    fnames, _, preds, target = make_arrays(8, classes=many)
    target[:, 12:] = 0  # 28 classes without a positive label: counted, not listed
    truth = tmp_path / "truth_many.csv"
    truth_frame(fnames, many, target).to_csv(truth, index=False)
    pred = tmp_path / "pred_many.csv"
    pred_frame(fnames, many, preds).to_csv(pred, index=False)
    code, out, _ = run(capsys, "score", truth, pred)
    assert "classes      40 (28 without a positive label, listed by --json)" in out
    result = run_json(capsys, "score", truth, pred)
    assert result["classes_without_positive"] == many[12:]
    assert_scores(result, expected(preds, target, many))


def write_lines(path, lines, newline="\n"):
    path.write_text(newline.join(lines) + newline)
    return path


@pytest.mark.parametrize("form", ["names", "vocabulary", "vocabulary with header", "index,label"])
def test_classes_file_pins_the_vocabulary(tmp_path, capsys, form):
    truth, pred, (fnames, classes, preds, target, *_) = challenge_files(tmp_path, 9)
    order = list(reversed(classes))
    if form == "names":
        vocabulary = write_lines(tmp_path / "classes.txt", order)
    else:
        rows = [[str(i), name, f"/m/0{i}"] if form != "index,label" else [str(i), name] for i, name in enumerate(order)]
        if form == "vocabulary with header":
            rows.insert(0, ["index", "label", "mid"])
        vocabulary = tmp_path / "vocabulary.csv"
        with open(vocabulary, "w", newline="") as handle:
            csv.writer(handle).writerows(rows)  # csv's default line end: CRLF
    result = run_json(capsys, "score", truth, pred, "--classes", vocabulary)
    assert_scores(result, expected(preds, target, classes))
    assert result["vocabulary"] == str(vocabulary)

    # A prediction column outside the vocabulary, and a vocabulary class missing from the predictions.
    stray = pred_frame(fnames, classes, preds)
    stray["Dog-bark"] = 0.5
    stray.to_csv(tmp_path / "stray.csv", index=False)
    check_error(capsys, ["score", truth, tmp_path / "stray.csv", "--classes", vocabulary], ["'Dog-bark'", "vocabulary"])
    pred_frame(fnames, classes, preds).drop(columns=["Hi-hat"]).to_csv(tmp_path / "short.csv", index=False)
    check_error(capsys, ["score", truth, tmp_path / "short.csv", "--classes", vocabulary], ["'Hi-hat'", "short.csv"])


def test_classes_file_errors(tmp_path, capsys):
    truth, pred, (_, classes, *_) = challenge_files(tmp_path, 10)
    check_error(capsys, ["score", truth, pred, "--classes", tmp_path / "none.txt"], ["none.txt", "does not exist"])
    bad = write_lines(tmp_path / "bad.txt", classes[:3] + ["Bark, dog"] + classes[3:])
    check_error(capsys, ["score", truth, pred, "--classes", bad], ["bad.txt", "line 4", "quote"])
    twice = write_lines(tmp_path / "twice.txt", classes + [classes[0]])
    check_error(capsys, ["score", truth, pred, "--classes", twice], ["twice.txt", "listed twice", "line 1"])
    missing = write_lines(tmp_path / "missing.txt", classes[:-1])  # the prediction's last column is not in it
    check_error(capsys, ["score", truth, pred, "--classes", missing], [repr(classes[-1]), "not in the vocabulary"])


def test_quoted_class_names_with_commas_crlf_and_bom(tmp_path, capsys):
    classes = ["Bark, dog", "Fill_(with_liquid)", 'Say "hi"', "Hi-hat", "Zipper_(clothing)"]
    fnames, classes, preds, target = make_arrays(11, classes=classes)
    truth = tmp_path / "truth.csv"
    wide = pd.DataFrame(target, columns=classes)
    wide.insert(0, "fname", fnames)
    wide.iloc[::-1].to_csv(truth, index=False, lineterminator="\r\n", encoding="utf-8-sig")
    pred = tmp_path / "pred.csv"
    pred_frame(fnames, classes, preds)[["fname"] + classes[::-1]].to_csv(
        pred, index=False, lineterminator="\r\n", encoding="utf-8-sig"
    )
    assert truth.read_bytes().startswith(b"\xef\xbb\xbffname,") and b'"Bark, dog"' in truth.read_bytes()
    result = run_json(capsys, "score", truth, pred)
    assert_scores(result, expected(preds, target, classes))
    vocabulary = tmp_path / "classes.txt"
    with open(vocabulary, "w", newline="", encoding="utf-8-sig") as handle:
        csv.writer(handle).writerows([[name] for name in classes])  # quoted where needed, CRLF, BOM
    assert_scores(run_json(capsys, "score", truth, pred, "--classes", vocabulary), expected(preds, target, classes))


# ---------------------------------------------------------------------------------------------------------------
# --top and the plot


def table_rows(out):
    # The per-class table is the report's second block (a tie block may follow it).
    block = out.split("\n\n")[1].splitlines()
    return block[0], [line.rsplit(None, 3) for line in block[2:]]


@pytest.mark.parametrize("top", [3, -3, 100])
def test_top_lists_the_worst_or_best_classes(tmp_path, capsys, top):
    truth, pred, (_, classes, preds, target, *_) = challenge_files(tmp_path, 12)
    code, out, _ = run(capsys, "score", truth, pred, "--top", top)
    assert code == 0
    title, rows = table_rows(out)
    per_class, _, counts = naive_lwlrap_per_class(preds, target)
    scored = sorted((v, classes[j]) for j, v in enumerate(per_class) if counts[j])
    want = scored[:top] if top > 0 else scored[::-1][:-top]
    assert [row[0] for row in rows] == [name for _, name in want]
    for row, (value, _) in zip(rows, want):
        assert float(row[1]) == pytest.approx(value, abs=5e-7)
    assert ("worst" if top > 0 else "best") in title and f"of {len(scored)} classes" in title


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_plot_of_527_classes_stays_readable(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    classes = [f"Audioset_class_{j:03d}" for j in range(527)]
    fnames, classes, preds, target = make_arrays(13, num_rows=300, classes=classes)
    truth = tmp_path / "truth.csv"
    truth_frame(fnames, classes, target).to_csv(truth, index=False)
    pred = tmp_path / "pred.csv"
    pred_frame(fnames, classes, preds).to_csv(pred, index=False)
    code, _, err = run(capsys, "score", truth, pred, "--plot", tmp_path / "all.png", "--json")
    assert (code, err) == (0, "")
    width, height = png_size(tmp_path / "all.png")
    assert height <= 2500 and width <= 4000, (width, height)  # one column would be about 700 x 15,900
    code, _, err = run(capsys, "score", truth, pred, "--plot", tmp_path / "top.png", "--top", "-20", "--json")
    assert (code, err) == (0, "")
    width, height = png_size(tmp_path / "top.png")
    assert height < 1000 and width < 1000, (width, height)


# ---------------------------------------------------------------------------------------------------------------
# The compiled reader and the precise one


def precise_read(monkeypatch, path, reader):
    from torch_lwlrap.cli import _files

    with monkeypatch.context() as patch:
        patch.setattr(_files, "_read_plain_table", lambda path, accept: None)
        return reader(str(path))


def test_compiled_reader_reads_what_float_reads(tmp_path, monkeypatch):
    from torch_lwlrap.cli._files import _read_plain_table, read_predictions, read_truth

    rng = np.random.default_rng(14)
    values = rng.standard_normal((300, 9)) * 10.0 ** rng.integers(-300, 300, (300, 9))
    formats = [repr, lambda v: f"{v:.6g}", lambda v: f"{v:.17e}", lambda v: f" {v:+.4f}\t", lambda v: f"{v:.30f}"]
    texts = [[formats[(i + j) % len(formats)](float(values[i, j])) for j in range(9)] for i in range(300)]
    texts[0][:4] = ["inf", "-Infinity", "1e400", "-1e-400"]
    fnames = [f"clip {i:03d}.wav" for i in range(300)]
    path = tmp_path / "pred.csv"
    path.write_text("fname," + ",".join(CHALLENGE_CLASSES[:8] + ["Yell-2"]) + "\n"
                    + "".join(f"{f},{','.join(row)}\n" for f, row in zip(fnames, texts)))
    assert _read_plain_table(path.read_text(), accept=lambda header: True) is not None  # the compiled path is taken
    fast = read_predictions(str(path))
    precise = precise_read(monkeypatch, path, read_predictions)
    want = np.array([[float(text) for text in row] for row in texts])
    assert fast.fnames == precise.fnames == fnames and fast.classes == precise.classes
    assert np.array_equal(fast.scores, want) and np.array_equal(precise.scores, want)  # bit for bit

    wide = tmp_path / "truth.csv"
    target = (rng.random((300, 9)) < 0.3).astype(int)
    wide.write_text("fname," + ",".join(fast.classes) + "\n"
                    + "".join(f"{f},{','.join(map(str, row))}\n" for f, row in zip(fnames, target.tolist())))
    assert _read_plain_table(wide.read_text(), accept=lambda header: True) is not None
    assert read_truth(str(wide)) == precise_read(monkeypatch, wide, read_truth)


@pytest.mark.parametrize(
    "text",
    [
        "fname,a,b\r\nx.wav,1,2\r\n\r\ny.wav,3,4\r\n",  # a blank line
        'fname,a,b\n"x.wav",1,2\ny.wav,3,4\n',  # a quoted field
        "\ufefffname,a,b\nx.wav,1,2\ny.wav,3,4\n",  # a BOM
        "fname,b,a\nx.wav,1,2\ny.wav,3,4",  # no line end at the end
        "a,fname,b\n1,x.wav,2\n3,y.wav,4\n",  # fname not first
    ],
)
def test_files_the_compiled_reader_leaves_are_read_precisely(tmp_path, monkeypatch, text):
    # (Numbers that Python's float() alone reads, 1_000 or full-width digits, are refused by both readers, as pandas
    # and numpy refuse them: tests/test_cli.py's BAD_FILES.)
    from torch_lwlrap.cli._files import read_predictions

    path = tmp_path / "pred.csv"
    path.write_text(text, encoding="utf-8")
    read = read_predictions(str(path))
    precise = precise_read(monkeypatch, path, read_predictions)
    assert read.fnames == precise.fnames == ["x.wav", "y.wav"]
    assert read.classes == precise.classes and np.array_equal(read.scores, precise.scores)
    rows = [line for line in csv.reader(text.lstrip("\ufeff").splitlines()) if line]
    at = rows[0].index("fname")
    want = [[float(v) for k, v in enumerate(row) if k != at] for row in rows[1:]]
    assert read.scores.tolist() == want


def test_a_bad_file_is_reported_before_torch_is_imported(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    truth = tmp_path / "truth.csv"
    truth.write_text('fname,labels\na.wav,"Bark,Dog"\n')
    pred = tmp_path / "pred.csv"
    pred.write_text("fname,Bark,Dog\na.wav,0.5,high\n")
    code = (
        "import sys\nfrom torch_lwlrap.cli import main\n"
        f"status = main(['score', {str(truth)!r}, {str(pred)!r}])\n"
        "print(status, 'torch' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert "'high' is not a number" in done.stderr


@pytest.mark.slow
def test_cli_speed_benchmark_runs_and_scores_its_files(tmp_path):
    """benchmarks/cli_speed.py end to end on small files (no time is asserted); its lwlrap is the library's."""
    import subprocess
    import sys
    from pathlib import Path

    from benchmarks.cli_speed import write_files

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "speed.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli_speed", "--rows", "40", "--classes", "6", "--repeats", "1",
         "--json", str(out)],
        cwd=root, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "| **ratio** (goal <= 1.5x) |" in done.stdout
    result = json.loads(out.read_text())
    files = write_files(tmp_path, 40, 6)  # deterministic: the files the benchmark scored
    truth = pd.read_csv(files["truth"], keep_default_na=False)
    pred = pd.read_csv(files["pred"]).set_index("fname").loc[truth["fname"]]
    target = np.array([[int(c in labels.split(",")) for c in pred.columns] for labels in truth["labels"]])
    want = label_ranking_average_precision_score(target, pred.to_numpy(), sample_weight=target.sum(axis=1))
    assert result["lwlrap"] == pytest.approx(want, abs=1e-12)
