"""GPU check of the ranking engine: correctness of every path on CUDA, no host-device sync, and timings.

Run on a machine with a CUDA GPU and Triton (about 2 to 4 minutes on an H100)::

    PYTHONPATH=. python benchmarks/gpu_check.py --out /tmp/gpu_check

It prints its tables and writes ``results.json`` and ``results.md`` under ``--out``. Sections:

1. correctness: every engine path ("sort", "count", "triton") on CUDA against exact per-label precisions from the
   naive formula loops (``tests/reference.py``) on small tied cases (all score dtypes, both tie rules, ignored
   labels, +-inf), and against the CPU float64 sort path on medium cases (1 to 10000 columns, the tiled kernel,
   non-contiguous inputs);
2. sync: ``MultilabelLWLRAP(validate_args=False).update`` under ``torch.cuda.set_sync_debug_mode("error")``, with
   the engine on "auto" (which must take the Triton kernel for CUDA tensors) and on "triton";
3. timings: each path at N = 1M, C = 527 (float32 scores, bool targets, 1 to 3 positives per row), N = 1M, C = 80,
   N = 100k, C = 10000 and a dense case (30% positives): median time over repeats (CUDA events), peak device memory
   beyond the inputs, the floor of reading the inputs once, and the largest difference of per-class sums between
   paths;
4. a sweep of the Triton kernel's tile parameters (rows per tile, warps, prefetch of the next tile; for the tiled
   kernel, columns per tile and warps) at N = 1M, C = 527 and C = 80 and N = 100k, C = 10000, with each variant's
   registers and spills; the default variant comes first (``--no-sweep`` skips it).

The exit status is 1 when a correctness or sync check fails.

Without a GPU, ``TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/gpu_check.py --device cpu --tiny`` runs the same
script at toy sizes in Triton's interpreter (a check of the script itself; its timings mean nothing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests/ and torch_lwlrap/

from tests.reference import exact_sums as reference_exact_sums  # noqa: E402
from torch_lwlrap import MultilabelLWLRAP  # noqa: E402
from torch_lwlrap import _triton_kernel as kernel  # noqa: E402
from benchmarks.triton_aot import compile_for  # noqa: E402
from torch_lwlrap._ranking import RankingSums, ranking_sums, use_engine  # noqa: E402

PATHS = ("sort", "count", "triton")


# ---------------------------------------------------------------------------------------------------------------
# helpers


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn, device, *, min_repeats=3, max_repeats=20, budget_s=1.0):
    """Median seconds of ``fn()`` after one warm-up call; repeats fit in about ``budget_s``."""
    fn()
    sync(device)
    cuda = torch.device(device).type == "cuda"

    def once():
        if cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop) / 1e3
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin

    first = once()
    repeats = max(min_repeats, min(max_repeats, int(budget_s / max(first, 1e-6))))
    if first > 2 * budget_s:
        repeats = 1
    times = [first] + [once() for _ in range(repeats - 1)]
    return statistics.median(times)


def peak_extra_bytes(fn, device):
    """Peak device memory allocated while ``fn()`` runs, beyond what was allocated before (None off CUDA)."""
    if torch.device(device).type != "cuda":
        return None
    sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    sync(device)
    return torch.cuda.max_memory_allocated(device) - base


def sparse_target(num_samples, num_classes, device, low=1, high=3, generator=None):
    """Bool targets with ``low`` to ``high`` positives per row (fewer where columns repeat)."""
    count = torch.randint(low, high + 1, (num_samples, 1), device=device, generator=generator)
    cols = torch.randint(0, num_classes, (num_samples, high), device=device, generator=generator)
    take = torch.arange(high, device=device) < count
    target = torch.zeros(num_samples, num_classes, dtype=torch.bool, device=device)
    rows = torch.arange(num_samples, device=device)[:, None].expand(-1, high)
    target[rows[take], cols[take]] = True
    return target


@contextlib.contextmanager
def kernel_launches():
    """A list that gains an entry at each launch of the Triton kernel inside the block (through the engine) that
    returns: a launch that raises (which the engine answers with a torch path) is not counted."""
    launches = []
    launch = kernel.ranking_sums_triton

    def counted(*args, **kwargs):
        result = launch(*args, **kwargs)
        launches.append(1)
        return result

    kernel.ranking_sums_triton = counted
    try:
        yield launches
    finally:
        kernel.ranking_sums_triton = launch


def path_sums(path, preds, positive, known, ties, **tuning):
    """(class sums, sample sums) of one engine path; ``tuning`` goes to the Triton kernel directly, and so do
    tensors off CUDA (Triton's interpreter: the engine would rank them on a torch path). The path ``"triton"`` fails
    where the engine fell back to a torch path instead of launching the kernel (its warning is issued once per
    process: later batches fall back silently), so that no row labelled triton holds another path's numbers."""
    if path == "triton" and (tuning or preds.device.type != "cuda"):
        sums = RankingSums.zeros(*preds.shape, preds.device)
        kernel.ranking_sums_triton(preds, positive, known, *sums, ties=ties, **tuning)
        return sums[0], sums[2]
    with kernel_launches() as launches, use_engine(path):
        sums = ranking_sums(preds, positive, known, ties=ties)
    if path == "triton" and not launches:
        raise RuntimeError(f"the engine did not launch the Triton kernel on {preds.device}: it fell back to a torch "
                           f"path (see the EngineFallbackWarning above, or torch-lwlrap doctor)")
    return sums.class_precision_sum, sums.sample_precision_sum


def exact_sums(preds, positive, known, ties):
    """(class sums, sample sums) from exact fractions of the naive per-label precisions (small inputs only)."""
    target = positive.cpu().long()
    if known is not None:
        target[~known.cpu()] = -1
    return reference_exact_sums(preds, target, ties, None if known is None else -1)


def rel_diff(got, want):
    """Largest |got - want| / max(1, |want|) (NaN-free inputs)."""
    got, want = got.double().cpu(), want.double().cpu()
    if got.numel() == 0:
        return 0.0
    return ((got - want).abs() / want.abs().clamp(min=1.0)).max().item()


def markdown_table(rows, columns):
    if not rows:
        return "(none)\n"
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        cells = []
        for name in columns:
            value = row.get(name, "")
            if isinstance(value, float):
                value = f"{value:.3g}" if (value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e5)) else f"{value:.4g}"
            cells.append(str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# 1. correctness


def correctness(device, tiny):
    rows = []
    g = torch.Generator(device="cpu").manual_seed(0)

    def case(name, preds, positive, known, ties, reference, paths=PATHS, **tuning):
        preds, positive = preds.to(device), positive.to(device)
        known = None if known is None else known.to(device)
        if reference == "exact":
            want = exact_sums(preds, positive, known, ties)
        else:
            cpu = (preds.cpu().double(), positive.cpu(), None if known is None else known.cpu())
            want = path_sums("sort", *cpu, ties)
        for path in paths:
            entry = dict(case=name, path=path, ties=ties, reference=reference, N=preds.shape[0], C=preds.shape[1])
            try:
                got = path_sums(path, preds, positive, known, ties, **tuning)
                entry["class_rel_diff"] = rel_diff(got[0], want[0])
                entry["sample_rel_diff"] = rel_diff(got[1], want[1])
                entry["ok"] = max(entry["class_rel_diff"], entry["sample_rel_diff"]) <= 1e-12
            except Exception as error:  # keep going: report every failing case
                entry["ok"] = False
                entry["error"] = f"{type(error).__name__}: {error}"
                traceback.print_exc()
            rows.append(entry)

    def tied(n, c, dtype, levels=4, density=0.3, ignore=False, infinite=True):
        preds = torch.randint(0, levels, (n, c), generator=g).double()
        if infinite:
            preds[torch.rand(n, c, generator=g) < 0.1] = math.inf
            preds[torch.rand(n, c, generator=g) < 0.1] = -math.inf
        positive = torch.rand(n, c, generator=g) < density
        known = (torch.rand(n, c, generator=g) > 0.2) if ignore else None
        if known is not None:
            positive &= known
        return preds.to(dtype), positive, known

    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    small_n = 12 if tiny else 64
    for dtype in dtypes:
        for ties in ("max", "index"):
            for ignore in (False, True):
                for c in (1, 2, 7):
                    name = f"tied {str(dtype)[6:]} C={c}" + (" ignore" if ignore else "")
                    case(name, *tied(small_n, c, dtype, ignore=ignore), ties, "exact")
    if tiny:
        medium = [(20, 40, {}), (4, 100, dict(max_block=16, tile=16))]
    else:
        medium = [
            (4096, 527, {}),
            (4096, 80, {}),
            (512, 5000, {}),
            (256, 10000, {}),
            (2048, 300, dict(max_block=64, tile=64)),
            (2048, 527, dict(block_rows=4, num_warps=2)),
        ]
    for n, c, tuning in medium:
        for ties in ("max", "index"):
            for ignore in (False, True):
                preds, positive, known = tied(n, c, torch.float32, levels=50, density=0.05, ignore=ignore)
                name = f"medium C={c}" + (" ignore" if ignore else "") + (f" {tuning}" if tuning else "")
                case(name, preds, positive, known, ties, "cpu sort float64", PATHS if not tuning else ("triton",),
                     **tuning)
    # non-contiguous scores and targets
    preds, positive, known = tied(small_n, 10, torch.float32, ignore=True)
    preds_t = preds.t().contiguous().t()
    wide = torch.zeros(small_n, 20, dtype=torch.bool)
    wide[:, ::2] = positive
    case("non-contiguous", preds_t, wide[:, ::2], known, "max", "exact")
    return rows


# ---------------------------------------------------------------------------------------------------------------
# 2. sync


def sync_check(device):
    if torch.device(device).type != "cuda":
        return [dict(check="sync", ok=None, note="CUDA only")]
    rows = []
    g = torch.Generator(device=device).manual_seed(1)
    preds = torch.randn(4096, 527, device=device, generator=g)
    target = sparse_target(4096, 527, device, generator=g).long()
    with kernel_launches() as calls:
        for engine in ("auto", "triton"):
            entry = dict(check=f"MultilabelLWLRAP.update, engine={engine}")
            metric = MultilabelLWLRAP(527, validate_args=False).to(device)
            with use_engine(engine):
                metric.update(preds, target)  # compiles outside the checked region
                torch.cuda.synchronize(device)
                calls.clear()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    metric.update(preds, target)
                    entry["ok"] = True
                except RuntimeError as error:
                    entry["ok"] = False
                    entry["error"] = str(error).splitlines()[0]
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            entry["triton_kernel_used"] = bool(calls)
            entry["ok"] = entry["ok"] and bool(calls)
            rows.append(entry)
    return rows


# ---------------------------------------------------------------------------------------------------------------
# 3. timings


def timing_cases(tiny):
    if tiny:
        return [
            ("sparse 1-3", 64, 20, 0.0),
            ("dense 30%", 16, 20, 0.3),
        ]
    return [
        ("sparse 1-3", 1_000_000, 527, 0.0),
        ("sparse 1-3", 1_000_000, 80, 0.0),
        ("sparse 1-3", 100_000, 10_000, 0.0),
        ("dense 30%", 100_000, 527, 0.3),
    ]


def timings(device, tiny):
    rows = []
    g = torch.Generator(device=device).manual_seed(2)
    for name, n, c, density in timing_cases(tiny):
        preds = torch.rand(n, c, device=device, generator=g)
        if density > 0:
            target = torch.rand(n, c, device=device, generator=g) < density
        else:
            target = sparse_target(n, c, device, generator=g)
        input_bytes = preds.numel() * preds.element_size() + target.numel()
        floor = time_call(lambda: (preds.amax(), target.view(torch.uint8).amax()), device)
        copy = time_call(lambda: preds.clone(), device)
        base = {
            "case": f"{name} N={n} C={c}",
            "input_MB": input_bytes / 1e6,
            "read_floor_ms": floor * 1e3,
            "copy_GBps": 2 * preds.numel() * preds.element_size() / copy / 1e9,
        }
        results = {}
        for path in PATHS:
            entry = dict(base, path=path)
            try:
                if path == "triton" and not kernel.is_available(device):
                    raise RuntimeError(f"the Triton kernel is not available on {device}")
                fn = lambda: path_sums(path, preds, target, None, "max")  # noqa: E731
                results[path] = fn()
                entry["ms"] = time_call(fn, device) * 1e3
                extra = peak_extra_bytes(fn, device)
                if extra is not None:
                    entry["extra_MB"] = extra / 1e6
                    entry["extra_vs_input"] = extra / input_bytes
                entry["x_floor"] = entry["ms"] / entry["read_floor_ms"]
            except Exception as error:
                entry["error"] = f"{type(error).__name__}: {error}"
                traceback.print_exc()
            rows.append(entry)
            sync(device)
            if torch.device(device).type == "cuda":
                torch.cuda.empty_cache()
        if "sort" in results:
            for entry in rows[-len(PATHS):]:
                if entry["path"] in results:
                    got, want = results[entry["path"]], results["sort"]
                    entry["class_rel_diff_vs_sort"] = rel_diff(got[0], want[0])
                    entry["sample_rel_diff_vs_sort"] = rel_diff(got[1], want[1])
        # the user-facing update, engine "auto"
        metric = MultilabelLWLRAP(c, validate_args=False).to(device)
        entry = dict(base, path="auto: MultilabelLWLRAP.update")
        try:
            entry["ms"] = time_call(lambda: metric.update(preds, target), device) * 1e3
            entry["x_floor"] = entry["ms"] / entry["read_floor_ms"]
        except Exception as error:
            entry["error"] = f"{type(error).__name__}: {error}"
            traceback.print_exc()
        rows.append(entry)
        del preds, target, results
        if torch.device(device).type == "cuda":
            torch.cuda.empty_cache()
    return rows


def sweep_variants(num_classes, tiny, max_block=kernel.MAX_BLOCK):
    """The tuning arguments the sweep tries for rows of ``num_classes`` columns, the default first."""
    default = kernel.launch_config(1 << 20, num_classes, max_programs=1, max_block=max_block)
    if default.tiled:
        tiles = (16, 32) if tiny else (1024, 2048, 4096)
        warps = (2, 4) if tiny else (2, 4, 8, 16)
        variants = [dict(tile=t, num_warps=w) for t in tiles for w in warps if w * 32 <= t or tiny]
        first = dict(tile=default.block_cols, num_warps=default.num_warps)
    else:
        block_cols = default.block_cols
        block_rows = [r for r in (1, 2, 4, 8, 16) if 128 <= r * block_cols <= 4096 or tiny][: 2 if tiny else None]
        variants = [
            dict(block_rows=r, num_warps=w, prefetch=p)
            for r in block_rows
            for w in ((2, 4) if tiny else (1, 2, 4, 8))
            if w * 32 <= r * block_cols
            for p in (False, True)
        ]
        first = dict(block_rows=default.block_rows, num_warps=default.num_warps, prefetch=kernel.PREFETCH)
    extra = {} if max_block == kernel.MAX_BLOCK else dict(max_block=max_block)
    return [dict(v, **extra) for v in [first] + [v for v in variants if v != first]]


def sweep(device, tiny):
    """Each tuning variant of the Triton kernel timed (and, on CUDA, its registers and spills) per case."""
    rows = []
    if not kernel.is_available(device):
        return rows
    g = torch.Generator(device=device).manual_seed(3)
    # (rows, columns, widest single tile): toy sizes reach the tiled kernel with a small max_block
    sizes = [(32, 20, kernel.MAX_BLOCK), (8, 40, 16)] if tiny else [(1_000_000, 527, kernel.MAX_BLOCK),
                                                                     (1_000_000, 80, kernel.MAX_BLOCK),
                                                                     (100_000, 10_000, kernel.MAX_BLOCK)]
    arch = None
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        arch = 10 * major + minor
    for n, c, max_block in sizes:
        preds = torch.rand(n, c, device=device, generator=g)
        target = sparse_target(n, c, device, generator=g)
        for index, tuning in enumerate(sweep_variants(c, tiny, max_block)):
            entry = dict(case=f"N={n} C={c}", default=index == 0, **tuning)
            try:
                fn = lambda: path_sums("triton", preds, target, None, "max", **tuning)  # noqa: E731
                entry["ms"] = time_call(fn, device, max_repeats=10, budget_s=0.2) * 1e3
                if arch is not None:
                    compiled = compile_for(arch, preds, target, None, **tuning)
                    entry["registers"] = compiled.registers
                    entry["spills"] = compiled.spill_stores
            except Exception as error:
                entry["error"] = f"{type(error).__name__}: {error}"
            rows.append(entry)
        del preds, target
    return rows


# ---------------------------------------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "out" / "gpu_check"),
                        help="directory for results.json and results.md (default: benchmarks/out/gpu_check, "
                             "git-ignored)")
    parser.add_argument("--device", default="cuda", help="device to check (default: cuda)")
    parser.add_argument("--tiny", action="store_true", help="toy sizes: a check of the script itself")
    parser.add_argument("--no-sweep", action="store_true", help="skip the sweep of the kernel's tile parameters")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device is available; pass --device cpu (with TRITON_INTERPRET=1) to check the script")
    if kernel.triton is None:  # every check runs the Triton kernel, on a GPU or interpreted
        why = f"does not import ({kernel._IMPORT_ERROR})" if kernel._IMPORT_ERROR else "is not installed"
        parser.error(f"Triton {why}: every check here runs the Triton kernel (pip install -e \".[gpu]\"; CUDA "
                     f"builds of PyTorch ship it)")
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": getattr(kernel.triton, "__version__", None),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
        "multiprocessors": torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else None,
        "triton_available": kernel.is_available(device),
    }
    print(json.dumps(env, indent=1), flush=True)
    report = {"environment": env}
    sections = [
        ("correctness", lambda: correctness(device, args.tiny)),
        ("sync", lambda: sync_check(device)),
        ("timings", lambda: timings(device, args.tiny)),
    ]
    if not args.no_sweep:
        sections.append(("sweep", lambda: sweep(device, args.tiny)))
    for name, run in sections:
        begin = time.perf_counter()
        try:
            report[name] = run()
        except Exception as error:
            traceback.print_exc()
            report[name] = [dict(error=f"{type(error).__name__}: {error}", ok=False)]
        print(f"[{name}: {time.perf_counter() - begin:.1f} s]", flush=True)
    report["seconds"] = time.perf_counter() - started

    failures = [r for r in report["correctness"] + report["sync"] if r.get("ok") is False]
    md = [f"# GPU check: {env['device']}\n", "```\n" + json.dumps(env, indent=1) + "\n```\n"]
    md.append(f"## Correctness: {len(report['correctness']) - len([r for r in failures if 'path' in r])}"
              f"/{len(report['correctness'])} cases within 1e-12\n")
    shown = [r for r in report["correctness"] if not r.get("ok")] or report["correctness"][-12:]
    md.append(markdown_table(shown, ["case", "path", "ties", "reference", "class_rel_diff", "sample_rel_diff", "ok",
                                     "error"]))
    md.append("\n## No host-device sync\n")
    md.append(markdown_table(report["sync"], ["check", "ok", "triton_kernel_used", "error", "note"]))
    md.append("\n## Timings (median; floor = reading the inputs once)\n")
    md.append(markdown_table(report["timings"], ["case", "path", "ms", "read_floor_ms", "x_floor", "extra_MB",
                                                 "extra_vs_input", "class_rel_diff_vs_sort", "copy_GBps", "error"]))
    if "sweep" in report:
        md.append("\n## Triton tile sweep\n")
        columns = ["case", "block_rows", "tile", "num_warps", "prefetch", "ms", "registers", "spills", "default", "error"]
        md.append(markdown_table(report["sweep"], columns))
    md.append(f"\nTotal: {report['seconds']:.0f} s; failures: {len(failures)}\n")
    text = "\n".join(md)
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps(report, indent=1, default=str))
    print(text)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
