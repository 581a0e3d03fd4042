"""Which backend does the work: the one place that decides, from what each backend says it can serve.

Every backend declares ``unavailable_reason(device[, dtype])``: None when it can take the tensors, else why not, in
words for a warning. The ranking backends are the numba kernel (:mod:`torch_lwlrap._numba_kernel`, CPU tensors) and
the Triton kernel (:mod:`torch_lwlrap._triton_kernel`, CUDA tensors); the torch sort and count paths
(:mod:`torch_lwlrap._torch_paths`) serve every device and dtype, so they are what remains. The compiled CPU passes
beside the ranking (the label counts of :mod:`torch_lwlrap._numba_counts`, the ``"expected"`` rule of
:mod:`torch_lwlrap._numba_rules`, the bootstrap weights of :mod:`torch_lwlrap._bootstrap_kernel`) run where numba
ranks: CPU tensors, numba installed, and an engine setting that lets the CPU take compiled code (``"auto"`` or
``"numba"``; the torch engines keep every step in torch).

The engine setting (:func:`torch_lwlrap._engine_config.get_engine`) picks among the ranking backends:

* ``"auto"``: the backend whose home is the tensors' device (numba for CPU tensors, Triton for CUDA ones) when it
  has no reason against them; a Triton or a numba that is installed but fails to import, or a Triton whose launch
  failed in this process, warns once (:class:`EngineFallbackWarning`) and leaves the batch to the torch path
  (:func:`torch_path`);
* ``"numba"`` or ``"triton"``: that backend, checked by the same reasons; where it has one, the batch takes the
  torch sort path and a warning (once per cause) names the reason and the fix;
* ``"sort"`` or ``"count"``: that torch path.
"""

from __future__ import annotations

import functools
import sys
import threading
from typing import Callable, Dict, Optional

import torch

from torch_lwlrap import (
    _bootstrap_kernel,
    _kernel_contract,
    _ltr_numba,
    _numba_counts,
    _numba_kernel,
    _numba_one_pass,
    _numba_rules,
    _triton_kernel,
)
from torch_lwlrap._engine_config import (
    ENGINE_VARIABLE,
    compiled_cpu_allowed,
    engine_forced_by_block,
    forced_chunk_elements,
    get_engine,
)
from torch_lwlrap._torch_paths import choose_engine
from torch_lwlrap._user_frames import warn

__all__ = [
    "EngineFallbackWarning", "compiled_cpu_pass", "ranking_backend", "ranking_kernel", "reasons", "torch_path",
    "triton_failed", "warn_if_unserved",
]

#: The ranking backends and the device type each serves under ``"auto"``.
RANKING_BACKENDS = {"numba": _numba_kernel, "triton": _triton_kernel}
_HOME_DEVICE = {"numba": "cpu", "triton": "cuda"}

#: The compiled CPU passes beside the ranking, by name.
CPU_PASSES = {
    "counts": _numba_counts, "rules": _numba_rules, "bootstrap": _bootstrap_kernel, "rank_agreement": _ltr_numba,
}


class EngineFallbackWarning(RuntimeWarning):
    """A compiled engine path failed or cannot run, and the batch was ranked on a torch path instead.

    The values stay exact (every path computes the same counts); only the speed differs. Issued once per process
    and cause.
    """


#: The exception that made the Triton kernel fail in this process (then CUDA batches take the torch path), or None.
_triton_failure: Optional[BaseException] = None
_warned: set = set()
_warn_lock = threading.Lock()


def reasons(device, dtype: Optional[torch.dtype] = None) -> Dict[str, Optional[str]]:
    """Each ranking backend's reason against tensors on ``device`` of ``dtype`` (None: it can serve them), the torch
    paths included (they serve everything).

    Example:
        >>> import torch
        >>> reasons("meta", torch.float32)["sort"] is None
        True
    """
    device = torch.device(device)
    found = {name: backend.unavailable_reason(device, dtype) for name, backend in RANKING_BACKENDS.items()}
    if _triton_failure is not None and found["triton"] is None:
        found["triton"] = f"its launch failed in this process ({type(_triton_failure).__name__}: {_triton_failure})"
    return {**found, "sort": None, "count": None}


