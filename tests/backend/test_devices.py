"""Device policy: the ``device`` parameter, array_api_strict estimators, imports."""

import importlib.machinery
import importlib.util
import json
import pickle
import subprocess
import sys
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, assert_same_linear_model, strict_namespace

from ilargi_sklearn._backend import _gpu
from ilargi_sklearn._backend._gpu import probe_gpu
from ilargi_sklearn._backend._namespace import (
    asarray_on,
    device_of,
    get_namespace,
    to_numpy,
)
from ilargi_sklearn.linear_model import FactorizedLinearRegression
from ilargi_sklearn.utils._testing import random_dataset

xps, DEV = strict_namespace()


def test_import_leaves_optional_backends_out():
    code = (
        "import sys, ilargi_sklearn, ilargi_sklearn.linear_model, "
        "ilargi_sklearn.cluster, ilargi_sklearn.decomposition, "
        "ilargi_sklearn.preprocessing\n"
        "bad = [m for m in ('cupy', 'cupyx', 'cuml', 'rmm', 'catboost', 'dask', "
        "'numba', 'array_api_strict') "
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
    # Fitted attributes stay where the fit ran.
    assert get_namespace(est.coef_) is xps and device_of(est.coef_) == DEV
    assert_same_linear_model(est, ref, dtype=ds.dtype, kind="fit")
    # Predictions in the caller's namespace: device data gives device results ...
    pred = est.predict(dd)
    assert get_namespace(pred) is xps and device_of(pred) == DEV
    assert_close(pred, ref.predict(ds), dtype=ds.dtype, kind="fit")
    # ... and host data gives NumPy, with the device-fitted model.
    pred_host = est.predict(ds)
    assert isinstance(pred_host, np.ndarray)
    assert_close(pred_host, ref.predict(ds), dtype=ds.dtype, kind="fit")
    # device="cpu" computes on the host and answers in the caller's namespace.
    est.set_params(device="cpu")
    pred_cpu = est.predict(dd)
    assert get_namespace(pred_cpu) is xps and device_of(pred_cpu) == DEV


@pytest.mark.parametrize("weighted", [False, True])
def test_linear_gd_on_strict_device_equals_numpy(weighted):
    # The gradient-descent kernel is the NumPy one: the same steps on the device.
    ds = random_dataset(4, scenario="star", n_rows=80)
    rng = np.random.default_rng(1)
    y = ds.operator.matmul(rng.standard_normal(ds.shape[1])) + 2.0
    sw = rng.random(len(ds)) + 0.5 if weighted else None
    kw = dict(solver="gd", max_iter=15, tol=0.0)
    ref = FactorizedLinearRegression(**kw).fit(ds, y, sample_weight=sw)
    dd = ds.to_device(DEV, namespace=xps)
    swd = None if sw is None else asarray_on(sw, xps, DEV)
    est = FactorizedLinearRegression(**kw).fit(dd, asarray_on(y, xps, DEV), swd)
    assert get_namespace(est.coef_) is xps and est.n_iter_ == ref.n_iter_
    np.testing.assert_allclose(to_numpy(est.coef_), ref.coef_, rtol=1e-10)
    np.testing.assert_allclose(
        float(to_numpy(est.intercept_)), ref.intercept_, rtol=1e-10
    )


def test_linear_sparse_on_device_is_unsupported():
    from ilargi_sklearn._backend._plan import UnsupportedOnDeviceError
    from ilargi_sklearn.linear_model import _base

    class SparseOnDevice:
        is_sparse = True
        xp = xps

    with pytest.raises(UnsupportedOnDeviceError, match="device='cpu'"):
        _base._check_device_support(SparseOnDevice())


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


# -- the probe's code path, with a fake CuPy built from NumPy and SciPy ---------------
def _fake_cupy(monkeypatch, *, count=1, warn=False, add_at=None, raises=None):
    """Install a ``cupy``/``cupyx`` made of NumPy and SciPy in ``sys.modules``."""

    def get_device_count():
        if warn:
            warnings.warn("a deprecated CUDA call", DeprecationWarning, stacklevel=2)
        if raises is not None:
            raise raises
        return count

    class Device:
        def synchronize(self):
            return None

    cupy = types.ModuleType("cupy")
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    for name in ("arange", "zeros", "ones", "asarray", "float64", "int32"):
        setattr(cupy, name, getattr(np, name))
    cupy.add = types.SimpleNamespace(at=add_at or np.add.at)
    cupy.cuda = types.SimpleNamespace(
        Device=Device,
        runtime=types.SimpleNamespace(
            getDeviceCount=get_device_count,
            getDeviceProperties=lambda i: {"name": b"Fake GPU"},
        ),
    )
    cupyx = types.ModuleType("cupyx")
    cupyx.scipy = types.ModuleType("cupyx.scipy")
    cupyx.scipy.sparse = sp
    for name, mod in (
        ("cupy", cupy),
        ("cupyx", cupyx),
        ("cupyx.scipy", cupyx.scipy),
        ("cupyx.scipy.sparse", sp),
    ):
        monkeypatch.setitem(sys.modules, name, mod)


@pytest.fixture
def fresh_probe(monkeypatch):
    """The probe's cache emptied before and after (the fake must not leak)."""
    probe_gpu.cache_clear()
    yield monkeypatch
    probe_gpu.cache_clear()


def test_probe_accepts_a_working_backend_despite_deprecations(fresh_probe):
    _fake_cupy(fresh_probe, warn=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # as pytest's error::DeprecationWarning
        usable, reason = probe_gpu()
    assert usable, reason
    assert reason == "Fake GPU (1 device(s))"
    assert _gpu.gpu_usable() and _gpu.gpu_reason() == reason


def test_probe_rejects_a_wrong_scatter_add(fresh_probe):
    _fake_cupy(fresh_probe, add_at=lambda out, idx, vals: None)
    assert probe_gpu() == (False, "scatter-add smoke test gave a wrong result")


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(count=0), "CuPy sees no CUDA device"),
        (
            dict(raises=RuntimeError("cudaErrorNoDevice")),
            "no CUDA device is visible to CuPy (RuntimeError: cudaErrorNoDevice)",
        ),
    ],
)
def test_probe_without_a_device(fresh_probe, kwargs, expected):
    _fake_cupy(fresh_probe, **kwargs)
    assert probe_gpu() == (False, expected)


