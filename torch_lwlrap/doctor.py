"""``torch-lwlrap doctor``: a self-check of this installation, to run when something looks wrong.

It prints the versions that matter (Python, torch, torchmetrics, numpy, numba, Triton, CUDA, the driver, each
GPU's name and compute capability) and, for every device present (the CPU, each CUDA GPU) and every score dtype:

* the path ``"auto"`` takes there (:mod:`torch_lwlrap._ranking`);
* whether lwlrap (per class and weighted) and LRAP agree with a naive reference written here from the formulas,
  on random batches full of ties, with and without ``ignore_index``, under every tie rule of
  :data:`torch_lwlrap._checks.TIES` (relative tolerance 1e-12);
* the time of the first call (the compile of the kernels it takes, numba's or Triton's JIT, or their load from
  numba's disk cache), and the steady-state time and rows/s at a realistic
  size (20,000 x 527 on the CPU, 1,000,000 x 527 on a GPU) next to the time of one read of the same inputs.

The exit status is 1 if any value disagrees, else 0. ``--json`` prints one object instead of the tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np
import torch

#: Score dtypes checked on every device.
DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

#: Relative tolerance of the agreement with the reference: sums of float64 precisions in another order.
RTOL = 1e-12

#: Steady-state sizes ``(N, C)`` per device type.
TIMING_SIZES = {"cpu": (20_000, 527), "cuda": (1_000_000, 527)}

#: Positive labels per row of the timing inputs, on average.
TIMING_POSITIVES = 2

#: Value of ``ignore_index`` in the agreement batches.
IGNORE = -1


# ---------------------------------------------------------------------------------------------------------------
# The naive reference: one row at a time, from the definitions in the README (independent of the engine).


def _precision_max(above: np.ndarray, above_pos: np.ndarray, group: np.ndarray, group_pos: np.ndarray, before,
                   before_pos) -> np.ndarray:
    # rank: every label scored >= this one; L: the same over positives
    return (above_pos + group_pos) / (above + group)


def _precision_index(above, above_pos, group, group_pos, before, before_pos) -> np.ndarray:
    # a strict order, tied labels by column: only the tied labels at or left of this one come first
    return (above_pos + before_pos) / (above + before)


def _precision_expected(above, above_pos, group, group_pos, before, before_pos) -> np.ndarray:
    # the mean precision over uniformly random orders of the tied labels: the label takes place K of its group
    # with probability 1/g, and the other p - 1 positives of the group fill the K - 1 places above it pro rata
    out = np.empty(len(above), dtype=np.float64)
    for i, (a, a_p, g, p) in enumerate(zip(above, above_pos, group, group_pos)):
        if g == 1:
            out[i] = (a_p + 1) / (a + 1)
            continue
        k = np.arange(1, g + 1, dtype=np.float64)
        out[i] = np.sum((a_p + 1 + (k - 1) * (p - 1) / (g - 1)) / (a + k)) / g
    return out


#: Reference precision of a positive label per tie rule, from the counts of its row: labels (and positives)
#: scored strictly higher, tied with it (itself included), and tied at or left of its column.
REFERENCE_PRECISION: Dict[str, Callable[..., np.ndarray]] = {
    "max": _precision_max,
    "index": _precision_index,
    "expected": _precision_expected,
}


def reference_values(scores: np.ndarray, target: np.ndarray, ties: str, ignore_index: Optional[int]) -> Dict:
    """Per-class lwlrap, weighted lwlrap and LRAP of a batch, a row at a time (``scores`` float64 ``(N, C)``)."""
    num_samples, num_classes = scores.shape
    class_sum = np.zeros(num_classes)
    class_count = np.zeros(num_classes, dtype=np.int64)
    sample_scores = []
    precision_of = REFERENCE_PRECISION[ties]
    for row in range(num_samples):
        known = np.ones(num_classes, bool) if ignore_index is None else target[row] != ignore_index
        columns = np.flatnonzero(known)
        s = scores[row, columns]
        pos = target[row, columns] == 1
        if not pos.any():
            sample_scores.append(1.0)
            continue
        higher = s[None, :] > s[:, None]  # [j, k]: label k scores above label j
        tied = s[None, :] == s[:, None]
        left = tied & np.tri(len(s), dtype=bool)  # tied and at or left of j
        counts = [m.sum(1) for m in (higher, higher & pos, tied, tied & pos, left, left & pos)]
        precision = precision_of(*[c[pos] for c in counts])
        np.add.at(class_sum, columns[pos], precision)
        class_count[columns[pos]] += 1
        sample_scores.append(1.0 if pos.all() else float(precision.mean()))
    with np.errstate(invalid="ignore", divide="ignore"):
        per_class = class_sum / class_count
    return {
        "lwlrap per class": per_class,
        "lwlrap": np.array(class_sum.sum() / class_count.sum()),
        "lrap": np.array(np.mean(sample_scores)),
    }


def library_values(preds: torch.Tensor, target: torch.Tensor, ties: str, ignore_index: Optional[int]) -> Dict:
    from torch_lwlrap import functional

    kwargs = {"ties": ties, "ignore_index": ignore_index}
    return {
        "lwlrap per class": functional.multilabel_lwlrap(preds, target, average="none", **kwargs),
        "lwlrap": functional.multilabel_lwlrap(preds, target, **kwargs),
        "lrap": functional.multilabel_lrap(preds, target, **kwargs),
    }


def tie_heavy_batches(seed: int = 0) -> List[np.ndarray]:
    """Scores ``k/4`` (exact in every dtype) with a few ``+-inf``, and 0/1/``IGNORE`` targets, in three shapes:
    few classes, a typical row, and rows with more positives than the numba path counts one by one (it sorts those).
    """
    rng = np.random.default_rng(seed)
    batches = []
    for num_samples, num_classes, density in ((64, 7, 0.4), (48, 80, 0.1), (4, 1600, 0.95)):
        scores = rng.integers(0, 5, (num_samples, num_classes)) / 4.0
        scores[rng.random(scores.shape) < 0.02] = np.inf
        scores[rng.random(scores.shape) < 0.02] = -np.inf
        scores[0] = 0.5  # a row of one tie group
        target = (rng.random((num_samples, num_classes)) < density).astype(np.int64)
        target[1] = 0  # a row without positive
        target[rng.random(target.shape) < 0.15] = IGNORE
        target[:, 0] = 1  # every batch has positives
        batches.append((scores, target))
    return batches


def _agree(got: torch.Tensor, expected: np.ndarray) -> bool:
    got = got.detach().cpu().double().numpy()
    return got.shape == expected.shape and bool(np.allclose(got, expected, rtol=RTOL, atol=0, equal_nan=True))


# ---------------------------------------------------------------------------------------------------------------
# Versions and devices


def _version(module: str) -> Optional[str]:
    """The installed version of ``module``; None where it is not installed; what fails where it fails to import."""
    try:
        return __import__(module).__version__
    except ImportError:
        return None
    except Exception as err:  # installed but broken (NUMBA_NUM_THREADS=0 fails numba's import): the library skips it
        return f"fails to import ({type(err).__name__}: {' '.join(str(err).split())}): not used"


def _driver_version() -> Optional[str]:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def versions() -> Dict[str, Any]:
    import torch_lwlrap

    cuda = torch.cuda.is_available()
    return {
        "torch_lwlrap": torch_lwlrap.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torchmetrics": _version("torchmetrics"),
        "numpy": np.__version__,
        "numba": _version("numba"),
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "driver": _driver_version() if cuda else None,
        "torch threads": torch.get_num_threads(),
        **_numba_settings(),
        "engine": _engine_setting(),
        "gpus": [
            {
                "device": f"cuda:{i}",
                "name": torch.cuda.get_device_name(i),
                "capability": "%d.%d" % torch.cuda.get_device_capability(i),
            }
            for i in range(torch.cuda.device_count() if cuda else 0)
        ],
    }


def _numba_settings() -> Dict[str, Any]:
    """numba's thread count in this thread (its own set_num_threads, else NUMBA_NUM_THREADS) and the threading
    layer it started (or why its threads cannot start); and that its compiler is off, where NUMBA_DISABLE_JIT=1 is
    set."""
    try:
        import numba
    except Exception:  # not installed or broken: the versions say which
        return {}
    try:
        out: Dict[str, Any] = {"numba threads": f"{numba.get_num_threads()} (layer: {numba.threading_layer()})"}
    except Exception as err:  # a threading layer that cannot load: the library runs the serial kernels
        reason = " ".join(str(err).split())
        out = {"numba threads": f"1: its threads cannot start ({type(err).__name__}: {reason}); the CPU kernels run "
                                f"on one thread"}
    if numba.config.DISABLE_JIT:
        out["numba compiler"] = "off (NUMBA_DISABLE_JIT=1): the torch paths rank on the CPU"
    return out


def _engine_setting() -> str:
    """The engine every call takes here: ``auto``, or the one ``TORCH_LWLRAP_ENGINE`` forces."""
    from torch_lwlrap._engine_config import ENGINE_VARIABLE, engine_forced_by_block, get_engine

    engine = get_engine()
    source = "a use_engine block" if engine_forced_by_block() else ENGINE_VARIABLE
    return "auto" if engine == "auto" else f"{engine} (forced by {source})"


def devices() -> List[torch.device]:
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return found


def auto_path(device: torch.device, dtype: torch.dtype, num_samples: int, num_classes: int, positives: int) -> str:
    """The path the engine in use (``"auto"``, or the one ``TORCH_LWLRAP_ENGINE`` forces) takes for a batch of these
    sizes: a compiled one, else the torch path it picks."""
    from torch_lwlrap import _dispatch
    from torch_lwlrap._engine_config import get_engine

    engine = get_engine()
    name = _dispatch.ranking_backend(device, dtype, engine)
    if name is not None:
        return name
    return _dispatch.torch_path(engine, device, num_samples, num_classes, torch.tensor([positives]))


# ---------------------------------------------------------------------------------------------------------------
# Timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], Any], device: torch.device, min_time: float = 0.25, max_calls: int = 50) -> float:
    fn()  # warm-up
    times: List[float] = []
    while len(times) < 3 or (sum(times) < min_time and len(times) < max_calls):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _read_inputs(preds: torch.Tensor, target: torch.Tensor):
    """One read of every input byte (the bool target as 8-byte words): the floor the timings are compared to."""
    flat = target.reshape(-1).view(torch.uint8)
    words = flat[: flat.numel() // 8 * 8].view(torch.int64)
    return preds.sum(), words.sum() + flat[flat.numel() // 8 * 8 :].sum()


def _read_floor(preds: torch.Tensor, target: torch.Tensor, device: torch.device) -> float:
    """The median time of :func:`_read_inputs`: on the CPU the faster of torch's threads and one thread, since a
    parallel torch reduction on cores that other processes hold can take several times one thread's time, and the
    floor is what reading the inputs can cost, not what one way of reading them costs on a busy machine."""
    floor = _median_time(lambda: _read_inputs(preds, target), device)
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        return floor
    torch.set_num_threads(1)
    try:
        return min(floor, _median_time(lambda: _read_inputs(preds, target), device))
    finally:
        torch.set_num_threads(threads)


def timing_inputs(device: torch.device, dtype: torch.dtype, num_samples: int, num_classes: int):
    """Random scores drawn in ``dtype`` and a bool target with 2 labels per row on average (:data:`TIMING_POSITIVES`),
    drawn a block of rows at a time: no float copy of the whole batch beside them (1,000,000 x 527 on a GPU)."""
    generator = torch.Generator(device=device).manual_seed(0)
    preds = torch.rand(num_samples, num_classes, generator=generator, device=device, dtype=dtype)
    target = torch.empty(num_samples, num_classes, dtype=torch.bool, device=device)
    for start in range(0, num_samples, 1 << 16):
        block = target[start : start + (1 << 16)]
        torch.lt(torch.rand(block.shape, generator=generator, device=device), TIMING_POSITIVES / num_classes, out=block)
    return preds, target


# ---------------------------------------------------------------------------------------------------------------
# The check


def check_device_dtype(device: torch.device, dtype: torch.dtype, timing: bool = True) -> Dict[str, Any]:
    from torch_lwlrap._checks import TIES
    from torch_lwlrap.functional import multilabel_lwlrap

    batches = tie_heavy_batches()
    rules = [rule for rule in TIES if rule in REFERENCE_PRECISION]
    record: Dict[str, Any] = {
        "device": str(device),
        "dtype": str(dtype).replace("torch.", ""),
        "ties": rules,
        "unchecked ties": [rule for rule in TIES if rule not in REFERENCE_PRECISION],
        "failures": [],
        "errors": [],
    }
    cases = 0
    first = True
    for index, (scores, target) in enumerate(batches):
        preds = torch.from_numpy(scores).to(dtype).to(device)
        exact = preds.double().cpu().numpy()  # the scores as the dtype holds them (k/4 and inf are exact)
        for ignore_index in (None, IGNORE):
            labels = target if ignore_index is not None else np.where(target == IGNORE, 0, target)
            target_t = torch.from_numpy(labels).to(device)
            for ties in rules:
                cases += 1
                where = f"batch {index} {tuple(scores.shape)}, ties={ties!r}, ignore_index={ignore_index}"
                try:
                    start = time.perf_counter()
                    got = library_values(preds, target_t, ties, ignore_index)
                    _sync(device)
                    if first:
                        record["first call s"] = time.perf_counter() - start
                        first = False
                except Exception as err:  # reported, and counted as a disagreement
                    record["errors"].append(f"{where}: {type(err).__name__}: {err}")
                    continue
                expected = reference_values(exact, labels, ties, ignore_index)
                for name, value in expected.items():
                    if not _agree(got[name], value):
                        record["failures"].append(f"{where}: {name} {got[name].tolist()} != reference {value.tolist()}")
    record["cases"] = cases
    record["agrees"] = not record["failures"] and not record["errors"]
    num_samples, num_classes = TIMING_SIZES["cuda" if device.type == "cuda" else "cpu"]
    # The path of the timing inputs, from their expected positives: no inputs are made without timings.
    record["path"] = auto_path(device, dtype, num_samples, num_classes, TIMING_POSITIVES * num_samples)
    record["size"] = [num_samples, num_classes]
    if timing:
        try:  # an allocation that fails here is reported in the record, not raised: the report above it stands
            preds, target = timing_inputs(device, dtype, num_samples, num_classes)
            steady = _median_time(lambda: multilabel_lwlrap(preds, target), device)
            floor = _read_floor(preds, target, device)
        except Exception as err:  # noqa: BLE001 - reported, as the value checks' errors are
            record["errors"].append(f"timing at {num_samples} x {num_classes}: {type(err).__name__}: {err}")
            record["agrees"] = False
        else:
            record.update({"steady s": steady, "rows/s": num_samples / steady, "read floor s": floor,
                           "x floor": steady / floor})
    return record


def run_checks(
    timing: bool = True,
    on_check: Optional[Callable[[Dict[str, Any]], None]] = None,
    info: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """Every check, device by device and dtype by dtype; ``on_check`` is called with each as soon as it is done.
    ``info``: the :func:`versions` when they are already known."""
    info = versions() if info is None else info
    checks = []
    for device in devices():
        for dtype in DTYPES:
            checks.append(check_device_dtype(device, dtype, timing))
            if on_check is not None:
                on_check(checks[-1])
    return {"versions": info, "checks": checks, "ok": all(check["agrees"] for check in checks)}


# ---------------------------------------------------------------------------------------------------------------
# Output


def _seconds(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1e3:.1f} ms"


def _rate(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value / 1e6:.2f} M" if value >= 1e6 else f"{value / 1e3:.1f} k"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows)]
    return ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip() for row in (header, *rows)]


def _version_lines(info: Dict[str, Any]) -> List[str]:
    absent = {"cuda": "none (a CPU build of torch)", "driver": "none (no CUDA GPU)"}
    rows = [
        [name, absent.get(name, "not installed") if value is None else str(value)]
        for name, value in info.items()
        if name != "gpus"
    ]
    rows += [[gpu["device"], f"{gpu['name']} (compute capability {gpu['capability']})"] for gpu in info["gpus"]]
    return ["torch-lwlrap doctor", ""] + _table(["component", "version"], rows) + [""]


#: The columns of the checks table and their widths, fixed so that each row can be printed as soon as it is
#: measured (a longer cell pushes the rest of its row to the right).
_CHECK_COLUMNS = (("device", 6), ("dtype", 8), ("path", 9), ("agrees (cases)", 14), ("first call", 10),
                  ("size", 15), ("steady", 8), ("rows/s", 7), ("read floor", 10), ("x floor", 7))


def _check_line(cells: Sequence[str]) -> str:
    return "  ".join(str(cell).ljust(width) for cell, (_, width) in zip(cells, _CHECK_COLUMNS)).rstrip()


def _check_row(check: Dict[str, Any]) -> str:
    n, c = check["size"]
    return _check_line([
        check["device"], check["dtype"], check["path"],
        f"yes ({check['cases']})" if check["agrees"] else "NO",
        _seconds(check.get("first call s")), f"{n:,} x {c}", _seconds(check.get("steady s")),
        _rate(check.get("rows/s")), _seconds(check.get("read floor s")),
        f"{check['x floor']:.1f}" if "x floor" in check else "-",
    ])


_CHECK_HEADER = _check_line([name for name, _ in _CHECK_COLUMNS])


def _closing_lines(report: Dict[str, Any]) -> List[str]:
    lines = []
    rules = report["checks"][0]["ties"] if report["checks"] else []
    lines += ["", f"agreement: lwlrap per class, weighted lwlrap and LRAP against a naive reference (relative "
              f"{RTOL:g}) on tie-heavy batches, with and without ignore_index, ties {', '.join(rules)}"]
    timed = any("steady s" in check for check in report["checks"])
    lines.append("path: the one multilabel_lwlrap takes for a batch of the size shown; first call: the first value "
                 "check, with any compile or cache load; " + (
                     "steady: the median time at that size, x floor: that over one read of its inputs" if timed
                     else "no timings at that size (--no-timing)"))
    unchecked = report["checks"][0]["unchecked ties"] if report["checks"] else []
    if unchecked:
        lines.append(f"tie rules without a reference here, not checked: {', '.join(unchecked)}")
    for check in report["checks"]:
        for problem in check["errors"] + check["failures"]:
            lines.append(f"DISAGREEMENT on {check['device']} {check['dtype']}: {problem}")
    lines.append("")
    lines.append("all values agree" if report["ok"] else "SOME VALUES DISAGREE: please paste this output into an issue")
    return lines


def format_report(report: Dict[str, Any]) -> str:
    """The report as :func:`run` prints it, a line at a time."""
    lines = _version_lines(report["versions"]) + [_CHECK_HEADER]
    lines += [_check_row(check) for check in report["checks"]]
    return "\n".join(lines + _closing_lines(report))


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(prog="torch-lwlrap doctor", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--no-timing", action="store_true", help="check the values only, without timings")
    return parser


def run(json_output: bool = False, timing: bool = True) -> int:
    """Run every check, print the report; returns the exit status (1 on any disagreement, else 0)."""
    if json_output:
        report = run_checks(timing=timing)
        print(json.dumps(report), flush=True)
        return 0 if report["ok"] else 1
    # Each line as soon as it is known: the first calls compile, and the checks take a while. The checks table's
    # header comes with its first row, so that what the first check says on stderr (the compile notice, a
    # warning) lands above the table, not between its header and its rows.
    info = versions()
    print("\n".join(_version_lines(info)), flush=True)
    header = [_CHECK_HEADER]  # emptied once printed

    def print_row(check: Dict[str, Any]) -> None:
        print("\n".join(header + [_check_row(check)]), flush=True)
        header.clear()

    report = run_checks(timing, print_row, info)
    print("\n".join(header + _closing_lines(report)), flush=True)
    return 0 if report["ok"] else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    from torch_lwlrap._engine_config import get_engine

    try:
        get_engine()
    except ValueError as err:  # a TORCH_LWLRAP_ENGINE that names no engine: one line, as the command line says it
        print(f"{build_parser().prog}: error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    return run(json_output=args.json, timing=not args.no_timing)


if __name__ == "__main__":
    sys.exit(main())
