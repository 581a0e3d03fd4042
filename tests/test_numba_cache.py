"""numba's disk cache follows every source a kernel is built from, not only the kernel's own module
(``torch_lwlrap._numba_runtime.clear_stale_cache``): after an edit to a function or a constant that a cached kernel
takes from another module, the next process computes with the new code, as a developer's checkout after ``git pull``
must."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("numba")

from torch_lwlrap import _numba_runtime  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

#: A package laid out as this one: a kernel module that takes a function and a constant from two modules below it,
#: and a module above it that calls the kernel (editing it must keep the cache).
PACKAGE = {
    "__init__.py": "",
    "constants.py": "FACTOR = 3\n",
    "helper.py": (
        "from torch_lwlrap._numba_runtime import serial_kernel\n\n\n"
        "@serial_kernel\ndef base():\n    return 1\n"
    ),
    "kernels.py": (
        "from torch_lwlrap._numba_runtime import clear_stale_cache, serial_kernel\n"
        "from fakepkg.constants import FACTOR\n"
        "from fakepkg.helper import base\n\n\n"
        "def anchor():\n    pass\n\n\n"
        "CLEARED = clear_stale_cache(anchor, 'fakepkg')\n\n\n"
        "@serial_kernel\ndef value():\n    return FACTOR * base()\n"
    ),
    "api.py": "from fakepkg.kernels import CLEARED, value\n\nNAME = 'api'\n",
}


def _run(root: Path) -> tuple:
    """``(cleared, value)`` from a fresh process that imports the package in ``root`` and calls its kernel."""
    env = {key: value for key, value in os.environ.items() if key != "NUMBA_CACHE_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), str(ROOT)])
    done = subprocess.run(
        [sys.executable, "-c", "import fakepkg.api as api; print(api.CLEARED, api.value())"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    cleared, value = done.stdout.split()
    return cleared == "True", int(value)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_an_edit_to_a_function_or_constant_of_another_module_reaches_the_cached_kernel(tmp_path):
    package = tmp_path / "fakepkg"
    package.mkdir()
    for name, text in PACKAGE.items():
        (package / name).write_text(text)
    cache = package / "__pycache__"

    assert _run(tmp_path) == (False, 3)  # compiled and cached (nothing to remove yet)
    index = [path for path in cache.glob("*.nbi") if path.name.startswith("kernels.value")]
    assert len(index) == 1
    assert _run(tmp_path) == (False, 3)  # loaded from the cache, which stays

    _edit(package / "helper.py", "return 1", "return 2")  # the called function: kernels.py is unchanged
    assert _run(tmp_path) == (True, 6)  # numba alone would load the kernel built with the old base(): 3
    _edit(package / "constants.py", "FACTOR = 3", "FACTOR = 5")  # a constant the kernel reads
    assert _run(tmp_path) == (True, 10)

    _edit(package / "api.py", "'api'", "'api, edited'")  # above the kernels: their cache stays
    assert _run(tmp_path) == (False, 10)
    assert any(path.name.startswith("kernels.value") for path in cache.glob("*.nbi"))


def test_every_module_with_compiled_code_is_among_the_kernel_sources():
    # A module that defines a kernel or a vector primitive must be in the fingerprint, whatever its imports.
    package = Path(_numba_runtime.__file__).resolve().parent
    sources = {path.name for path in _numba_runtime.kernel_sources(package, "torch_lwlrap")}
    compiled = {
        path.name for path in package.glob("*.py")
        if re.search(r"@(serial_kernel|parallel_and_serial|intrinsic|njit)\b|parallel_and_serial\(", path.read_text())
    }
    assert {"_numba_kernel.py", "_ltr_numba.py", "_ltr_sort.py", "_numba_vector.py"} <= compiled
    assert compiled <= sources
    # ... and the modules they take constants from, which compile into the kernels' code.
    assert {"_engine_config.py", "_kernel_contract.py", "_poisson.py"} <= sources
    assert not sources & {"_dispatch.py", "_ranking.py", "doctor.py", "__init__.py"}


def test_another_numba_version_clears_the_cache(tmp_path, monkeypatch):
    # CI's lowest-versions step (numba 0.59.1) shares the checkout's __pycache__ with numba 0.68.1: it loaded a file
    # of the newer numba ("Opaque pointers are only supported in -opaque-pointers mode"). The versions are in the
    # fingerprint, so the other version's files are removed before anything loads them.
    package = tmp_path / "fakepkg"
    package.mkdir()
    for name, text in PACKAGE.items():
        (package / name).write_text(text)
    assert _run(tmp_path) == (False, 3)
    assert _run(tmp_path) == (False, 3)  # the same numba: the cache stays
    stamp = next((package / "__pycache__").glob("fakepkg.kernel-sources.sha256"))
    mine = stamp.read_text()
    monkeypatch.setattr(_numba_runtime.numba, "__version__", "0.1.0")
    sys.path.insert(0, str(tmp_path))
    try:
        import fakepkg.kernels as kernels  # the other version's import: this version's files go
        other, cleared = stamp.read_text(), kernels.CLEARED
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name == "fakepkg" or name.startswith("fakepkg.")]:
            del sys.modules[name]
    assert other != mine and cleared
    assert not list((package / "__pycache__").glob("kernels.value*.nbc"))
    assert _run(tmp_path) == (False, 3)  # back to this numba: compiled again, its own fingerprint written
    assert stamp.read_text() == mine


def test_without_a_folder_to_cache_in_the_kernels_compile_in_the_process(tmp_path):
    """No cache locator (the package's folder, NUMBA_CACHE_DIR and the user's cache folder all read-only, as in a
    hardened container; simulated by giving numba no locator): numba's error had failed the package's import, every
    engine with it. The kernels now compile without the disk cache, with one warning, and give the torch paths'
    values."""
    code = (
        "import warnings\n"
        "import numba.core.caching as caching\n"
        "caching.CacheImpl._locator_classes = []\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import torch, torch_lwlrap as T\n"
        "    from torch_lwlrap import use_engine\n"
        "    g = torch.Generator().manual_seed(0)\n"
        "    p, y = torch.rand(300, 40, generator=g), torch.rand(300, 40, generator=g) < 0.3\n"
        "    compiled = (T.multilabel_lwlrap(p, y), T.multilabel_rank_correlation(p, p.flip(1), method='kendall'))\n"
        "    with use_engine('sort'):\n"
        "        plain = (T.multilabel_lwlrap(p, y), T.multilabel_rank_correlation(p, p.flip(1), method='kendall'))\n"
        "from torch_lwlrap import _numba_runtime\n"
        "assert _numba_runtime.cache_failure is not None\n"
        "assert _numba_runtime.numba is not None\n"
        "messages = [str(w.message) for w in seen if 'no writable folder' in str(w.message)]\n"
        "assert len(messages) == 1 and 'NUMBA_CACHE_DIR' in messages[0], [str(w.message) for w in seen]\n"
        "print(*[float(v) for v in compiled + plain])\n"
    )
    environment = dict(os.environ, PYTHONPATH=str(ROOT), NUMBA_CACHE_DIR=str(tmp_path))
    environment.pop("TORCH_LWLRAP_ENGINE", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environment, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    lwlrap, kendall, plain_lwlrap, plain_kendall = map(float, done.stdout.split())
    assert lwlrap == pytest.approx(plain_lwlrap, abs=1e-12) and kendall == pytest.approx(plain_kendall, abs=1e-12)
    assert not any(tmp_path.rglob("*.nbi"))  # nothing cached