def test_probe_reports_a_failing_smoke_test(fresh_probe):
    def broken(out, idx, vals):
        raise MemoryError("out of memory allocating 16 bytes")

    _fake_cupy(fresh_probe, add_at=broken)
    usable, reason = probe_gpu()
    assert not usable
    assert reason == (
        "GPU smoke test failed (MemoryError: out of memory allocating 16 bytes)"
    )


# -- benchmarks/gpu_check.py: the no-GPU line and the dry run ---------------------------
def _gpu_check():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("_gpu_check_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_prints_no_gpu_and_exits_0(capsys, no_gpu):
    assert _gpu_check().main([]) == 0
    assert capsys.readouterr().out.strip() == f"no GPU: {no_gpu}"


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_gpu_check_dry_run_runs_every_phase(tmp_path, capsys):
    gpu_check = _gpu_check()
    args = ["--dry-run", "--skip-tests", "--rows", "300", "--repeats", "1"]
    assert gpu_check.main([*args, "--out", str(tmp_path)]) == 0
    records = [
        json.loads(line)
        for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()
    ]
    assert not [r for r in records if r["status"] == "fail"]
    api = {r["name"] for r in records if r["phase"] == "api"}
    assert {"add_at", "scatter_add", "indicator", "sparse_ops", "linalg"} <= api
    timed = [r for r in records if r["phase"] == "time"]
    names = {r["name"] for r in timed}
    assert set(gpu_check.OPS) <= names and {"kmeans", "gnmf"} <= names
    # The "GPU" side agrees with the CPU side.
    deviations = [r["gpu_deviation"] for r in timed if "gpu_deviation" in r]
    assert deviations and max(deviations) < 1e-8
    # The table is printed last, and is also the table file.
    out = capsys.readouterr().out
    table = (tmp_path / "gpu_check_table.txt").read_text().rstrip()
    assert out.rstrip().endswith(table)
    assert "materialized" in table.splitlines()[-1]
    # Every timed fit of a planned estimator is also a cost-model training record.
    from ilargi_sklearn.planner import read_records
    from ilargi_sklearn.planner._cost_model import training_table

    train = read_records(tmp_path / gpu_check.TRAINING_RECORDS_FILE)
    assert {r["estimator"] for r in train} == {"linear", "logistic", "kmeans", "gnmf"}
    assert {r["plan"] for r in train} == {
        f"{p}-{d}" for p in ("factorized", "materialized") for d in ("cpu", "gpu")
    }
    assert all(r["features"]["n_rows"] == 300 and r["seconds"] > 0 for r in train)
    _, X, y = training_table(train)
    assert X.shape[0] == len(train) and np.isfinite(y).all()


def test_gpu_check_records_failures_and_budget(tmp_path, monkeypatch):
    gpu_check = _gpu_check()

    def planted(bk):
        raise RuntimeError("planted failure")

    monkeypatch.setattr(gpu_check, "API_CHECKS", (planted, gpu_check.api_take))
    args = ["--dry-run", "--skip-tests", "--budget", "0", "--out", str(tmp_path)]
    assert gpu_check.main(args) == 1
    records = [
        json.loads(line)
        for line in (tmp_path / "gpu_check.jsonl").read_text().splitlines()
    ]
    by_name = {r["name"]: r for r in records}
    assert by_name["planted"]["status"] == "fail"
    assert by_name["planted"]["detail"] == "RuntimeError: planted failure"
    # One failing check does not stop the next; the spent budget skips the timings.
    assert by_name["take"]["status"] == "ok"
    assert by_name["star"]["status"] == "skip"
    assert not [r for r in records if r["phase"] == "time"]
