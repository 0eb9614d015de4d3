"""Device policy: the ``device`` parameter, array_api_strict estimators, imports."""

import pickle
import subprocess
import sys

import numpy as np
import pytest

from ilargi_sklearn._backend._gpu import probe_gpu
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    to_numpy,
)
from ilargi_sklearn.linear_model import FactorizedLinearRegression
from ilargi_sklearn.utils._testing import random_dataset

xps = pytest.importorskip("array_api_strict")
DEV = xps.Device("device1")


def test_import_leaves_optional_backends_out():
    code = (
        "import sys, ilargi_sklearn, ilargi_sklearn.linear_model, "
        "ilargi_sklearn.cluster, ilargi_sklearn.decomposition, "
        "ilargi_sklearn.preprocessing\n"
        "bad = [m for m in ('cupy', 'cupyx', 'cuml', 'catboost', 'dask') "
        "if m in sys.modules]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_probe_never_raises_and_gpu_request_carries_its_reason():
    usable, reason = probe_gpu()
    assert isinstance(reason, str) and reason
    if usable:
        pytest.skip(f"a GPU is usable here: {reason}")
    ds = random_dataset(0)
    with pytest.raises(RuntimeError, match="no GPU is usable") as info:
        ds.to_device("gpu")
    assert reason in str(info.value)
    y = np.zeros(len(ds))
    with pytest.raises(RuntimeError) as info:
        FactorizedLinearRegression(device="gpu").fit(ds, y)
    assert reason in str(info.value)


def test_bad_device_value():
    with pytest.raises(ValueError, match="device"):
        FactorizedLinearRegression(device="tpu").fit(np.ones((3, 2)), np.ones(3))
    with pytest.raises(ValueError, match="device must be"):
        random_dataset(0).to_device("tpu")


@pytest.mark.parametrize("scenario", ["star", "left", "snowflake", "float32"])
@pytest.mark.parametrize("weighted", [False, True])
def test_linear_regression_on_strict_device(scenario, weighted):
    ds = random_dataset(7, scenario=scenario, n_rows=80)
    rng = np.random.default_rng(0)
    y = ds.operator.matmul(rng.standard_normal(ds.shape[1])) + rng.standard_normal(
        len(ds)
    )
    sw = rng.random(len(ds)) + 0.5 if weighted else None
    ref = FactorizedLinearRegression().fit(ds, y, sample_weight=sw)
    dd = ds.to_device(DEV, namespace=xps)
    yd = asarray_on(y, xps, DEV)
    swd = None if sw is None else asarray_on(sw, xps, DEV)
    est = FactorizedLinearRegression().fit(dd, yd, sample_weight=swd)
    tol = 1e-4 if ds.dtype == np.float32 else 1e-8
    # Fitted attributes stay where the fit ran.
    assert get_namespace(est.coef_) is xps and device_of(est.coef_) == DEV
    np.testing.assert_allclose(to_numpy(est.coef_), ref.coef_, rtol=tol, atol=tol)
    np.testing.assert_allclose(
        float(to_numpy(est.intercept_)), ref.intercept_, rtol=tol, atol=tol
    )
    # Predictions in the caller's namespace: device data gives device results ...
    pred = est.predict(dd)
    assert get_namespace(pred) is xps and device_of(pred) == DEV
    np.testing.assert_allclose(to_numpy(pred), ref.predict(ds), rtol=tol, atol=tol)
    # ... and host data gives NumPy, with the device-fitted model.
    pred_host = est.predict(ds)
    assert isinstance(pred_host, np.ndarray)
    np.testing.assert_allclose(pred_host, ref.predict(ds), rtol=tol, atol=tol)
    # device="cpu" computes on the host and answers in the caller's namespace.
    est.set_params(device="cpu")
    pred_cpu = est.predict(dd)
    assert get_namespace(pred_cpu) is xps and device_of(pred_cpu) == DEV


def test_linear_regression_on_strict_arrays_and_pickle():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((50, 4))
    y = X @ np.array([1.0, -2.0, 0.5, 3.0]) + 1.5
    Xd, yd = asarray_on(X, xps, DEV), asarray_on(y, xps, DEV)
    est = FactorizedLinearRegression().fit(Xd, yd)
    assert get_namespace(est.coef_) is xps
    np.testing.assert_allclose(to_numpy(est.coef_), [1.0, -2.0, 0.5, 3.0], atol=1e-9)
    # Pickles hold NumPy arrays: a device-trained model loads without the device.
    loaded = pickle.loads(pickle.dumps(est))
    assert isinstance(loaded.coef_, np.ndarray)
    np.testing.assert_allclose(loaded.predict(X), y, atol=1e-9)
    pred = loaded.predict(Xd)
    assert get_namespace(pred) is xps
    np.testing.assert_allclose(to_numpy(pred), y, atol=1e-9)


def test_strategy_materialized_on_device_and_set_params():
    ds = random_dataset(2, scenario="many_to_many")
    y = np.random.default_rng(1).standard_normal(len(ds))
    ref = FactorizedLinearRegression().fit(ds, y)
    est = FactorizedLinearRegression().set_params(strategy="materialized")
    est.fit(ds.to_device(DEV, namespace=xps), asarray_on(y, xps, DEV))
    np.testing.assert_allclose(to_numpy(est.coef_), ref.coef_, rtol=1e-8, atol=1e-8)
