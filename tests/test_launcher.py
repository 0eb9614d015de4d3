"""The compiled-kernel launcher (``_backend/_launcher.py``): optional numba, never imported early."""

import subprocess
import sys

import pytest
from threadpoolctl import threadpool_limits

from ilargi_sklearn._backend import _launcher

numba = pytest.importorskip("numba")


# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


# ------------------------------------------------------------------- availability
def test_numba_is_not_imported_with_the_package():
    code = (
        "import sys, ilargi_sklearn\n"
        "from ilargi_sklearn.cluster import FactorizedKMeans\n"
        "from ilargi_sklearn.linear_model import FactorizedLinearRegression\n"
        "print('numba' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


def test_environment_variable_disables_the_kernels(monkeypatch):
    monkeypatch.delenv(_launcher.NO_NUMBA_ENV, raising=False)
    assert _launcher.numba_available()
    monkeypatch.setenv(_launcher.NO_NUMBA_ENV, "1")
    assert not _launcher.numba_available()
    monkeypatch.setenv(_launcher.NO_NUMBA_ENV, "0")
    assert _launcher.numba_available()


def test_threads_follow_the_openmp_limit():
    with threadpool_limits(limits=1, user_api="openmp"):
        assert _launcher.n_threads() == 1
    assert 1 <= _launcher.n_threads() <= numba.get_num_threads()
