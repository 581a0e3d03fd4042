"""Without numba (the ``cpu`` extra not installed): every module imports, and every tie rule, the tie report and its
metric run on the torch paths with the same values as with it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.reference import naive_lwlrap
from torch_lwlrap import tie_report

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import importlib, json, sys
sys.modules["numba"] = None  # `import numba` now raises ImportError, as where it is not installed
from pathlib import Path
root = Path(sys.argv[1])
for path in sorted((root / "torch_lwlrap").rglob("*.py")):
    parts = path.relative_to(root).with_suffix("").parts
    importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
import torch
from torch_lwlrap import MultilabelTieReport, multilabel_lwlrap, tie_report
from torch_lwlrap._ranking import get_engine, takes_numba_path
assert not takes_numba_path(torch.device("cpu"), torch.float32)
generator = torch.Generator().manual_seed(3)
preds = torch.randint(4, (50, 9), generator=generator).float()
target = torch.randint(2, (50, 9), generator=generator)
target[torch.rand(50, 9, generator=generator) < 0.2] = -1
metric = MultilabelTieReport(9, ignore_index=-1)
metric.update(preds[:20], target[:20])
metric.update(preds[20:], target[20:])
values = {rule: multilabel_lwlrap(preds, target, ties=rule, ignore_index=-1).item() for rule in ("max", "expected")}
print(json.dumps({"values": values, "report": tie_report(preds, target, ignore_index=-1).as_dict(),
                  "metric": metric.report().as_dict()}))
"""


def test_every_module_imports_and_the_tie_rules_run_without_numba():
    done = subprocess.run([sys.executable, "-c", CHILD, str(ROOT)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    generator = torch.Generator().manual_seed(3)
    preds = torch.randint(4, (50, 9), generator=generator).float()
    target = torch.randint(2, (50, 9), generator=generator)
    target[torch.rand(50, 9, generator=generator) < 0.2] = -1
    rows, labels = preds.tolist(), target.tolist()
    for rule in ("max", "expected"):
        assert abs(got["values"][rule] - naive_lwlrap(rows, labels, rule, -1)) <= 1e-12
    here = tie_report(preds, target, ignore_index=-1).as_dict()  # with numba where it is installed
    for report in (got["report"], got["metric"]):
        assert report["label_count"] == here["label_count"] and report["tied_label_count"] == here["tied_label_count"]
        for key in ("lwlrap_max", "lwlrap_expected", "lwlrap_best", "lwlrap_worst"):
            assert abs(report[key] - here[key]) <= 1e-12, key


# numba installed but its threads cannot start (NUMBA_THREADING_LAYER=tbb without tbb): numba's launch is made to
# fail as it does there, so the test does not hang on what this machine has installed.
THREADS_CHILD = r"""
import json, sys, warnings
from numba.np.ufunc import parallel
def launch(*args, **kwargs):
    raise ValueError("No threading layer could be loaded. HINT: Intel TBB is required")
parallel._launch_threads = launch
import torch
torch.set_num_threads(2)  # threads asked for on any machine (NUMBA_NUM_THREADS=2 in the environment too)
import torch_lwlrap as tl
from torch_lwlrap import _numba_runtime
generator = torch.Generator().manual_seed(5)
preds = torch.randn(1500, 700, generator=generator)  # past the size at which the kernels take threads
target = (torch.rand(1500, 700, generator=generator) < 0.01).long()
reference = preds[:, torch.randperm(700, generator=generator)] + 0.1 * preds
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    got = {"lwlrap": tl.multilabel_lwlrap(preds, target).item(),
           "kendall": tl.multilabel_rank_correlation(preds, reference, method="kendall").item()}
    again = tl.multilabel_lwlrap(preds, target).item()
with tl.use_engine("sort"):
    expected = {"lwlrap": tl.multilabel_lwlrap(preds, target).item(),
                "kendall": tl.multilabel_rank_correlation(preds, reference, method="kendall").item()}
print(json.dumps({"got": got, "again": again, "expected": expected, "failure": _numba_runtime.threads_failure,
                  "warnings": [(w.category.__name__, str(w.message), w.filename) for w in seen]}))
"""


def test_numba_threads_that_cannot_start_fall_back_to_one_thread_with_one_warning():
    env = {**os.environ, "NUMBA_NUM_THREADS": "2"}
    done = subprocess.run([sys.executable, "-c", THREADS_CHILD], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["failure"] is not None, "the kernels never asked for threads"
    for name, value in result["expected"].items():
        assert abs(result["got"][name] - value) <= 1e-12, name
    assert result["again"] == result["got"]["lwlrap"]
    assert "No threading layer could be loaded" in result["failure"]
    (category, message, filename), = result["warnings"]  # once, not at every call
    assert category == "RuntimeWarning" and filename == "<string>"  # at the user's line
    assert "numba's threads could not start" in message and "NUMBA_THREADING_LAYER" in message


def test_a_numba_that_fails_at_import_leaves_the_command_line_and_the_doctor_working(tmp_path):
    """``NUMBA_NUM_THREADS=0`` makes ``import numba`` raise ValueError (not ImportError): the library takes the torch
    paths, and the command line's compile notice and the doctor had crashed on it."""
    truth, pred = ROOT / "examples" / "data" / "sample_truth.csv", ROOT / "examples" / "data" / "sample_submission.csv"
    env = {**os.environ, "NUMBA_NUM_THREADS": "0"}
    command = [sys.executable, "-m", "torch_lwlrap"]
    broken = subprocess.run([*command, "score", str(truth), str(pred), "--json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert broken.returncode == 0 and "Traceback" not in broken.stderr, broken.stderr[-3000:]
    working = subprocess.run([*command, "score", str(truth), str(pred), "--json"], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
    assert json.loads(broken.stdout)["lwlrap"] == json.loads(working.stdout)["lwlrap"]
    doctor = subprocess.run([*command, "doctor", "--json", "--no-timing"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=600)
    assert doctor.returncode == 0, doctor.stderr[-3000:]
    report = json.loads(doctor.stdout)
    assert report["versions"]["numba"].startswith("fails to import (ValueError"), report["versions"]
    assert all(check["path"] != "numba" for check in report["checks"])
