"""``torch-lwlrap compare --agreement K``: the mean Kendall distance at K between the two submissions, one line in
the report and a field of --json, from the rows and classes as matched (B's columns in A's order); and the smoke test
of the learning-to-rank benchmark script."""

from __future__ import annotations

import json

import pytest

from tests.reference_ranking import naive_distance
from torch_lwlrap.cli import main

TRUTH = 'fname,labels\nx.wav,"a,c"\ny.wav,b\nz.wav,a\n'
A = "fname,a,b,c\nx.wav,0.9,0.1,0.8\ny.wav,0.2,0.7,0.1\nz.wav,0.5,0.4,0.3\n"
B = "fname,c,b,a\nz.wav,0.5,0.4,0.3\nx.wav,0.9,0.1,0.8\ny.wav,0.2,0.7,0.1\n"  # other column and row orders


@pytest.fixture
def files(tmp_path):
    paths = []
    for name, text in (("truth.csv", TRUTH), ("a.csv", A), ("b.csv", B)):
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    return paths


def test_agreement_is_one_line_and_a_json_field(files, capsys):
    import torch

    # B's scores in A's row and column order: x (a, b, c) = (0.8, 0.1, 0.9), y = (0.1, 0.7, 0.2), z = (0.3, 0.4, 0.5)
    a = torch.tensor([[0.9, 0.1, 0.8], [0.2, 0.7, 0.1], [0.5, 0.4, 0.3]], dtype=torch.float64)
    b = torch.tensor([[0.8, 0.1, 0.9], [0.1, 0.7, 0.2], [0.3, 0.4, 0.5]], dtype=torch.float64)
    want = naive_distance(a, b, 2)
    assert want == pytest.approx((1 + 1 / 3 + 1) / 3)
    assert main(["compare", *files, "--bootstrap", "50", "--agreement", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("agreement")]
    assert lines == [f"agreement    {want:.6f}  Kendall distance at 2 between A's and B's rankings (0: same order, "
                     f"1: reversed)"]
    assert main(["compare", *files, "--bootstrap", "50", "--agreement", "2", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["agreement"]["k"] == result["options"]["agreement"] == 2
    assert result["agreement"]["kendall_distance"] == pytest.approx(want, rel=1e-12)
    assert result["difference"] == pytest.approx(result["lwlrap_a"] - result["lwlrap_b"])


def test_swapping_a_and_b_keeps_the_agreement_where_their_column_orders_differ(tmp_path, capsys):
    # Ties at the K-th place had been broken by A's column order: with B's columns in another order, `compare T A B`
    # and `compare T B A` gave 0.5 and 0.0. Where the orders differ, the sorted class names break them.
    import torch

    (tmp_path / "t.csv").write_text("fname,labels\nx.wav,a\ny.wav,b\n")
    (tmp_path / "a.csv").write_text("fname,b,a,c\nx.wav,1,1,0\ny.wav,0.2,0.7,0.7\n")
    (tmp_path / "b.csv").write_text("fname,c,b,a\nx.wav,0.1,0.7,0.5\ny.wav,0.3,0.3,0.9\n")
    a = torch.tensor([[1, 1, 0], [0.7, 0.2, 0.7]], dtype=torch.float64)  # columns a, b, c (sorted names)
    b = torch.tensor([[0.5, 0.7, 0.1], [0.9, 0.3, 0.3]], dtype=torch.float64)
    got = {}
    for k in (1, 2, 3):
        for first, second in (("a", "b"), ("b", "a")):
            assert main(["compare", str(tmp_path / "t.csv"), str(tmp_path / f"{first}.csv"),
                         str(tmp_path / f"{second}.csv"), "--bootstrap", "50", "--agreement", str(k), "--json"]) == 0
            got[k, first] = json.loads(capsys.readouterr().out)["agreement"]["kendall_distance"]
        assert got[k, "a"] == got[k, "b"] == pytest.approx(naive_distance(a, b, k), abs=1e-12), k
    # x: A's top 1 is a (tied with b, first by name), B's is b; the pair is tied in A only: 1/2. y: both top 1 are a
    assert got[1, "a"] == pytest.approx((0.5 + 0.0) / 2)


def test_without_agreement_nothing_changes(files, capsys):
    assert main(["compare", *files, "--bootstrap", "50", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["agreement"] is None and result["options"]["agreement"] is None
    assert main(["compare", *files, "--bootstrap", "50"]) == 0
    assert not [line for line in capsys.readouterr().out.splitlines() if line.startswith("agreement")]


@pytest.mark.parametrize("value", ["0", "-3", "ten", str(2**63), str(10**30)])
def test_a_bad_k_is_refused_naming_the_option(files, capsys, value):
    assert main(["compare", *files, "--agreement", value]) == 2
    err = capsys.readouterr().err
    assert f"argument --agreement: expected a positive integer below 2**63, such as 10, but got '{value}'" in err
    assert "Traceback" not in err


def test_the_largest_k_is_every_class(files, capsys):
    assert main(["compare", *files, "--bootstrap", "50", "--agreement", str(2**63 - 1), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert main(["compare", *files, "--bootstrap", "50", "--agreement", "3", "--json"]) == 0
    every = json.loads(capsys.readouterr().out)
    assert result["agreement"]["kendall_distance"] == every["agreement"]["kendall_distance"]


def test_benchmark_script_times_every_entry_and_reports_each_goal(tmp_path):
    # A smoke test at a toy size: the script runs, writes its table and JSON, and names every entry and goal. No time
    # is asserted.
    from benchmarks import ltr_agreement

    out = tmp_path / "ltr_agreement"
    args = ["--sizes", "200x12", "--min-run-time", "0.01", "--rounds", "2", "--scipy-rows", "5", "--out", str(tmp_path)]
    assert ltr_agreement.main(args) == 0
    table = out.with_suffix(".md").read_text()
    for name in list(ltr_agreement.entries(12)) + ["scipy spearmanr loop", "scipy kendalltau loop"]:
        assert f"| {name} |" in table
    report = json.loads(out.with_suffix(".json").read_text())
    (case,) = report["cases"]
    assert set(case["goals"]) == set(ltr_agreement.GOALS)
    assert all(goal["ratio"] > 0 and goal["scipy_speedup_per_row"] > 0 for goal in case["goals"].values())
    for goal in case["goals"].values():  # the median of the rounds' ratios lies within their range
        assert goal["ratio_range"][0] <= goal["ratio"] <= goal["ratio_range"][1]
    assert all(len(times) == 2 for times in case["seconds_per_round"].values())
    assert report["machine"]
    with pytest.raises(SystemExit):  # no round, no median: refused before anything runs
        ltr_agreement.main(args[:6] + ["--rounds", "0"] + args[8:])