def ranking_backend(device, dtype: torch.dtype, engine: Optional[str] = None) -> Optional[str]:
    """``"numba"`` or ``"triton"``: the compiled backend that ranks scores of ``dtype`` on ``device`` under
    ``engine`` (the setting in force when None); None: a torch path.

    Example:
        >>> import torch
        >>> ranking_backend("meta", torch.float32, "auto") is None
        True
    """
    if not isinstance(device, torch.device):
        device = torch.device(device)
    engine = get_engine() if engine is None else engine
    if engine == "auto":
        candidates = [name for name, home in _HOME_DEVICE.items() if home == device.type]
    else:
        candidates = [engine] if engine in RANKING_BACKENDS else []
    for name in candidates:
        if name == "triton" and _triton_failure is not None:
            continue
        if RANKING_BACKENDS[name].unavailable_reason(device, dtype) is None:
            return name
    return None


def ranking_kernel(name: str) -> Callable:
    """The launch function of the ranking backend ``name`` (as :func:`ranking_backend` names it)."""
    if name == "numba":
        return functools.partial(_numba_kernel.ranking_sums_numba, chunk_elements=forced_chunk_elements())
    return _triton_kernel.ranking_sums_triton


def one_pass_kernel(preds, target, ties: str, backend: Optional[str]) -> Optional[Callable]:
    """The numba backend's one pass over each row (:func:`torch_lwlrap._numba_one_pass.one_pass_sums`: value checks,
    positives and ranks together) when it ranks this batch: ``backend`` (what :func:`ranking_backend` gave for
    ``preds``) is numba, the pass takes the batch's shapes, dtypes and tie rule, and no chunk size is forced
    (:func:`~torch_lwlrap._engine_config.use_engine` with ``chunk_elements`` forces the chunked passes). None: the
    gate's target helpers and the passes of :func:`ranking_kernel`."""
    if backend != "numba" or forced_chunk_elements() is not None:
        return None
    return _numba_one_pass.one_pass_sums if _numba_one_pass.takes_one_pass(preds, target, ties) else None


def target_helpers(target):
    """The numba backend's target checks and masks (:mod:`torch_lwlrap._numba_kernel`) for a batch the numba path
    ranks, when they take ``target`` (a 2-D CPU target of a dtype numba reads); None: torch's comparisons."""
    return _numba_kernel if _numba_kernel.handles_target(target) else None


def compiled_cpu_pass(name: str, device, dtype: Optional[torch.dtype] = None) -> bool:
    """Whether the compiled CPU pass ``name`` (``"counts"``, ``"rules"``, ``"bootstrap"`` or ``"rank_agreement"``:
    the rank correlations and the Kendall distance) takes tensors on
    ``device`` (of ``dtype``, when given): no reason against them, and the engine setting lets the CPU take compiled
    code (exactly where the numba backend ranks: their reasons are its reasons).

    Example:
        >>> from torch_lwlrap._engine_config import use_engine
        >>> with use_engine("sort"):
        ...     compiled_cpu_pass("bootstrap", "cpu")
        False
    """
    return compiled_cpu_allowed() and CPU_PASSES[name].unavailable_reason(torch.device(device), dtype) is None


def torch_path(engine: str, device, num_samples: int, num_classes: int, class_label_count) -> str:
    """``"sort"`` or ``"count"``: the torch path that ranks a batch no compiled backend takes. A torch engine is
    itself; otherwise ``"auto"`` picks by the label density on the CPU (:func:`torch_lwlrap._torch_paths.choose_engine`,
    from the batch's positives per class, ``class_label_count``), and ``"sort"`` elsewhere: off the CPU the density
    is not known on the host without a sync, and the sort needs none (so does a compiled engine that cannot run).

    Example:
        >>> import torch
        >>> torch_path("auto", "cpu", 20_000, 527, torch.full((527,), 100))
        'count'
    """
    if engine in ("sort", "count"):
        return engine
    if engine != "auto" or torch.device(device).type != "cpu":
        return "sort"
    return choose_engine(num_samples, num_classes, int(class_label_count.sum()))


def _warn_once(key, message: str) -> None:
    with _warn_lock:
        if key in _warned:
            return
        _warned.add(key)
    warn(message, EngineFallbackWarning)  # at the user's line


