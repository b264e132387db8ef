"""Shared fixtures: where ../shared is, and a clear skip when it is absent outside CI."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# The suite runs darkpy's library in this one process, as the `darkpy` command runs it: with the
# command's own OpenMP/OpenBLAS settings (darkpy/process.py), set here before numpy is first
# imported. Without them numba's OpenMP pool and OpenBLAS's workers spin against each other on a
# 2-core machine (a digits run 7x slower). The tests of what importing darkpy changes start their
# own processes with these variables removed.
from darkpy.process import set_command_environment  # noqa: E402  (imports nothing heavy)

set_command_environment()

# A suite started in the background of a shell without job control (`nohup ... &`) inherits SIGINT
# ignored; the Ctrl-C tests need Python's own handler, which a terminal or CI gives.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DARKPY_SHARED", ROOT.parent / "shared")).resolve()


def shared_path(*parts: str) -> Path:
    """A path under ../shared; skips the test (fails in CI) when the folder is missing."""
    p = SHARED.joinpath(*parts)
    if not SHARED.is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED} is missing: CI must have ../shared beside the clone")
        pytest.skip(f"../shared not found at {SHARED} (set DARKPY_SHARED); reference data unavailable")
    return p


@pytest.fixture
def shared():
    return shared_path()


@pytest.fixture
def blas_state():
    """darkpy.blas as it was before the test (which may `configure` it): its state, and
    OpenBLAS's thread count."""
    from darkpy import blas
    saved = dict(blas._state)
    yield
    blas._state.update(saved)
    if saved["set"] and saved["current"] is not None:
        saved["set"](saved["current"])
