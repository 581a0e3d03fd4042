"""The command line's numbers as a user reads them, each tied to its class, option and file: compare's per-class
values (JSON and text), their order, its summary lines and interval, ``--level``, ``--where``'s counts; ``score
--ci`` per class, under every tie rule, with unknown labels, its seed and count; both CSV readers (numpy's for plain
numeric files, the csv module's otherwise) on spaces and marks. References: the challenge's published per-class
lwlrap code, scikit-learn, and cases small enough to work out by hand. Files as pandas writes them.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import label_ranking_average_precision_score

from torch_lwlrap.cli import main

pd = pytest.importorskip("pandas")


# The challenge's per-class lwlrap (the Freesound Audio Tagging 2019 notebook), as published.
def _one_sample_positive_class_precisions(scores, truth):
    num_classes = scores.shape[0]
    pos_class_indices = np.flatnonzero(truth > 0)
    if not len(pos_class_indices):
        return pos_class_indices, np.zeros(0)
    retrieved_classes = np.argsort(scores)[::-1]
    class_rankings = np.zeros(num_classes, dtype=int)
    class_rankings[retrieved_classes] = range(num_classes)
    retrieved_class_true = np.zeros(num_classes, dtype=bool)
    retrieved_class_true[class_rankings[pos_class_indices]] = True
    retrieved_cumulative_hits = np.cumsum(retrieved_class_true)
    precision_at_hits = (retrieved_cumulative_hits[class_rankings[pos_class_indices]] /
                         (1 + class_rankings[pos_class_indices].astype(float)))
    return pos_class_indices, precision_at_hits


def calculate_per_class_lwlrap(truth, scores):
    num_samples, num_classes = scores.shape
    precisions = np.zeros((num_samples, num_classes))
    for i in range(num_samples):
        pos, prec = _one_sample_positive_class_precisions(scores[i, :], truth[i, :])
        precisions[i, pos] = prec
    labels_per_class = np.sum(truth > 0, axis=0)
    weight_per_class = labels_per_class / float(np.sum(labels_per_class))
    per_class = np.sum(precisions, axis=0) / np.maximum(1, labels_per_class)
    return per_class, weight_per_class


CLASSES = ["Zipper", "Bark", "Purr", "Hi-hat", "Accordion", "Yell", "Cat", "Drip", "Fart", "Gong", "Buzz", "Meow"]


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def frame(fnames, scores, classes):
    f = pd.DataFrame(scores, columns=classes)
    f.insert(0, "fname", fnames)
    return f


@pytest.fixture
def systems(tmp_path):
    rng = np.random.default_rng(5)
    n, c = 120, len(CLASSES)
    target = (rng.random((n, c)) < 0.25).astype(int)
    target[target.sum(axis=1) == 0, 3] = 1
    a = rng.random((n, c)) + 0.6 * target * rng.random(c)        # continuous: no ties
    b = rng.random((n, c)) + 0.6 * target * rng.random(c)
    fnames = [f"{i:05d}.wav" for i in rng.permutation(n)]
    labels = [",".join(CLASSES[j] for j in np.flatnonzero(row)) for row in target]
    usage = np.where(rng.random(n) < 0.5, "Public", "Private")
    pd.DataFrame({"fname": fnames, "labels": labels, "usage": usage}).to_csv(tmp_path / "truth.csv", index=False)
    frame(fnames, a, CLASSES).to_csv(tmp_path / "a.csv", index=False)
    order, cols = rng.permutation(n), rng.permutation(c)
    frame([fnames[i] for i in order], b[order][:, cols], [CLASSES[j] for j in cols]).to_csv(tmp_path / "b.csv",
                                                                                       index=False)
    return tmp_path, a, b, target, usage


def test_compare_per_class_json_matches_the_challenge_code(systems, capsys):
    folder, a, b, target, _ = systems
    result = json.loads(run(capsys, "compare", folder / "truth.csv", folder / "a.csv", folder / "b.csv",
                            "--bootstrap", "50", "--json"))
    per_a, _ = calculate_per_class_lwlrap(target, a)
    per_b, _ = calculate_per_class_lwlrap(target, b)
    for j, name in enumerate(CLASSES):
        got = result["per_class"][name]
        assert got["lwlrap_a"] == pytest.approx(per_a[j], abs=1e-12), name
        assert got["lwlrap_b"] == pytest.approx(per_b[j], abs=1e-12), name
        assert got["difference"] == pytest.approx(per_a[j] - per_b[j], abs=1e-12), name
        assert got["count"] == int(target[:, j].sum())


def _block(out, title):
    lines = out.splitlines()
    start = lines.index(f"classes where {title} most:")
    names = []
    for line in lines[start + 2:]:
        if not line or line.startswith("classes where") or line.startswith("-:"):
            break
        names.append(line.split()[0])
    return names


def test_compare_per_class_lists_the_largest_changes_first(systems, capsys):
    folder, a, b, target, _ = systems
    out = run(capsys, "compare", folder / "truth.csv", folder / "a.csv", folder / "b.csv", "--bootstrap", "50",
              "--per-class")
    diff = calculate_per_class_lwlrap(target, a)[0] - calculate_per_class_lwlrap(target, b)[0]
    assert (diff > 0).sum() > 5 or (diff < 0).sum() > 5  # more than the 5 listed in one direction
    want_a = [CLASSES[j] for j in np.argsort(-diff) if diff[j] > 0][:5]
    want_b = [CLASSES[j] for j in np.argsort(diff) if diff[j] < 0][:5]
    assert _block(out, "A better") == want_a
    assert _block(out, "B better") == want_b


def test_compare_text_report_values_and_sign(systems, capsys):
    folder, a, b, target, _ = systems
    out = run(capsys, "compare", folder / "truth.csv", folder / "a.csv", folder / "b.csv", "--bootstrap", "50")
    values = {line[:12].strip(): line[12:].split()[0] for line in out.splitlines() if line[:12].strip()}
    def lw(scores):
        return label_ranking_average_precision_score(target, scores, sample_weight=target.sum(axis=1))

    assert float(values["lwlrap A"]) == pytest.approx(lw(a), abs=5e-7)
    assert float(values["lwlrap B"]) == pytest.approx(lw(b), abs=5e-7)
    assert float(values["A - B"]) == pytest.approx(lw(a) - lw(b), abs=2e-6)
    assert lw(a) != pytest.approx(lw(b), abs=1e-4)


def test_compare_level_sets_the_interval(systems, capsys):
    folder = systems[0]
    files = (folder / "truth.csv", folder / "a.csv", folder / "b.csv")
    narrow = json.loads(run(capsys, "compare", *files, "--bootstrap", "400", "--level", "0.5", "--json"))
    wide = json.loads(run(capsys, "compare", *files, "--bootstrap", "400", "--level", "0.99", "--json"))
    assert wide["interval"][0] < narrow["interval"][0] < narrow["interval"][1] < wide["interval"][1]
    # per class too
    name = max(CLASSES, key=lambda n: narrow["per_class"][n]["count"])
    assert wide["per_class"][name]["interval"][0] < narrow["per_class"][name]["interval"][0]


def test_compare_where_counts_each_submission_s_ignored_rows(systems, capsys):
    folder, a, b, target, usage = systems
    truth = pd.read_csv(folder / "truth.csv")
    public = truth["usage"] == "Public"
    pd.read_csv(folder / "b.csv").set_index("fname").loc[truth.fname[public]].reset_index().to_csv(
        folder / "b_public.csv", index=False)
    result = json.loads(run(capsys, "compare", folder / "truth.csv", folder / "a.csv", folder / "b_public.csv",
                            "--where", "usage=Public", "--bootstrap", "50", "--json"))
    assert result["selection"]["ignored_prediction_rows"] == {"a": int((~public).sum()), "b": 0}
    out = run(capsys, "compare", folder / "truth.csv", folder / "a.csv", folder / "b_public.csv",
              "--where", "usage=Public", "--bootstrap", "50")
    b_line = next(line for line in out.splitlines() if line.startswith("B "))
    assert "ignored" not in b_line


def test_score_ci_per_class_intervals_belong_to_their_class(tmp_path, capsys):
    rng = np.random.default_rng(0)
    classes = ["Zebra", "Apple", "Mango", "Kiwi"]  # not in sorted order
    n = 80
    target = (rng.random((n, 4)) < 0.4).astype(int)
    target[target.sum(axis=1) == 0, 2] = 1
    scores = rng.random((n, 4))
    scores[:, 0] = 10.0 + rng.random(n)     # Zebra: always first: every Zebra label has precision 1
    scores[:, 1] = -10.0 - rng.random(n)    # Apple: always last: below a negative in most rows
    pd.DataFrame({"fname": [f"{i}.wav" for i in range(n)],
                  "labels": [",".join(classes[j] for j in np.flatnonzero(r)) for r in target]}).to_csv(
        tmp_path / "t.csv", index=False)
    frame([f"{i}.wav" for i in range(n)], scores, classes).to_csv(tmp_path / "p.csv", index=False)
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--ci", "200", "--json"))
    per_class, _ = calculate_per_class_lwlrap(target, scores)
    assert per_class[0] == 1.0 and per_class[1] < 0.9
    assert result["ci"]["per_class"]["Zebra"] == [1.0, 1.0]
    low, high = result["ci"]["per_class"]["Apple"]
    assert low <= per_class[1] + 0.2 and high < 1.0


def test_rows_of_only_unknown_labels_count_as_rows_without_a_label(tmp_path, capsys):
    (tmp_path / "t.csv").write_text("fname,a,b,c\nx.wav,1,0,-1\ny.wav,-1,0,0\nz.wav,0,1,1\nw.wav,-1,-1,0\n")
    (tmp_path / "p.csv").write_text("fname,a,b,c\nx.wav,0.1,0.7,0.2\ny.wav,0.3,0.2,0.1\nz.wav,0.5,0.4,0.3\n"
                                    "w.wav,0.2,0.5,0.9\n")
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--unknown", "-1", "--json"))
    assert result["rows_without_label"] == 2 and result["num_unknown"] == 4
    out = run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--unknown", "-1")
    assert "samples      4 (2 without a positive label" in out


@pytest.mark.parametrize("blank_line", ["", "\n"])  # "": numpy's fast reader takes the file; "\n": the csv module's
def test_spaces_around_names_and_fnames_in_plain_numeric_files(tmp_path, capsys, blank_line):
    (tmp_path / "t.csv").write_text(f"fname, a ,b , c\n x.wav ,1,0,1\ny.wav ,0,1,1\n z.wav,0,0,1\n{blank_line}")
    (tmp_path / "p.csv").write_text(f"fname, a ,b,c \ny.wav,0.1,0.7,0.2\n z.wav ,1,2,3\nx.wav ,0.1,0.7,0.2\n"
                                    f"{blank_line}")
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--json"))
    preds = np.array([[0.1, 0.7, 0.2], [0.1, 0.7, 0.2], [1, 2, 3]])
    target = np.array([[1, 0, 1], [0, 1, 1], [0, 0, 1]])
    assert result["lrap"] == pytest.approx(label_ranking_average_precision_score(target, preds), abs=1e-12)
    assert sorted(result["per_class"]) == ["a", "b", "c"]


def test_compare_text_interval_is_the_json_interval_low_first(systems, capsys):
    folder = systems[0]
    files = (folder / "truth.csv", folder / "a.csv", folder / "b.csv")
    result = json.loads(run(capsys, "compare", *files, "--bootstrap", "200", "--json"))
    out = run(capsys, "compare", *files, "--bootstrap", "200")
    line = next(line for line in out.splitlines() if line.startswith("A - B"))
    low, high = (float(x) for x in line.split("[")[1].split("]")[0].split(","))
    assert low < high
    assert [low, high] == pytest.approx(result["interval"], abs=5e-7)


def test_an_extra_prediction_fname_names_each_file_in_its_role(tmp_path, capsys):
    (tmp_path / "truth.csv").write_text('fname,labels\nx.wav,"a,c"\ny.wav,b\n')
    (tmp_path / "pred.csv").write_text("fname,a,b,c\nx.wav,0.1,0.7,0.2\ny.wav,0.1,0.7,0.2\nq.wav,1,2,3\n")
    assert main(["score", str(tmp_path / "truth.csv"), str(tmp_path / "pred.csv")]) == 2
    err = capsys.readouterr().err
    assert f"fname 'q.wav' of prediction file {str(tmp_path / 'pred.csv')!r}" in err
    assert f"is missing from truth file {str(tmp_path / 'truth.csv')!r}" in err


def test_compare_counts_rows_without_a_label(tmp_path, capsys):
    (tmp_path / "t.csv").write_text('fname,labels\nx.wav,"a,c"\ny.wav,\nz.wav,b\nw.wav,\n')
    (tmp_path / "a.csv").write_text("fname,a,b,c\nx.wav,0.1,0.7,0.2\ny.wav,0.3,0.2,0.1\nz.wav,0.5,0.4,0.3\n"
                                    "w.wav,0.2,0.5,0.9\n")
    result = json.loads(run(capsys, "compare", tmp_path / "t.csv", tmp_path / "a.csv", tmp_path / "a.csv",
                            "--bootstrap", "100", "--json"))
    assert result["rows_without_label"] == 2 and result["num_samples"] == 4


@pytest.mark.parametrize("blank_line", ["", "\n"])  # "": numpy's fast reader; "\n": the csv module's
def test_unknown_mark_is_compared_as_a_number_by_either_reader(tmp_path, capsys, blank_line):
    (tmp_path / "t.csv").write_text(f"fname,a,b,c\nx.wav,1.0,0.0,-1.0\ny.wav,0.0,1.0,1.0\n{blank_line}")
    (tmp_path / "p.csv").write_text("fname,a,b,c\nx.wav,0.1,0.7,0.9\ny.wav,0.3,0.2,0.1\n")
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--unknown", "-1", "--json"))
    # x: c unknown, a below b: 1/2. y: a=.3 b=.2 c=.1, positives b, c: b -> 1/2, c -> 2/3
    assert result["num_unknown"] == 1
    assert result["lwlrap"] == pytest.approx((1 / 2 + 1 / 2 + 2 / 3) / 3, abs=1e-12)


@pytest.mark.parametrize("ties, want", [("max", 0.5), ("expected", 0.75), ("index", 1.0)])
def test_score_ci_follows_the_tie_rule(tmp_path, capsys, ties, want):
    # Every row alike: positive a tied with negative b (a first in the file): each replicate gives the value itself.
    n = 30
    (tmp_path / "t.csv").write_text("fname,labels\n" + "".join(f"{i}.wav,a\n" for i in range(n)))
    (tmp_path / "p.csv").write_text("fname,a,b,c\n" + "".join(f"{i}.wav,0.5,0.5,0.1\n" for i in range(n)))
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--ties", ties, "--ci", "100",
                            "--json"))
    assert result["lwlrap"] == pytest.approx(want, abs=1e-12)
    assert result["ci"]["lwlrap"] == pytest.approx([want, want], abs=1e-12)


def test_score_ci_leaves_unknown_labels_out_as_the_value_does(tmp_path, capsys):
    # Every row: positive a at 0.5 below an unknown b at 0.9: lwlrap 1 with b left out, 1/2 were b a negative.
    n = 30
    (tmp_path / "t.csv").write_text("fname,a,b,c\n" + "".join(f"{i}.wav,1,-1,0\n" for i in range(n)))
    (tmp_path / "p.csv").write_text("fname,a,b,c\n" + "".join(f"{i}.wav,0.5,0.9,0.1\n" for i in range(n)))
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--unknown", "-1", "--ci", "100",
                            "--json"))
    assert result["lwlrap"] == 1.0
    assert result["ci"]["lwlrap"] == [1.0, 1.0]
    assert result["ci"]["per_class"]["a"] == [1.0, 1.0]


def test_where_matches_a_metadata_value_written_with_a_space(tmp_path, capsys):
    (tmp_path / "t.csv").write_text('fname,labels,usage\nx.wav,"a,c", Public\ny.wav,b,Private \nz.wav,a,Public\n')
    (tmp_path / "p.csv").write_text("fname,a,b,c\nx.wav,0.1,0.7,0.2\ny.wav,0.3,0.2,0.1\nz.wav,0.5,0.4,0.3\n")
    result = json.loads(run(capsys, "score", tmp_path / "t.csv", tmp_path / "p.csv", "--where", "usage=Public",
                            "--json"))
    assert result["selection"]["selected_rows"] == 2


def test_score_ci_follows_its_seed_and_its_replicate_count(systems, capsys):
    """One seed gives one interval, another seed another; so does another replicate count; the value stays."""
    folder = systems[0]
    files = (folder / "truth.csv", folder / "a.csv")

    def ci(*options):
        result = json.loads(run(capsys, "score", *files, "--json", *options))
        return result["lwlrap"], result["ci"]["lwlrap"]

    value, first = ci("--ci", "200", "--seed", "1")
    assert ci("--ci", "200", "--seed", "1") == (value, first)
    for options in (("--ci", "200", "--seed", "2"), ("--ci", "50", "--seed", "1")):
        other_value, other = ci(*options)
        assert other_value == value and other != first, options
        assert other[0] < value < other[1]