def triton_failed(error: Exception, device: torch.device) -> None:
    """Record that the Triton kernel failed (CUDA batches take the torch path from now on) and warn once."""
    global _triton_failure
    _triton_failure = error
    _warn_once(
        "triton-failed",
        f"torch_lwlrap: the Triton kernel failed on {device} ({type(error).__name__}: {error}). Ranking with the "
        f"torch sort path from now on in this process: the values stay exact, but ranking is slower. To fix it, "
        f"install the Triton version your PyTorch build was made with (`pip install triton==<version>`, the "
        f"package's `gpu` extra) and an up-to-date GPU driver, or set {ENGINE_VARIABLE}=sort to choose the torch path "
        f"and silence this warning.",
    )


def _numba_runtime_disabled() -> bool:
    """Whether numba is installed with its compiler switched off (``NUMBA_DISABLE_JIT=1``)."""
    numba = sys.modules.get("numba")
    return numba is not None and bool(numba.config.DISABLE_JIT)


def _numba_import_error() -> Optional[Exception]:
    """Why an installed numba failed to import, or None (:data:`torch_lwlrap._numba_runtime.IMPORT_ERROR`, read
    through ``sys.modules``: a module importing the runtime would join the kernels' cache fingerprint)."""
    runtime = sys.modules.get("torch_lwlrap._numba_runtime")
    return None if runtime is None else runtime.IMPORT_ERROR


def warn_if_unserved(engine: str, device: torch.device, dtype: torch.dtype) -> None:
    """Warn (once per cause) where no compiled backend ranks these tensors but one was expected: the backend was
    forced (``TORCH_LWLRAP_ENGINE`` or :func:`~torch_lwlrap.use_engine`) and gives a reason, or ``"auto"`` meets a
    Triton or a numba that is installed but fails to import. Silent for ``"auto"`` where no backend's home is the
    device, for meta tensors (shape-only tests of syncs and memory), and where a compiled backend does serve them."""
    if engine not in RANKING_BACKENDS and engine != "auto":
        return
    if device.type == "meta" or ranking_backend(device, dtype, engine) is not None:
        return
    if engine == "auto":
        if device.type == "cpu" and _numba_import_error() is not None:
            engine = "numba"  # installed, but its import fails: as for Triton below, say why once
        elif device.type not in _triton_kernel.GPU_DEVICE_TYPES or _triton_kernel._IMPORT_ERROR is None:
            return  # no backend's home, Triton not installed, or a GPU older than Volta: the torch path, as documented
        else:
            engine = "triton"
        forced = False
    else:
        forced = True
    if engine == "triton" and _triton_failure is not None:
        return  # said once already, when the launch failed
    reason = RANKING_BACKENDS[engine].unavailable_reason(device, dtype)
    # Where the forced engine comes from, and so how to let the device choose instead.
    to_auto = (
        f"use `use_engine(\"auto\")` (or leave the `use_engine(\"{engine}\")` block)" if engine_forced_by_block()
        else f"set {ENGINE_VARIABLE}=auto (or unset it)"
    )
    on_a_gpu = engine == "triton" and device.type in _triton_kernel.GPU_DEVICE_TYPES
    if device.type != _HOME_DEVICE[engine] and not on_a_gpu:
        where = "the CPU" if engine == "numba" else "a CUDA GPU"
        fix = f"move the tensors to {where}, or {to_auto} to pick by device"
    elif dtype not in _kernel_contract.SCORE_DTYPES:
        fix = "pass float16, bfloat16, float32 or float64 scores"
    elif engine == "numba" and _numba_runtime_disabled():
        fix = "unset NUMBA_DISABLE_JIT"
    elif engine == "numba" and _numba_import_error() is not None:
        fix = (
            "make `import numba` work (a NUMBA_* environment variable it refuses, or a numba that does not match "
            "this numpy: `pip install -U numba`)"
        )
    elif engine == "numba":
        fix = "install it with `pip install numba` (the package's `cpu` extra)"
    elif _triton_kernel.triton is None:
        fix = "install a Triton that matches your PyTorch with `pip install triton` (the package's `gpu` extra)"
    else:
        fix = f"{to_auto}, which takes the torch path on this GPU silently"
    name = engine if forced else "auto"
    # The torch path it takes (torch_path): "sort", but under "auto" on the CPU whichever the label density picks.
    path = "sort path" if forced or device.type != "cpu" else "path that suits each batch (sort or count)"
    _warn_once(
        ("unavailable", name, reason),
        f"torch_lwlrap: the {name} engine cannot rank {device} tensors: {reason}. Ranking with the torch {path} "
        f"instead (exact, slower); to fix it, {fix}.",
    )
