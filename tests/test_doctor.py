"""``torch-lwlrap doctor``: its reference against the suite's own (and brute force), its report, its exit status."""

from __future__ import annotations

import importlib.util
import itertools
import json
from fractions import Fraction

import numpy as np
import pytest
import torch

from tests.reference import make_case, naive_lrap, naive_lwlrap
from torch_lwlrap import cli, doctor
from torch_lwlrap.functional import _lwlrap as functional
from torch_lwlrap._checks import TIES


@pytest.fixture
def small_timing(monkeypatch):
    """Steady-state timings at a small size: the checks stay complete, the test stays quick."""
    monkeypatch.setattr(doctor, "TIMING_SIZES", {"cpu": (300, 40), "cuda": (300, 40)})


def test_every_tie_rule_has_a_reference():
    assert set(TIES) <= set(doctor.REFERENCE_PRECISION)


@pytest.mark.parametrize("ties", ["max", "index"])
@pytest.mark.parametrize("ignore_index", [None, -1])
def test_reference_equals_the_suites_naive_loops(ties, ignore_index):
    for seed in range(4):
        preds, target = make_case(seed, 30, 9, ignore_index=ignore_index, density=0.4)
        scores, labels = preds.double().numpy(), target.numpy()
        got = doctor.reference_values(scores, labels, ties, ignore_index)
        np.testing.assert_allclose(
            got["lwlrap per class"], naive_lwlrap(preds, target, ties, ignore_index, average="none"), rtol=1e-12
        )
        np.testing.assert_allclose(got["lwlrap"], naive_lwlrap(preds, target, ties, ignore_index), rtol=1e-12)
        np.testing.assert_allclose(got["lrap"], naive_lrap(preds, target, ties, ignore_index), rtol=1e-12)


def _expected_by_enumeration(scores, positive):
    """Mean over every order of each tie group (all permutations) of the strict-order precision of each positive."""
    n = len(scores)
    out = {}
    for j in range(n):
        if not positive[j]:
            continue
        tied = [k for k in range(n) if scores[k] == scores[j]]
        above = [k for k in range(n) if scores[k] > scores[j]]
        total, orders = Fraction(0), 0
        for order in itertools.permutations(tied):
            place = order.index(j)
            first = above + list(order[: place + 1])
            total += Fraction(sum(positive[k] for k in first), len(first))
            orders += 1
        out[j] = total / orders
    return out


def test_expected_rule_reference_is_the_mean_over_every_order_of_tied_labels():
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(1, 7))
        scores = rng.integers(0, 3, n).astype(float)
        positive = rng.random(n) < 0.5
        positive[rng.integers(n)] = True
        higher = scores[None, :] > scores[:, None]
        tied = scores[None, :] == scores[:, None]
        counts = [m.sum(1)[positive] for m in (higher, higher & positive, tied, tied & positive, tied, tied)]
        got = doctor.REFERENCE_PRECISION["expected"](*counts)
        expected = _expected_by_enumeration(scores, positive)
        assert np.allclose(got, [float(expected[j]) for j in np.flatnonzero(positive)], rtol=1e-12, atol=0)


def test_doctor_reports_every_device_and_dtype_and_exits_zero(small_timing, capsys):
    assert doctor.main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["versions"]["torch"] == torch.__version__
    assert report["versions"]["numpy"] == np.__version__
    expected = {(str(device), str(dtype)[6:]) for device in doctor.devices() for dtype in doctor.DTYPES}
    assert {(check["device"], check["dtype"]) for check in report["checks"]} == expected
    for check in report["checks"]:
        assert check["agrees"] and not check["failures"] and not check["errors"]
        assert check["ties"] == [rule for rule in TIES if rule in doctor.REFERENCE_PRECISION]
        assert check["cases"] == 3 * 2 * len(check["ties"])  # batches x ignore_index x tie rules
        assert check["first call s"] > 0 and check["steady s"] > 0 and check["read floor s"] > 0
        assert check["rows/s"] == pytest.approx(300 / check["steady s"], rel=1e-12)
        assert check["path"] in ("numba", "triton", "sort", "count")


def test_doctor_through_the_command_line_prints_the_tables(small_timing, capsys):
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "torch-lwlrap doctor" in out and "all values agree" in out
    for name in ("python", "torch", "torchmetrics", "numpy", "numba", "triton", "cuda", "driver"):
        assert any(line.split()[:1] == [name] for line in out.splitlines()), name
    rows = [line.split() for line in out.splitlines() if line.startswith("cpu ")]
    assert [row[1] for row in rows] == ["float16", "bfloat16", "float32", "float64"]
    assert all(row[3] == "yes" for row in rows)
    assert "x floor: that over one read of its inputs" in out and "--no-timing" not in out


