"""The benchmark sweep: torch_lwlrap against reference implementations and the hardware floor.

``python -m benchmarks --help`` lists the options; ``benchmarks/README.md`` explains the cases and the output.
Progress goes to stderr; results go to ``<out>/<tag>.json``, ``<out>/<tag>.md`` and ``<out>/<tag>.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from benchmarks import anchors

#: The committed results; a sweep writes here only when asked (``--out benchmarks/results``).
RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: Where a sweep writes by default: a git-ignored scratch folder, so a run never overwrites the committed results.
SCRATCH_DIR = Path(__file__).resolve().parent / "out"
REPO_ROOT = Path(__file__).resolve().parent.parent

#: Sizes as ``NxC`` (1 to 3 positive labels per row, like audio tagging data) or ``NxC:density`` (each label positive
#: with that probability).
DEFAULT_SIZES = {
    "cpu": ["20000x80", "20000x527", "200000x80", "200000x527", "5000x10000", "20000x527:0.3"],
    "cuda": [
        "20000x80",
        "20000x527",
        "20000x10000",
        "1000000x80",
        "1000000x527",
        "100000x10000",
        "1000000x527:0.3",
    ],
}
QUICK_SIZES = ["300x24", "300x24:0.3"]

#: Inputs smaller than this are timed in rotation over several copies, so that no cache holds them all.
ROTATE_BYTES = 256 << 20
MAX_COPIES = 64

#: Tolerance of the value checks against the anchors (torchmetrics accumulates in float32).
TOLERANCE = {"scikit-learn": 1e-9, "challenge (numpy)": 1e-9, "torchmetrics": 1e-4}


# ---------------------------------------------------------------------------------------------------------------
# Cases and data


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark case: a batch of ``num_samples`` rows and ``num_classes`` labels on ``device``."""

    num_samples: int
    num_classes: int
    density: Optional[float]  #: None: 1 to 3 positive labels per row; else the probability of a positive label
    device: str

    @property
    def labels(self) -> str:
        return "1-3 per row" if self.density is None else f"{self.density:.0%} positive"

    @property
    def name(self) -> str:
        return f"{self.device} {self.num_samples}x{self.num_classes} {self.labels}"


def parse_sizes(text: str) -> List[Tuple[int, int, Optional[float]]]:
    """Parse ``"NxC,NxC:density,..."``.

    Example:
        >>> parse_sizes("20000x527,100x8:0.3")
        [(20000, 527, None), (100, 8, 0.3)]
    """
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        shape, _, density = item.partition(":")
        try:
            num_samples, num_classes = (int(value) for value in shape.lower().split("x"))
            fraction = float(density) if density else None
        except ValueError:
            raise ValueError(
                f"Argument `--sizes`: cannot read {item!r}; expected NxC or NxC:density, e.g. 20000x527 or "
                f"20000x527:0.3."
            ) from None
        if num_samples < 1 or num_classes < 3:
            raise ValueError(f"Argument `--sizes`: {item!r} needs N >= 1 and C >= 3.")
        if num_classes > 1 << 23:
            raise ValueError(f"Argument `--sizes`: {item!r} has more than 2**23 classes, which is not supported.")
        if fraction is not None and not 0 < fraction <= 1:
            raise ValueError(f"Argument `--sizes`: the density of {item!r} must be in (0, 1], but got {fraction}.")
        sizes.append((num_samples, num_classes, fraction))
    if not sizes:
        raise ValueError(f"Argument `--sizes` names no size: {text!r}.")
    return sizes


def sizes_argument(text: str) -> List[Tuple[int, int, Optional[float]]]:
    """:func:`parse_sizes` as an argparse ``type``: a bad size is a usage error before any timing, in every script."""
    try:
        return parse_sizes(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error).replace("Argument `--sizes`: ", "")) from None


