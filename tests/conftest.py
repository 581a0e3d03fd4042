"""Shared test fixtures: engine paths, devices and hypothesis profiles.

* ``engine``: every ranking path the engine offers ("sort", "count", "numba" for CPU tensors where numba is
  installed, and "triton" where Triton is installed and a CUDA device is present), entered with :func:`torch_lwlrap._ranking.use_engine` for the whole test; a path that
  cannot run on the test's ``device`` is skipped.
* ``device``: "cpu", plus "cuda" when a CUDA device is present.
* ``fake_triton``: the Triton path's host code on ``meta`` tensors, with the kernel launches recorded.
* autouse: in-process runs of the command line print no compile notice (subprocess tests see it).
* hypothesis profiles: ``ci`` (the default: modest example counts, no deadline), ``dev`` (quick) and ``thorough``
  (many examples); pick one with the environment variable ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

from torch_lwlrap._ranking import ENGINES as _ENGINE_NAMES
from torch_lwlrap._ranking import use_engine

CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _no_compile_notice(monkeypatch):
    """In-process runs of the command line (``cli.main([...])``) check that stderr stays empty; the first compile of
    a kernel in the test process (an empty numba cache) must not change that. Tests that run the command line as a
    subprocess see the notice (``tests/test_cli_errors.py``)."""
    from torch_lwlrap import cli

    monkeypatch.setattr(cli, "compile_notice", contextlib.nullcontext)

#: Devices every device-parametrized test runs on.
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def _triton_runs_on(device: str) -> bool:
    """Whether the "triton" path runs its kernel (rather than falling back) on ``device``.

    Only CUDA devices count: Triton's CPU interpreter (``TRITON_INTERPRET=1``) is far too slow for these suites and
    is exercised by ``tests/test_triton.py``.
    """
    if "triton" not in _ENGINE_NAMES or not device.startswith("cuda"):
        return False
    try:
        from torch_lwlrap import _triton_kernel
    except ImportError:
        return False
    return _triton_kernel.is_available(device)


def _numba_runs_on(device: str) -> bool:
    """Whether the "numba" path runs its compiled kernel (rather than falling back) on ``device``."""
    from torch_lwlrap import _numba_kernel

    return _numba_kernel.is_available(device)


def engine_paths_for(device: str) -> list:
    """The concrete engine paths ("auto" only picks one of them) that rank tensors on ``device``."""
    return (
        ["sort", "count"]
        + (["numba"] if _numba_runs_on(device) else [])
        + (["triton"] if _triton_runs_on(device) else [])
    )


#: Every engine path that runs on at least one of :data:`DEVICES`.
ENGINE_PATHS = list(dict.fromkeys(name for device in DEVICES for name in engine_paths_for(device)))


settings.register_profile(
    "ci", max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.register_profile("dev", max_examples=15, deadline=None)
settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each available device: "cpu", and "cuda" when present."""
    return request.param


@pytest.fixture(params=ENGINE_PATHS)
def engine(request) -> str:
    """Each engine path, forced for the duration of the test."""
    name = request.param
    device = request.getfixturevalue("device") if "device" in request.fixturenames else "cpu"
    if name not in engine_paths_for(device):
        pytest.skip(f"the {name} path does not run on {device}")
    with use_engine(name):
        yield name


def pytest_collection_modifyitems(config, items):
    """Tests that take :func:`fake_triton` are marked ``fake_triton``: they skip where Triton is not installed, so
    CI's Triton steps select them by the mark (``.ci/run``)."""
    for item in items:
        if "fake_triton" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.fake_triton)


@pytest.fixture
def fake_triton(monkeypatch):
    """The Triton path on ``meta`` tensors (forced with ``use_engine("triton")``), every step of it but the kernel
    itself, which is recorded instead of run: ``(kernel name, grid, arguments, keyword arguments)`` per launch, each
    tensor argument recorded as its ``(shape, dtype)`` (holding the tensors would keep them alive).

    Meta tensors have shapes and no values, so this runs the host side of a GPU launch on any machine with Triton
    installed (no GPU needed; skipped without Triton, and run by CI's Triton steps): what it reads on the host
    (``tests/test_sync.py``) and what it allocates (``tests/test_memory.py``)."""
    kernel = pytest.importorskip("torch_lwlrap._triton_kernel")
    if kernel.triton is None:
        pytest.skip("Triton is not installed")
    launches = []

    class FakeKernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                args = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
                launches.append((self.name, grid, args, kwargs))

            return launch

    monkeypatch.setattr(
        kernel, "unavailable_reason", lambda device, dtype=None: None if torch.device(device).type == "meta" else "off"
    )
    monkeypatch.setattr(kernel, "_rows_kernel", FakeKernel("_rows_kernel"))
    monkeypatch.setattr(kernel, "_tiled_kernel", FakeKernel("_tiled_kernel"))
    return launches
