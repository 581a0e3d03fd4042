"""The Lightning example: the values it logs per validation epoch equal one computation over the whole set.

The example runs as a subprocess (Lightning's own warnings stay out of this process, where warnings are errors)
and writes, with ``--out``, the logged values and the validation predictions and targets of every epoch,
gathered from all processes. Each logged value is recomputed from them in one piece with the library's functions
and with scikit-learn (lwlrap = LRAP with each sample weighted by its number of positives).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("lightning")
sklearn_metrics = pytest.importorskip("sklearn.metrics")

from torch_lwlrap import multilabel_lrap, multilabel_lwlrap  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lightning_tagging.py"
NUM_CLASSES = 20


def _run_example(tmp_path: Path, *args: str, show_warnings: bool = False) -> dict:
    out = tmp_path / "run.json"
    command = [sys.executable, str(EXAMPLE), "--quiet", "--epochs", "2", "--num-train", "256", "--out", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    if show_warnings:  # Python's default filters, as a user runs it
        env.pop("PYTHONWARNINGS")
    result = subprocess.run(command + list(args), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"example failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
    assert "recomputed over all gathered predictions" in result.stdout, result.stdout
    assert out.exists(), f"example wrote no {out.name}:\n{result.stdout}\n{result.stderr}"
    run = json.loads(out.read_text())
    run["stdout"], run["stderr"] = result.stdout, result.stderr
    return run


def _check_logged_values(run: dict, num_val: int) -> None:
    epochs = run["epochs"]
    assert [record["epoch"] for record in epochs] == [0, 1]
    for record in epochs:
        preds = torch.tensor(record["preds"], dtype=torch.float64)
        target = torch.tensor(record["target"], dtype=torch.float64)
        # every validation sample exactly once: no padding duplicates from a distributed sampler
        assert preds.shape == target.shape == (num_val, NUM_CLASSES)
        assert len({tuple(row) for row in record["preds"]}) == num_val
        positives = target.sum(dim=1)
        assert ((positives >= 1) & (positives <= 3)).all()

        lwlrap, lrap = record["val_lwlrap"], record["val_lrap"]
        # the example's own recomputation over the gathered predictions, as it prints it
        assert record["num_gathered"] == num_val
        assert record["recomputed_lwlrap"] == pytest.approx(lwlrap, rel=1e-12)
        assert record["recomputed_lrap"] == pytest.approx(lrap, rel=1e-12)
        assert lwlrap == pytest.approx(multilabel_lwlrap(preds, target).item(), abs=1e-12)
        assert lrap == pytest.approx(multilabel_lrap(preds, target).item(), abs=1e-12)

        y_true, y_score = target.numpy().astype(np.int64), preds.numpy()
        sk_lrap = sklearn_metrics.label_ranking_average_precision_score(y_true, y_score)
        sk_lwlrap = sklearn_metrics.label_ranking_average_precision_score(
            y_true, y_score, sample_weight=y_true.sum(axis=1)
        )
        assert lwlrap == pytest.approx(sk_lwlrap, abs=1e-12)
        assert lrap == pytest.approx(sk_lrap, abs=1e-12)
    # the model trains: predictions change between the epochs
    assert epochs[0]["preds"] != epochs[1]["preds"]


@pytest.mark.slow
def test_ddp_two_cpu_processes_log_the_whole_set_value(tmp_path):
    # 203 samples: uneven shards (102 + 101) and a partial last batch on each process
    # 70 training clips: 35 a process, 2 batches of 32 an epoch; one process would take 3 (70 / 32, rounded up)
    args = ["--accelerator", "cpu", "--devices", "2", "--strategy", "ddp", "--num-val", "203", "--batch-size", "32",
            "--num-train", "70"]
    run = _run_example(tmp_path, *args)
    assert run["config"]["world_size"] == 2
    _check_logged_values(run, num_val=203)
    assert "4 optimizer steps, where one process takes 6." in run["stdout"], run["stdout"]


@pytest.mark.slow
def test_single_device_run(tmp_path):
    run = _run_example(tmp_path, "--accelerator", "cpu", "--devices", "1", "--num-val", "150", "--batch-size", "16",
                       show_warnings=True)
    assert run["config"]["world_size"] == 1
    # --quiet: Lightning's use of torch's deprecated LeafSpec (a FutureWarning at each step on newer torch) is not
    # shown, nor is any warning of this package
    assert "LeafSpec" not in run["stderr"] and "torch_lwlrap" not in run["stderr"], run["stderr"]
    _check_logged_values(run, num_val=150)


def _example_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lightning_tagging", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "args, message",
    [
        (["--strategy", "ddp_spawn", "--devices", "2"], "--strategy ddp_spawn trains in child processes"),
        (["--strategy", "ddp_fork"], "use --strategy ddp"),
        (["--devices", "0,1"], "argument --devices: expected a number of devices (processes) or \"auto\", but got '0,1'"),
        (["--epochs", "0"], "argument --epochs: expected a whole number of 1 or more, but got '0'"),
        (["--num-val", "-3"], "argument --num-val: expected a whole number of 1 or more"),
        (["--devices", "3", "--num-val", "2"], "--num-val 2 leaves a process of 3 without a sample: give at least 3"),
        (["--out", "{tmp}"], "is a folder: name a file in it"),
        (["--out", "{tmp}/missing/run.json"], "missing does not exist"),
    ],
)
def test_the_example_refuses_what_it_cannot_run_before_training(tmp_path, capsys, args, message):
    """Options that would train and then print or write nothing (a strategy whose child processes keep the records,
    an --out that cannot be written), or fail inside Lightning: one argparse line, before any training."""
    module = _example_module()
    with pytest.raises(SystemExit) as info:
        module.parse_args([arg.format(tmp=tmp_path) for arg in args])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


def test_the_example_takes_its_documented_options(tmp_path):
    args = _example_module().parse_args(["--devices", "auto", "--strategy", "ddp", "--out", str(tmp_path / "a.json")])
    assert args.devices == "auto" and args.strategy == "ddp" and args.epochs == 2
    assert _example_module().parse_args([]).devices == 1