def count_argument(text: str) -> int:
    """A whole number >= 1 as an argparse ``type`` (repeats, calls, rounds: each table is a median of them).

    Example:
        >>> count_argument("3")
        3
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1 (a median needs one timing), got {value}")
    return value


def make_inputs(
    num_samples: int, num_classes: int, density: Optional[float], device: str = "cpu", seed: int = 0
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Deterministic float32 scores and bool labels, free of tied scores within a row.

    Labels: with ``density`` None each row gets 1, 2 or 3 distinct positive labels (uniformly), else each label is
    positive with probability ``density``. Scores are ``(C * level + column) / 2**24`` for a random integer
    ``level``: exact in float32 and distinct within a row, so every tie rule gives the same ranking. Positive labels
    draw their level from the top ``1 / C`` of the range 85% of the time (about one negative above them), so the
    scores carry signal like a trained tagger's (lwlrap about 0.6 to 0.8).

    Example:
        >>> preds, target = make_inputs(4, 6, None)
        >>> tuple(preds.shape), target.dtype, bool((target.sum(1) >= 1).all()), bool((target.sum(1) <= 3).all())
        ((4, 6), torch.bool, True, True)
    """
    generator = torch.Generator(device=device).manual_seed(seed)
    preds = torch.empty(num_samples, num_classes, dtype=torch.float32, device=device)
    target = torch.zeros(num_samples, num_classes, dtype=torch.bool, device=device)
    levels = (1 << 24) // num_classes
    column = torch.arange(num_classes, device=device, dtype=torch.int32)
    rows_per_chunk = max(1, (1 << 22) // num_classes)  # generate in chunks: little memory beyond the inputs
    for start in range(0, num_samples, rows_per_chunk):
        rows = min(rows_per_chunk, num_samples - start)
        labels = target[start : start + rows]
        if density is None:
            _mark_distinct_labels(labels, generator)
        else:
            labels.copy_(torch.rand(rows, num_classes, generator=generator, device=device) < density)
        level = torch.randint(0, levels, (rows, num_classes), generator=generator, device=device, dtype=torch.int32)
        # Most positives score above all but a few negatives, like a trained tagger's (lwlrap about 0.7).
        boosted = labels & (torch.rand(rows, num_classes, generator=generator, device=device) < 0.85)
        level = torch.where(boosted, levels - 1 - level % max(1, levels // num_classes), level)
        preds[start : start + rows] = (level * num_classes + column).to(torch.float32) * 2.0**-24
    return preds, target


def _mark_distinct_labels(labels: torch.Tensor, generator: torch.Generator) -> None:
    """Set 1, 2 or 3 distinct random labels per row (uniform subsets, by shifting past the columns already drawn)."""
    rows, num_classes = labels.shape
    device = labels.device
    count = torch.randint(1, 4, (rows,), generator=generator, device=device)
    first = torch.randint(0, num_classes, (rows,), generator=generator, device=device)
    second = torch.randint(0, num_classes - 1, (rows,), generator=generator, device=device)
    second += second >= first
    low, high = torch.minimum(first, second), torch.maximum(first, second)
    third = torch.randint(0, num_classes - 2, (rows,), generator=generator, device=device)
    third += third >= low
    third += third >= high
    index = torch.arange(rows, device=device)
    for column, needed in ((first, 1), (second, 2), (third, 3)):
        keep = count >= needed
        labels[index[keep], column[keep]] = True


# ---------------------------------------------------------------------------------------------------------------
# Implementations


def library_implementations(device: str) -> Dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    """The torch_lwlrap entry points timed: default ``"auto"`` engine, each forced engine, and the metric."""
    from torch_lwlrap import MultilabelLWLRAP, multilabel_lwlrap
    from torch_lwlrap._ranking import ENGINES, use_engine

    impls: Dict[str, Callable] = {
        "torch_lwlrap": lambda p, t: multilabel_lwlrap(p, t),
        "torch_lwlrap (validate_args=False)": lambda p, t: multilabel_lwlrap(p, t, validate_args=False),
    }
    only_on = {"numba": "cpu", "triton": "cuda"}  # compiled paths run on their device only (elsewhere: "sort")
    for engine in ENGINES:
        if engine == "auto" or only_on.get(engine, device) != device:
            continue

        def forced(p, t, engine=engine):
            with use_engine(engine):
                return multilabel_lwlrap(p, t)

        impls[f"torch_lwlrap engine={engine}"] = forced

    metrics: Dict[int, Any] = {}

    def metric(p, t):
        if p.shape[1] not in metrics:
            metrics[p.shape[1]] = MultilabelLWLRAP(num_labels=p.shape[1]).to(p.device)
        m = metrics[p.shape[1]]
        m.reset()
        m.update(p, t)
        return m.compute()

    impls["MultilabelLWLRAP update+compute"] = metric
    return impls


def _auto_engine(device: str, num_samples: int, num_classes: int, num_positives: int) -> str:
    """The path the default engine ("auto") takes for float32 inputs of this size on ``device``."""
    from torch_lwlrap import _numba_kernel, _triton_kernel
    from torch_lwlrap._ranking import choose_engine

    if device == "cpu":
        if _numba_kernel.is_available(device, torch.float32):
            return "numba"
        return choose_engine(num_samples, num_classes, num_positives)
    return "triton" if _triton_kernel.is_available(device, torch.float32) else "sort"


def _slice_rows(num_samples: int, num_classes: int, quick: bool) -> int:
    """Rows given to the slow per-sample anchors (about a second of work each), reported per row."""
    budget = 20_000 if quick else 2_000_000
    return max(1, min(num_samples, max(20, budget // num_classes)))


# ---------------------------------------------------------------------------------------------------------------
# Measurements


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


#: Untimed calls before timing a library call: its numba kernels' parallel and serial variants each compile (or load
#: from numba's cache) on their first call, and the run-time choice between them
#: (``torch_lwlrap._numba_runtime.SpeedChoice``) runs parallel twice, then serial twice; the allocator settles too.
WARM_UP_CALLS = 4


def warm_up(fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` :data:`WARM_UP_CALLS` times, untimed; returns the last call's result."""
    for _ in range(WARM_UP_CALLS):
        result = fn(*args)
    return result


def time_fast(fn: Callable[[], Any], min_run_time: float) -> float:
    """Median seconds per call with ``torch.utils.benchmark.Timer.blocked_autorange`` (it synchronizes CUDA)."""
    from torch.utils.benchmark import Timer

    # Timer runs single-threaded unless told: give it the threads torch would use.
    timer = Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    return timer.blocked_autorange(min_run_time=min_run_time).median


def time_slow(fn: Callable[[], Any], repeats: int, device: str) -> float:
    """Median seconds of ``repeats`` single calls (for anchors that take about a second), after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cuda_peak_extra_bytes(fn: Callable[[], Any]) -> int:
    """Peak CUDA memory allocated during one call, beyond what was allocated before it (the inputs)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} field.")


def memory_probe(num_samples: int, num_classes: int, density: Optional[float], impl: str, seed: int) -> Dict:
    """Peak RSS added by one call, measured in this (fresh) process; run by :func:`cpu_peak_extra_bytes`.

    The inputs are generated in chunks and a warm-up call loads the code paths: on as many rows as make a compiled
    pass enter its parallel variant (a kernel's serial and parallel variants load separately), so that neither
    variant's loading, nor its compiling where the cache is cold, counts as the call's memory. Its freed memory is
    handed back to the system (glibc's ``malloc_trim``) so that the call cannot reuse it unseen. Then the peak-RSS
    mark (``VmHWM``) is reset through ``/proc/self/clear_refs`` and the call is made: the result is ``VmHWM`` after
    the call minus ``VmRSS`` before it. Where the mark cannot be reset, ``ru_maxrss`` before and after is used, which
    can only under-report if input generation peaked higher than the call.
    """
    import ctypes
    import gc
    import resource

    from torch_lwlrap._numba_runtime import PARALLEL_MIN_SCORES_PER_THREAD

    preds, target = make_inputs(num_samples, num_classes, density, "cpu", seed)
    fn = library_implementations("cpu")[impl]
    warm_rows = min(num_samples, -(-2 * PARALLEL_MIN_SCORES_PER_THREAD // num_classes) + 1)
    fn(preds[:warm_rows], target[:warm_rows])
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: freed memory may stay resident, and the call may reuse it
        pass
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        method = "VmHWM after the call - VmRSS before (peak mark reset via /proc/self/clear_refs)"
        before = _status_kib("VmRSS")
        fn(preds, target)
        peak = _status_kib("VmHWM")
    except OSError:
        method = "ru_maxrss after - ru_maxrss before"
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        fn(preds, target)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"extra_bytes": max(0, peak - before) * 1024, "method": method}


def cpu_peak_extra_bytes(case: Case, impl: str, seed: int) -> Tuple[Optional[int], str]:
    """Run :func:`memory_probe` in a fresh Python process; ``(bytes or None, method or error)``."""
    code = (
        "import json, sys; from benchmarks.run import memory_probe; "
        f"print(json.dumps(memory_probe({case.num_samples}, {case.num_classes}, {case.density!r}, {impl!r}, {seed})))"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=str(REPO_ROOT), env=env, check=False
    )
    if done.returncode != 0:
        return None, f"probe failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return result["extra_bytes"], result["method"]


# ---------------------------------------------------------------------------------------------------------------
# The sweep


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def run_case(case: Case, args: argparse.Namespace, bandwidth: Optional[float]) -> Dict:
    """Time every implementation on one case; returns the case's record for the JSON file."""
    from torch_lwlrap import multilabel_lrap, multilabel_lwlrap

    device = case.device
    _log(f"== {case.name}: generating inputs")
    preds, target = make_inputs(case.num_samples, case.num_classes, case.density, device, args.seed)
    num_positives = int(target.sum())
    input_bytes = preds.numel() * preds.element_size() + target.numel() * target.element_size()
    # Inputs that would stay in a cache are rotated: enough copies (other seeds) to exceed ROTATE_BYTES.
    copies = [(preds, target)] + [
        make_inputs(case.num_samples, case.num_classes, case.density, device, args.seed + copy)
        for copy in range(1, 1 if args.quick else min(MAX_COPIES, -(-ROTATE_BYTES // input_bytes)))
    ]
    rotation = itertools.cycle(copies)

    def rotated(fn: Callable) -> Callable[[], Any]:
        return lambda: fn(*next(rotation))
    record: Dict[str, Any] = {
        "case": case.name,
        "device": device,
        "num_samples": case.num_samples,
        "num_classes": case.num_classes,
        "labels": case.labels,
        "positives": num_positives,
        "input_bytes": input_bytes,
        "auto_engine": _auto_engine(device, case.num_samples, case.num_classes, num_positives),
        "rotated_copies": len(copies),
        "results": [],
    }

    # The floor.
    if device == "cpu":
        floor = time_fast(rotated(anchors.read_inputs), args.min_run_time)
        record["floor"] = {"seconds": floor, "what": "one read of the inputs (preds.sum() + target read as words)"}
    else:
        floor = input_bytes / bandwidth
        record["floor"] = {"seconds": floor, "what": f"input bytes / device-copy bandwidth ({bandwidth / 1e9:.0f} GB/s)"}
    _log(f"   floor: {floor * 1e3:.3f} ms")

    # The library, on all rows.
    reference = None
    for name, impl in library_implementations(device).items():
        try:
            value = float(impl(preds, target))
        except Exception as error:  # an engine unavailable here (e.g. a missing GPU compiler): report, go on
            _log(f"   {name}: skipped ({type(error).__name__}: {error})")
            record["results"].append({"implementation": name, "kind": "library", "skipped": f"{error}"})
            continue
        warm_up(impl, preds, target)
        seconds = time_fast(rotated(impl), args.min_run_time)
        entry = {"implementation": name, "kind": "library", "rows": case.num_samples, "seconds": seconds, "value": value}
        if args.memory == "all" or (args.memory == "auto" and name == "torch_lwlrap"):
            if device == "cpu":
                entry["peak_extra_bytes"], entry["memory_method"] = cpu_peak_extra_bytes(case, name, args.seed)
            else:
                entry["peak_extra_bytes"] = cuda_peak_extra_bytes(lambda: impl(preds, target))
                entry["memory_method"] = "torch.cuda.max_memory_allocated() - memory_allocated() before the call"
        reference = value if reference is None else reference
        entry["agrees"] = abs(value - reference) <= 1e-9
        record["results"].append(entry)
        extra = entry.get("peak_extra_bytes")
        memory = f", peak extra {extra / 2**20:.1f} MiB" if extra is not None else ""
        _log(f"   {name}: {seconds * 1e3:.2f} ms, {case.num_samples / seconds:,.0f} rows/s{memory}")

    # The anchors, on a slice of rows, compared with the library's value on the same slice.
    rows = _slice_rows(case.num_samples, case.num_classes, args.quick)
    part_preds, part_target = preds[:rows], target[:rows]
    numpy_preds, numpy_target = part_preds.cpu().numpy(), part_target.cpu().numpy().astype(np.int64)
    anchor_list = [
        ("scikit-learn", "cpu", lambda: anchors.sklearn_lwlrap(numpy_preds, numpy_target),
         lambda: multilabel_lwlrap(part_preds, part_target)),
        ("challenge (numpy)", "cpu", lambda: anchors.challenge_lwlrap(numpy_preds, numpy_target),
         lambda: multilabel_lwlrap(part_preds, part_target, ties="index")),
        ("torchmetrics", device, lambda: anchors.torchmetrics_lrap(part_preds, part_target),
         lambda: multilabel_lrap(part_preds, part_target)),
    ]
    for name, runs_on, anchor, library_value in anchor_list:
        value = float(anchor())
        expected = float(library_value())
        seconds = time_slow(anchor, args.repeats, runs_on)
        agrees = abs(value - expected) <= TOLERANCE[name]
        record["results"].append(
            {
                "implementation": name,
                "kind": "anchor",
                "runs_on": runs_on,
                "rows": rows,
                "seconds": seconds,
                "value": value,
                "library_value": expected,
                "agrees": agrees,
            }
        )
        verdict = "agrees" if agrees else f"DISAGREES with torch_lwlrap ({expected!r})"
        _log(f"   {name} on {rows} rows: {seconds * 1e3:.1f} ms, {rows / seconds:,.0f} rows/s, {value:.6f} {verdict}")

    _add_ratios(record)
    return record


def _add_ratios(record: Dict) -> None:
    """Speed-ups of each library entry over each anchor (per row) and its time over the floor."""
    anchor_rates = {
        r["implementation"]: r["rows"] / r["seconds"] for r in record["results"] if r["kind"] == "anchor"
    }
    for entry in record["results"]:
        if entry["kind"] != "library" or "seconds" not in entry:
            continue
        rate = entry["rows"] / entry["seconds"]
        entry["rows_per_second"] = rate
        entry["speedup_vs"] = {name: rate / anchor_rate for name, anchor_rate in anchor_rates.items()}
        entry["times_floor"] = entry["seconds"] / record["floor"]["seconds"]
    for entry in record["results"]:
        if entry["kind"] == "anchor":
            entry["rows_per_second"] = entry["rows"] / entry["seconds"]


def add_output_arguments(parser: argparse.ArgumentParser, name: Optional[str], name_help: str = "") -> None:
    """``--out`` (the folder) and ``--name`` (the file name, without suffix) of a script's tables, as each takes them:
    so that any committed table can be written again under its own name (``--out benchmarks/results --name ...``)."""
    parser.add_argument("--out", type=Path, default=SCRATCH_DIR,
                        help=f"folder for the tables (default {SCRATCH_DIR}, git-ignored; the committed tables are "
                        f"in {RESULTS_DIR})")
    parser.add_argument("--name", type=_file_name, default=name,
                        help=f"file name of the tables, without suffix (default: {name_help or name})")


def _names_a_folder(text: str) -> bool:
    """Whether a name given for the tables' files (``--name``, the sweep's ``--tag``) would name a folder instead."""
    return not text or "/" in text or text in (".", "..")


def _file_name(text: str) -> str:
    if _names_a_folder(text):
        raise argparse.ArgumentTypeError(f"names the tables' files, not a folder (use --out for that): {text!r}")
    return text


def write_tables(path, report: Dict, table: str) -> None:
    """Print ``table`` and write it to ``path`` with the suffix ``.md``, and ``report`` beside it as ``.json``."""
    print(table)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Suffixes added, not replaced: a name may hold a dot (ties_0.5).
    out.with_name(out.name + ".json").write_text(json.dumps(report, indent=2, default=str))
    out.with_name(out.name + ".md").write_text(table + "\n")


def machine_metadata(devices: Sequence[str]) -> Dict:
    """CPU, GPU, library versions and the git commit, for the JSON file."""
    import sklearn
    import torchmetrics

    import torch_lwlrap

    cpu_model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    meta: Dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_model,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torchmetrics": torchmetrics.__version__,
        "scikit-learn": sklearn.__version__,
        "numpy": np.__version__,
        "torch_lwlrap": torch_lwlrap.__version__,
        "devices": list(devices),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cuda": torch.version.cuda,
    }
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=str(REPO_ROOT), check=True
        ).stdout.strip()
        dirty = subprocess.run(
            # the results folder itself does not count: a sweep replaces the files there
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results"],
            capture_output=True, text=True, cwd=str(REPO_ROOT), check=True,
        ).stdout.strip()
        meta["git_commit"] = commit
        meta["git_dirty"] = bool(dirty)
    except (OSError, subprocess.CalledProcessError):
        meta["git_commit"] = None
    return meta


# ---------------------------------------------------------------------------------------------------------------
# Output


def _format_rate(rate: float) -> str:
    if rate >= 1e6:
        return f"{rate / 1e6:.2f} M"
    if rate >= 1e3:
        return f"{rate / 1e3:.1f} k"
    return f"{rate:.0f}"


def write_markdown(report: Dict, path: Path) -> None:
    """One table per case: rows/s, speed-ups over the anchors, time over the floor, peak extra memory."""
    meta = report["metadata"]
    lines = [
        f"# torch_lwlrap benchmark: {report['tag']}",
        "",
        f"- Date: {meta['date']}; commit: `{meta.get('git_commit')}`" + (" (uncommitted changes)" if meta.get("git_dirty") else ""),
        f"- CPU: {meta['cpu']} ({meta['cpu_count']} cores, torch threads {meta['torch_threads']}); GPU: {meta['gpu']}",
        f"- torch {meta['torch']}, torchmetrics {meta['torchmetrics']}, scikit-learn {meta['scikit-learn']}, "
        f"numpy {meta['numpy']}, python {meta['python']}",
        f"- Command: `{report['command']}`; cases measured: {report.get('cases_done', len(report['cases']))}",
        "",
        "Speed-ups compare rows per second; the anchors run on a slice of rows (column *rows*). "
        "*x floor* is the time over the floor (CPU: one read of the inputs; CUDA: input bytes over the "
        "device-copy bandwidth). Peak extra memory: CPU, peak RSS added by one call in a fresh process; CUDA, "
        "peak allocated beyond the inputs.",
        "",
    ]
    for record in report["cases"]:
        anchor_names = [r["implementation"] for r in record["results"] if r["kind"] == "anchor"]
        auto = f"; default engine path: {record['auto_engine']}"
        if record.get("rotated_copies", 1) > 1:
            auto += f"; timed in rotation over {record['rotated_copies']} copies of the inputs"
        lines += [
            f"## {record['case']}",
            "",
            f"{record['positives']:,} positive labels, {record['input_bytes'] / 2**20:.1f} MiB of inputs; floor "
            f"{record['floor']['seconds'] * 1e3:.3f} ms ({record['floor']['what']}){auto}.",
            "",
            "| implementation | rows | time (ms) | rows/s | "
            + " | ".join(f"vs {name}" for name in anchor_names)
            + " | x floor | peak extra (MiB) | value |",
            "|---|---:|---:|---:|" + "---:|" * len(anchor_names) + "---:|---:|---|",
        ]
        for entry in record["results"]:
            if "seconds" not in entry:
                lines.append(f"| {entry['implementation']} | skipped: {entry.get('skipped', '')} |")
                continue
            speedups = [
                f"{entry['speedup_vs'][name]:,.0f}x" if entry["kind"] == "library" else "" for name in anchor_names
            ]
            times_floor = f"{entry['times_floor']:.1f}" if entry["kind"] == "library" else ""
            extra = entry.get("peak_extra_bytes")
            memory = f"{extra / 2**20:.1f}" if extra is not None else ""
            check = "ok" if entry.get("agrees") else "**mismatch**"
            lines.append(
                f"| {entry['implementation']} | {entry['rows']:,} | {entry['seconds'] * 1e3:.2f} | "
                f"{_format_rate(entry['rows_per_second'])} | " + " | ".join(speedups) + f" | {times_floor} | "
                f"{memory} | {entry['value']:.6f} {check} |"
            )
        lines.append("")
    path.write_text("\n".join(lines))


def write_plot(report: Dict, path: Path) -> None:
    """Rows per second of each implementation on each case, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [record["case"] for record in report["cases"]]
    names: List[str] = []
    for record in report["cases"]:
        for entry in record["results"]:
            if "seconds" in entry and entry["implementation"] not in names:
                names.append(entry["implementation"])
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(cases)), 7))
    width = 0.8 / max(1, len(names))
    for index, name in enumerate(names):
        xs, ys = [], []
        for position, record in enumerate(report["cases"]):
            for entry in record["results"]:
                if entry["implementation"] == name and "seconds" in entry:
                    xs.append(position - 0.4 + width * (index + 0.5))
                    ys.append(entry["rows_per_second"])
        ax.bar(xs, ys, width=width, label=name)
    ax.set_yscale("log")
    ax.set_ylabel("rows per second (log scale)")
    ax.set_xticks(range(len(cases)))
    ax.set_xticklabels(cases, rotation=20, ha="right", fontsize=8)
    ax.set_title(f"torch_lwlrap benchmark: {report['tag']}")
    ax.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.22))  # below the axes: no overlap
    ax.grid(axis="y", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------------------
# Command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Time torch_lwlrap against scikit-learn, the challenge's numpy algorithm, torchmetrics and the "
        "hardware floor, over a sweep of batch sizes, label counts and devices.",
    )
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all",
                        help="where to run: cpu, cuda, or all (cpu, and cuda when available). Default: all.")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and short timings (seconds in all), for smoke tests.")
    parser.add_argument("--sizes", type=sizes_argument, default=None,
                        help="comma-separated NxC (1-3 positives per row) or NxC:density cases, replacing the "
                        "default sweep, e.g. '20000x527,20000x527:0.3'.")
    parser.add_argument("--out", type=Path, default=SCRATCH_DIR,
                        help=f"output folder. Default: {SCRATCH_DIR} (git-ignored); the committed results are in "
                        f"{RESULTS_DIR}.")
    parser.add_argument("--tag", default=None, help="name of the output files. Default: from --quick and --device.")
    parser.add_argument("--memory", choices=["all", "auto", "none"], default=None,
                        help="measure peak extra memory of every library entry point, of the default one only, or "
                        "none. Default: all (auto with --quick).")
    parser.add_argument("--min-run-time", type=float, default=None,
                        help="seconds of repeated calls per library timing. Default: 1.0 (0.05 with --quick).")
    parser.add_argument("--repeats", type=count_argument, default=None,
                        help="timed calls per anchor (median). Default: 3 (1 with --quick).")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated inputs. Default: 0.")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the sweep; returns 0, or 1 when an anchor disagrees with torch_lwlrap's value."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device is available (torch.cuda.is_available() is False).")
    devices = ["cpu"] if args.device == "cpu" else ["cuda"] if args.device == "cuda" else ["cpu"]
    if args.device == "all" and torch.cuda.is_available():
        devices.append("cuda")
    args.min_run_time = args.min_run_time if args.min_run_time is not None else (0.05 if args.quick else 1.0)
    args.repeats = args.repeats if args.repeats is not None else (1 if args.quick else 3)
    args.memory = args.memory if args.memory is not None else ("auto" if args.quick else "all")
    if args.tag is not None and _names_a_folder(args.tag):
        parser.error(f"--tag names the output files, not a folder (use --out for that): {args.tag!r}")
    custom = args.sizes
    cases = []
    for device in devices:
        sizes = custom or parse_sizes(",".join(QUICK_SIZES if args.quick else DEFAULT_SIZES[device]))
        cases += [Case(n, c, density, device) for n, c, density in sizes]
    tag = args.tag or ("quick-" if args.quick else "") + "+".join(devices)

    bandwidth = None
    if "cuda" in devices:
        bandwidth = anchors.copy_bandwidth(torch.device("cuda"), nbytes=(1 << 24) if args.quick else (1 << 30))
        _log(f"CUDA device-copy bandwidth: {bandwidth / 1e9:.1f} GB/s")
    report: Dict[str, Any] = {
        "tag": tag,
        "command": "python -m benchmarks " + " ".join(sys.argv[1:] if argv is None else argv),
        "metadata": machine_metadata(devices),
        "cuda_copy_bandwidth": bandwidth,
        "cases": [],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    json_path, md_path, png_path = (args.out / f"{tag}{suffix}" for suffix in (".json", ".md", ".png"))
    for index, case in enumerate(cases, 1):
        _log(f"[{index}/{len(cases)}]")
        report["cases"].append(run_case(case, args, bandwidth))
        if case.device == "cuda":
            torch.cuda.empty_cache()
        # Written after every case: a sweep killed by a time limit, or crashing in a later case, keeps what it measured.
        report["cases_done"] = f"{index} of {len(cases)}"
        json_path.write_text(json.dumps(report, indent=2))
        write_markdown(report, md_path)
    write_plot(report, png_path)
    _log(f"wrote {json_path}, {md_path} and {png_path}")
    mismatches = [
        f"{record['case']}: {entry['implementation']}"
        for record in report["cases"]
        for entry in record["results"]
        if "agrees" in entry and not entry["agrees"]
    ]
    if mismatches:
        _log("values that disagree with torch_lwlrap: " + "; ".join(mismatches))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
