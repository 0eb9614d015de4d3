"""The compiled-kernel launcher (``_backend/_launcher.py``): optional numba, never imported early."""

import subprocess
import sys

import numpy as np
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


# ------------------------------------------------------------- read-only inputs
def test_read_only_memory_maps_keep_the_compiled_kernels(tmp_path, caplog):
    # joblib's workers and np.load(mmap_mode="r") hand over read-only arrays, next
    # to writable ones: numba cannot index a tuple that mixes the two, and a
    # failure there disabled the compiled kernels for the process.
    from ilargi_sklearn.cluster import FactorizedKMeans
    from ilargi_sklearn.linear_model import FactorizedLogisticRegression
    from ilargi_sklearn.multisource import MultiSourceDataset

    rng = np.random.default_rng(0)
    n = 3000
    arrays = {
        "S": rng.standard_normal((n, 3)),
        "R1": rng.standard_normal((100, 8)),
        "R2": rng.standard_normal((50, 8)),
        "fk1": rng.integers(0, 100, n),
        "fk2": rng.integers(0, 50, n),
    }
    mapped = {}
    for name in ("S", "R1", "fk1"):  # the rest stay writable
        np.save(tmp_path / f"{name}.npy", arrays[name])
        mapped[name] = np.load(tmp_path / f"{name}.npy", mmap_mode="r")
        assert not mapped[name].flags.writeable
    mixed = {**arrays, **mapped}

    def build(a):
        return MultiSourceDataset.from_matrices(
            [a["S"], a["R1"], a["R2"]], [None, a["fk1"], a["fk2"]]
        )

    ds, ro = build(arrays), build(mixed)
    y = (ds.materialize()[:, 0] > 0).astype(float)
    v = rng.standard_normal(ds.shape[1])
    u = rng.standard_normal(n)

    def results(d):
        return [
            d.gram(),
            d @ v,
            d.T @ u,
            FactorizedKMeans(3, n_init=1, random_state=0).fit(d).cluster_centers_,
            FactorizedLogisticRegression().fit(d, y).coef_,
        ]

    try:
        with caplog.at_level("WARNING", logger=_launcher.logger.name):
            got = results(ro)
        assert _launcher.numba_available()
        assert not [r for r in caplog.records if "from now on" in r.getMessage()]
    finally:
        _launcher._state["numba"] = None  # let the next test probe again
    want = results(ds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
