"""Without numba (the ``cpu`` extra not installed): every module imports, and every tie rule, the tie report and its
metric run on the torch paths with the same values as with it."""

from __future__ import annotations

import json
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