def test_the_command_line_and_the_module_take_the_same_doctor_options(small_timing, capsys):
    """``torch-lwlrap doctor`` and ``python -m torch_lwlrap.doctor`` define their options apart (the command line's
    parser imports no torch): the two must not drift. ``--no-timing`` checks values without timings in both."""
    def options(parser):
        return sorted(option for action in parser._actions for option in action.option_strings)

    commands = next(action for action in cli.build_parser()._actions if action.dest == "command").choices
    assert options(commands["doctor"]) == options(doctor.build_parser())
    assert cli.main(["doctor", "--json", "--no-timing"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and report["checks"]
    assert all("steady s" not in check and check["path"] in ("numba", "triton", "sort", "count") for check in report["checks"])
    assert doctor.main(["--no-timing"]) == 0
    out = capsys.readouterr().out
    assert "no timings at that size (--no-timing)" in out and "x floor: that over one read" not in out
    rows = [line.split() for line in out.splitlines() if line.startswith("cpu ")]
    assert rows and all(row[-4:] == ["-"] * 4 for row in rows)


def test_a_planted_disagreement_gives_a_non_zero_exit_status(small_timing, monkeypatch, capsys):
    ranking_sums = functional.ranking_sums

    def off_by_a_little(*args, **kwargs):  # one class's precision sum off by 1e-9: a wrong value, not a crash
        sums = ranking_sums(*args, **kwargs)
        sums.class_precision_sum[0] += 1e-9
        return sums

    monkeypatch.setattr(functional, "ranking_sums", off_by_a_little)
    assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "DISAGREEMENT on cpu float32" in out and "SOME VALUES DISAGREE" in out


def test_an_engine_that_raises_is_a_disagreement(small_timing, monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise RuntimeError("planted")

    monkeypatch.setattr(functional, "ranking_sums", broken)
    assert doctor.main(["--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert not report["ok"] and all("planted" in check["errors"][0] for check in report["checks"])


def test_doctor_says_which_engine_a_forced_setting_takes(small_timing, capsys, monkeypatch):
    """A TORCH_LWLRAP_ENGINE left set is the first thing to see in a pasted report: its own line, and the path
    column of the path it forces (not the one auto would take), with numba's thread setting beside it."""
    monkeypatch.setenv("TORCH_LWLRAP_ENGINE", "sort")
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    engine = [line for line in out.splitlines() if line.startswith("engine ")]
    assert [line.split(None, 1)[1] for line in engine] == ["sort (forced by TORCH_LWLRAP_ENGINE)"]
    rows = [line.split() for line in out.splitlines() if line.startswith("cpu ")]
    assert rows and all(row[2] == "sort" for row in rows)
    if importlib.util.find_spec("numba") is not None:
        import numba

        threads = [line for line in out.splitlines() if line.startswith("numba threads ")]
        assert len(threads) == 1 and f" {numba.get_num_threads()} (layer: " in threads[0]
    monkeypatch.delenv("TORCH_LWLRAP_ENGINE")
    assert doctor.versions()["engine"] == "auto"


def test_the_read_floor_is_the_faster_of_torch_s_threads_and_one_thread(monkeypatch):
    """On busy cores a parallel torch reduction can take 4.5 times one thread's time, and doctor had printed an
    'x floor' below 1 (lwlrap faster than one read of its own inputs)."""
    from torch_lwlrap import doctor

    seen = []

    def timed(call, device):
        seen.append(torch.get_num_threads())
        return {2: 0.016, 1: 0.0035}[min(torch.get_num_threads(), 2)]

    monkeypatch.setattr(doctor, "_median_time", timed)
    threads = torch.get_num_threads()
    preds, target = torch.rand(4, 5), torch.rand(4, 5) < 0.5
    try:
        torch.set_num_threads(2)
        assert doctor._read_floor(preds, target, torch.device("cpu")) == 0.0035
        assert seen == [2, 1] and torch.get_num_threads() == 2  # restored
        torch.set_num_threads(1)
        seen.clear()
        assert doctor._read_floor(preds, target, torch.device("cpu")) == 0.0035 and seen == [1]
    finally:
        torch.set_num_threads(threads)


def test_what_the_first_check_says_on_stderr_lands_above_the_checks_table(small_timing, monkeypatch):
    """A terminal shows stdout and stderr as one stream: the compile notice that the first check prints (numba
    compiling on an empty cache) had landed between the table's header and its first row. Both streams into one
    buffer, as a terminal shows them, with a notice printed by the first check as the compile notice is."""
    import contextlib
    import io
    import sys

    from torch_lwlrap.cli._environment import COMPILE_NOTICE

    check_device_dtype = doctor.check_device_dtype
    calls = []

    def noisy_first_check(*args, **kwargs):
        if not calls:
            print(COMPILE_NOTICE, file=sys.stderr, flush=True)
        calls.append(args)
        return check_device_dtype(*args, **kwargs)

    monkeypatch.setattr(doctor, "check_device_dtype", noisy_first_check)
    terminal = io.StringIO()
    with contextlib.redirect_stdout(terminal), contextlib.redirect_stderr(terminal):
        assert cli.main(["doctor"]) == 0
    lines = terminal.getvalue().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("device "))
    assert lines.index(COMPILE_NOTICE) < header
    rows = [line.split()[:2] for line in lines[header + 1: header + 1 + len(calls)]]
    assert rows == [[str(device), str(dtype).replace("torch.", "")] for device, dtype, *_ in calls]
    assert lines.count(lines[header]) == 1
