"""Every CuPy / cupyx call pattern of the package, against NumPy and SciPy.

The checks live in ``benchmarks/gpu_check.py`` (its ``api`` phase, which also runs
them with NumPy standing in for CuPy in ``--dry-run``); here they run as tests with
the real CuPy, where a usable GPU exists, and skip with the probe's reason elsewhere.
"""

import importlib.util
from pathlib import Path

import pytest
from _helpers import gpu_marks

pytestmark = gpu_marks()


def _gpu_check():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("_gpu_check_api", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_CHECK = _gpu_check()


@pytest.fixture(scope="module")
def backend():
    return _CHECK.Backend(dry_run=False)


@pytest.mark.parametrize(
    "check", _CHECK.API_CHECKS, ids=[c.__name__ for c in _CHECK.API_CHECKS]
)
def test_cupy_call_pattern(backend, check):
    out = check(backend)
    # A check returns a description of what it verified (or raises).
    assert out is not None
