"""The benchmark scripts run end to end and their anchors agree with the library (no time is asserted)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks import anchors
from benchmarks.run import make_inputs, parse_sizes
from tests.reference import naive_lwlrap
from torch_lwlrap import multilabel_lwlrap

ROOT = Path(__file__).resolve().parents[1]


def run_module(*args, tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", *args, "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.slow
def test_quick_sweep_writes_agreeing_results(tmp_path):
    run_module("benchmarks", "--quick", "--device", "cpu", "--memory", "auto", tmp_path=tmp_path)
    report = json.loads((tmp_path / "quick-cpu.json").read_text())
    assert (tmp_path / "quick-cpu.md").read_text().startswith("# torch_lwlrap benchmark")
    assert (tmp_path / "quick-cpu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["metadata"]["torch"] == torch.__version__ and report["metadata"]["git_commit"]
    names = set()
    for case in report["cases"]:
        assert case["floor"]["seconds"] > 0
        for entry in case["results"]:
            names.add(entry["implementation"])
            if "seconds" in entry:
                assert entry["agrees"], entry
                assert entry["seconds"] > 0 and entry["rows_per_second"] > 0
        default = next(r for r in case["results"] if r["implementation"] == "torch_lwlrap")
        assert default["peak_extra_bytes"] >= 0 and set(default["speedup_vs"]) == {
            "scikit-learn",
            "challenge (numpy)",
            "torchmetrics",
        }
    assert {"torch_lwlrap engine=sort", "torch_lwlrap engine=count", "MultilabelLWLRAP update+compute"} <= names


@pytest.mark.slow
def test_crossover_script_runs(tmp_path):
    run_module("benchmarks.crossover", "--quick", tmp_path=tmp_path)
    report = json.loads((tmp_path / "crossover-quick.json").read_text())
    assert report["torch"] and all(row["sort ms"] > 0 and row["count ms"] > 0 for row in report["torch"])
    assert "count / sort" in (tmp_path / "crossover-quick.md").read_text()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton (its interpreter)")
def test_gpu_check_script_runs_in_the_interpreter(tmp_path):
    # The GPU session's checking script, at toy sizes in Triton's interpreter: its sections run, every path agrees
    # with the exact sums, and the sweep reaches both kernels.
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["environment"]["triton_available"]
    assert report["correctness"] and all(row["ok"] for row in report["correctness"])
    assert {row["path"] for row in report["correctness"]} == {"sort", "count", "triton"}
    assert report["timings"] and not any("error" in row for row in report["timings"])
    sweep = report["sweep"]
    assert sweep and not any("error" in row for row in sweep) and all(row["ms"] > 0 for row in sweep)
    assert any("tile" in row for row in sweep) and any("block_rows" in row for row in sweep)
    assert sum(row["default"] for row in sweep) == 2  # one default per case
    assert "## Triton tile sweep" in (tmp_path / "results.md").read_text()


@pytest.mark.skipif(importlib.util.find_spec("triton") is not None, reason="Triton is installed")
def test_gpu_check_without_triton_says_so_in_one_line(tmp_path):
    # Its own hint (--device cpu with TRITON_INTERPRET=1) had printed 59 tracebacks and "failures: 57" without Triton.
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-4000:]
    assert done.stderr.splitlines()[-1].startswith("gpu_check.py: error: Triton is not installed"), done.stderr
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("args, message", [
    (["benchmarks", "--quick", "--device", "cpu", "--repeats", "0"], "argument --repeats: expected a whole number >= 1"),
    (["benchmarks", "--quick", "--device", "cpu", "--tag", "a/b"], "--tag names the output files, not a folder"),
    (["benchmarks.floor_ratio", "--calls", "0"], "argument --calls: expected a whole number >= 1"),
    (["benchmarks.ties", "--repeats", "0"], "argument --repeats: expected a whole number >= 1"),
    (["benchmarks.ranking_metrics", "--sizes", "20x2"], "argument --sizes: '20x2' needs N >= 1 and C >= 3"),
    (["benchmarks.ltr_agreement", "--rounds", "0"], "argument --rounds: expected a whole number >= 1"),
    (["benchmarks.before_after", "--before", "/nonexistent", "--after", "."], "--before '/nonexistent' holds no"),
    (["benchmarks.before_after", "--before", ".", "--after", ".", "--size", "20"], "argument --size: cannot read '20'"),
    (["benchmarks.cli_speed", "--before", "/nonexistent"], "--before '/nonexistent' holds no torch_lwlrap checkout"),
])
def test_bad_benchmark_arguments_are_one_usage_line_before_any_timing(tmp_path, args, message):
    # Each had ended in a traceback (StatisticsError, FileNotFoundError, CalledProcessError), some after the timings.
    command = [sys.executable, "-m", *args] + ([] if "cli_speed" in args[0] else ["--out", str(tmp_path)])
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-4000:]
    assert message in done.stderr.splitlines()[-1], done.stderr
    assert not any(tmp_path.iterdir())


def test_generated_inputs_follow_their_description():
    preds, target = make_inputs(2000, 50, None)
    per_row = target.sum(1)
    assert per_row.min() == 1 and per_row.max() == 3 and abs(per_row.double().mean().item() - 2) < 0.1
    # distinct scores within each row: every tie rule gives the same value
    assert (preds.sort(1).values.diff(dim=1) > 0).all()
    assert multilabel_lwlrap(preds, target).item() == multilabel_lwlrap(preds, target, ties="index").item()
    assert 0.6 < multilabel_lwlrap(preds, target).item() < 0.85
    dense = make_inputs(2000, 50, 0.3)[1].double().mean().item()
    assert abs(dense - 0.3) < 0.01
    assert torch.equal(make_inputs(100, 20, None)[0], make_inputs(100, 20, None)[0])  # deterministic


def test_anchors_against_the_naive_formula():
    g = torch.Generator().manual_seed(5)
    preds = torch.rand(40, 9, generator=g)
    target = (torch.rand(40, 9, generator=g) < 0.3).long()
    target[:, 0] = 1  # at least one positive per row
    want = naive_lwlrap(preds.numpy(), target.numpy())
    p, t = preds.numpy(), target.numpy()
    assert anchors.sklearn_lwlrap(p, t) == pytest.approx(want, abs=1e-12)
    assert anchors.challenge_lwlrap(p, t) == pytest.approx(want, abs=1e-12)
    lrap = anchors.torchmetrics_lrap(preds, target)
    assert lrap == pytest.approx(
        float(np.mean([naive_lwlrap(preds[i : i + 1].numpy(), target[i : i + 1].numpy()) for i in range(40)])),
        abs=1e-5,
    )


def test_size_arguments_are_checked():
    with pytest.raises(ValueError, match=r"cannot read '20000by527'"):
        parse_sizes("20000by527")
    with pytest.raises(ValueError, match=r"needs N >= 1 and C >= 3"):
        parse_sizes("10x2")
    with pytest.raises(ValueError, match=r"density of '10x8:1.5' must be in \(0, 1\]"):
        parse_sizes("10x8:1.5")


@pytest.mark.slow
def test_latency_benchmark_runs_each_case_in_a_fresh_process(tmp_path):
    # A smoke run (no time asserted): every case reports its statistics, in order, and the table is written.
    # Two paths (each child process imports torch and the package: about 5 s), the library's and the sum-only one.
    run_module("benchmarks.latency", "--quick", "--loads", "idle", "--paths", "numba,sumonly", "--sizes", "32x80",
               tmp_path=tmp_path)
    report = json.loads((tmp_path / "latency.json").read_text())
    cases = {(r["path"], r["threading"], r["rows"], r["classes"], r["loop"]) for r in report["records"]}
    assert len(cases) == len(report["records"]) == 2 * 2 * 2  # paths, threadings, plain and loop
    for record in report["records"]:
        assert record["calls"] >= 5
        assert 0 < record["p50"] <= record["p90"] <= record["p99"]
        assert record["torch_threads"] == 1 if record["threading"] == "one" else record["torch_threads"] >= 1
    table = (tmp_path / "latency.md").read_text()
    assert "| 32 x 80 | numba |" in table and "## idle, loop" in table and "speed-up" in table
    assert "## overhead against a sum-only Metric" in table and "| idle | plain | 32 x 80 | numba | default |" in table
    spin = report["metadata"]["torch_spin_ms"]  # torch's threads' spin after the loop's matmul (None off Linux)
    assert spin is None or (spin >= 0 and "OMP_WAIT_POLICY unset: after the loop's matmul" in table)


@pytest.mark.slow
def test_latency_benchmark_times_an_earlier_tree_beside_this_one(tmp_path):
    # --before: the same cases from another source tree (here this one again), each child importing from its tree;
    # --call forward: each times metric(preds, target), as a training step calls it.
    # --omp-wait-policy: every child (and the spin measurement) under OMP_WAIT_POLICY=PASSIVE. The torch path (the
    # engine set in the child's environment), which the smoke run above leaves out.
    args = ["--quick", "--loads", "idle", "--paths", "torch", "--loops", "loop", "--sizes", "32x80", "--call", "forward",
            "--omp-wait-policy", "passive"]
    run_module("benchmarks.latency", *args, "--before", str(ROOT), tmp_path=tmp_path)
    report = json.loads((tmp_path / "latency.json").read_text())
    assert sorted(r["tree"] for r in report["records"]) == ["after", "after", "before", "before"]
    assert report["metadata"]["call"] == "forward" and {r["call"] for r in report["records"]} == {"forward"}
    table = (tmp_path / "latency.md").read_text()
    assert "before: default mean" in table and table.startswith("# forward latency")
    assert report["metadata"]["omp_wait_policy"] == "passive" and "OMP_WAIT_POLICY passive: after" in table


@pytest.mark.slow
def test_before_after_times_two_trees_side_by_side(tmp_path):
    # A smoke run (no time asserted): each case from both trees (here this one twice), each child importing its own.
    run_module("benchmarks.before_after", "--before", str(ROOT), "--after", str(ROOT), "--rounds", "1", "--calls", "2",
               "--size", "300x20", "--cases", "lwlrap", "bootstrap", "spearman", "distance", tmp_path=tmp_path)
    report = json.loads((tmp_path / "before_after.json").read_text())
    assert report["size"] == [300, 20]
    # A function and a metric against targets, two against a second system (each case: two processes).
    assert set(report["cases"]) == {"lwlrap", "bootstrap", "spearman", "distance"}
    for case in report["cases"].values():
        assert case["before_ms"] > 0 and case["after_ms"] > 0 and len(case["runs"]["before"]) == 1
    assert "| case (300 x 20) |" in (tmp_path / "before_after.md").read_text()


def test_ties_benchmark_writes_its_tables(tmp_path):
    # A smoke run (no time asserted): every case and entry is timed, and the tied share is the report's.
    # A name with a dot keeps it: the suffixes are added to it, not put in place of its end.
    run_module("benchmarks.ties", "--samples", "60", "--classes", "12", "--repeats", "2", "--name", "ties_0.5",
               tmp_path=tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ties_0.5.json", "ties_0.5.md"]
    report = json.loads((tmp_path / "ties_0.5.json").read_text())
    assert [case["tied_share"] for case in report["cases"]][::3] == [0.0, 1.0]  # continuous scores; all zero
    for case in report["cases"]:
        assert set(case["seconds"]) == {"max", "expected", "tie_report"} and min(case["seconds"].values()) > 0
    assert "| expected / max |" in (tmp_path / "ties_0.5.md").read_text()


def test_ranking_metrics_benchmark_writes_its_table(tmp_path):
    # A smoke run (no time asserted); its --out is a folder, as every benchmark's is, and --name names the files, as
    # the command of the committed one-thread table does.
    run_module("benchmarks.ranking_metrics", "--sizes", "200x20", "--min-run-time", "0.02", "--no-anchors",
               "--threads", "1", "--name", "ranking_metrics_1thread", tmp_path=tmp_path)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ranking_metrics_1thread.json",
                                                                "ranking_metrics_1thread.md"]
    report = json.loads((tmp_path / "ranking_metrics_1thread.json").read_text())
    assert report["machine"] and report["cases"] and "| the six metric objects, one pass each |" in (
        tmp_path / "ranking_metrics_1thread.md").read_text()


def test_a_name_that_is_a_folder_is_one_usage_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "benchmarks.latency", "--out", str(tmp_path), "--name", "a/b"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "not a folder (use --out for that): 'a/b'" in done.stderr
    assert not any(tmp_path.iterdir())


def test_the_sweep_keeps_the_cases_it_finished_when_a_later_one_fails(tmp_path, monkeypatch):
    # A GPU session's sweep killed by its time limit, or crashing in a later case, must not lose the earlier cases.
    from benchmarks import run

    real, calls = run.run_case, []

    def second_case_fails(case, args, bandwidth):
        calls.append(case)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(case, args, bandwidth)

    monkeypatch.setattr(run, "run_case", second_case_fails)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        run.main(["--device", "cpu", "--quick", "--memory", "none", "--sizes", "40x8,50x8", "--tag", "part",
                  "--out", str(tmp_path)])
    report = json.loads((tmp_path / "part.json").read_text())
    assert [case["case"] for case in report["cases"]] == [calls[0].name] and report["cases_done"] == "1 of 2"
    table = (tmp_path / "part.md").read_text()
    assert "cases measured: 1 of 2" in table and f"## {calls[0].name}" in table


def test_floor_ratio_benchmark_writes_its_table(tmp_path):
    # A smoke run (no time asserted): both medians, their ratio, and the table.
    run_module("benchmarks.floor_ratio", "--samples", "300", "--classes", "20", "--calls", "5", tmp_path=tmp_path)
    report = json.loads((tmp_path / "floor_ratio.json").read_text())
    assert (report["num_samples"], report["num_classes"], report["calls"]) == (300, 20, 5)
    assert report["floor_seconds"] > 0 and report["ratio"] == report["lwlrap_seconds"] / report["floor_seconds"]
    assert "| floor (one read) |" in (tmp_path / "floor_ratio.md").read_text()


OUTPUT_NAMES = {  # each script's default name for its tables (the sweep's --tag comes from --quick and --device)
    "benchmarks.run": None, "benchmarks.crossover": None, "benchmarks.bootstrap": None,
    "benchmarks.latency": "latency", "benchmarks.ties": "ties", "benchmarks.floor_ratio": "floor_ratio",
    "benchmarks.before_after": "before_after", "benchmarks.ltr_agreement": "ltr_agreement",
    "benchmarks.ranking_metrics": "ranking_metrics",
}


def test_every_benchmark_script_is_listed_for_its_output_folder():
    scripts = {f"benchmarks.{path.stem}" for path in (ROOT / "benchmarks").glob("*.py")}
    # anchors: no tables; cli_speed: --json; gpu_check: its own folder; triton_aot: a compile check; __main__: run
    assert scripts - set(OUTPUT_NAMES) == {"benchmarks.anchors", "benchmarks.cli_speed", "benchmarks.gpu_check",
                                           "benchmarks.triton_aot", "benchmarks.__main__", "benchmarks.__init__"}


@pytest.mark.parametrize("module", sorted(OUTPUT_NAMES))
def test_default_output_is_a_git_ignored_scratch_folder(module, monkeypatch):
    # Without --out a run must never overwrite the committed results in benchmarks/results.
    import argparse
    import importlib

    from benchmarks.run import RESULTS_DIR, SCRATCH_DIR

    seen = {}
    parse_args = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        parsed = parse_args(self, args, namespace)
        seen["out"], seen["name"] = parsed.out, getattr(parsed, "name", parsed.tag if hasattr(parsed, "tag") else "?")
        raise SystemExit(0)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    with pytest.raises(SystemExit):
        required = ["--before", str(ROOT), "--after", str(ROOT)] if module == "benchmarks.before_after" else []
        importlib.import_module(module).main(required)
    assert seen["out"] == SCRATCH_DIR != RESULTS_DIR
    assert seen["name"] == OUTPUT_NAMES[module]
    if (ROOT / ".git").exists():
        ignored = subprocess.run(["git", "check-ignore", "-q", str(SCRATCH_DIR / "cpu.json")], cwd=ROOT)
        assert ignored.returncode == 0, f"{SCRATCH_DIR} is not git-ignored"
        tracked = subprocess.run(["git", "ls-files", str(RESULTS_DIR)], cwd=ROOT, capture_output=True, text=True)
        assert "cpu.json" in tracked.stdout  # the committed results stay where README and RESULTS.md link


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: the session would run in full")
def test_the_gpu_session_stops_at_once_without_a_gpu(tmp_path):
    """Without a CUDA GPU the session says so in one line and exits 5 (not 3, the sweep's failure), before the doctor
    or the suite run and before it writes anything; so does a STEPS entry that names no step."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = os.path.join(repo, "benchmarks", "gpu_session.sh")
    # the script's python3 is this test's (its torch), as in the venv that runs the session
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    environment = dict(os.environ, OUT=str(tmp_path / "out"), PATH=path)
    done = subprocess.run(["bash", script], capture_output=True, text=True, timeout=120,
                          env=environment)
    assert done.returncode == 5 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no CUDA GPU that torch can use here" in done.stderr
    assert not (tmp_path / "out").exists()
    done = subprocess.run(["bash", script], capture_output=True, text=True, timeout=120,
                          env=dict(environment, STEPS="2,3"))
    assert done.returncode == 5 and "names no step '2,3'" in done.stderr and not (tmp_path / "out").exists()
