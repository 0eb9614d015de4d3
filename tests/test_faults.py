"""Faults never crash, caches never go stale in silence.

A damaged cost model file, hardware figures that are not rates, a damaged numba
cache or model file, a stale cache after an in-place change, a dataset that was
moved to a device: each gives the right answer or one clear warning or error,
never a crash. The crashes are provoked in subprocesses, so that a regression
fails its test instead of taking the test run down.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

from ilargi_sklearn.planner import _hardware
from ilargi_sklearn.planner._cost_model import (
    checksum_path,
    load_cost_model,
    save_cost_model,
    shipped_model_path,
)


def _python(code: str, env: dict[str, str] | None = None, timeout: int = 300):
    """Run ``code`` in a fresh interpreter; (return code, stdout, stderr)."""
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        # Not the repository root: the package is imported as installed.
        cwd=tempfile.gettempdir(),
        env={**os.environ, **(env or {})},
    )
    return out.returncode, out.stdout, out.stderr


def _flip(data: bytes, fraction: float) -> bytes:
    """``data`` with one byte flipped, at ``fraction`` of its length."""
    b = bytearray(data)
    b[int(fraction * len(b))] ^= 0xFF
    return bytes(b)


# ------------------------------------------------------------ cost model files
#: A byte in CatBoost's tree arrays (about 94% into the shipped model): flipped,
#: the native loader reads out of bounds and the process dies of SIGSEGV.
SEGFAULT_AT = 0.94

needs_model = pytest.mark.skipif(
    not shipped_model_path().is_file(), reason="no shipped cost model"
)


@pytest.fixture
def damaged_user_model(tmp_path):
    """A cache folder whose calibrated model has one byte flipped (its checksum
    file is the intact model's)."""
    pytest.importorskip("catboost")
    cache = tmp_path / "cache"
    cache.mkdir()
    good = shipped_model_path().read_bytes()
    (cache / "cost_model.cbm").write_bytes(_flip(good, SEGFAULT_AT))
    checksum_path(cache / "cost_model.cbm").write_text(
        checksum_path(shipped_model_path()).read_text()
    )
    return cache


@needs_model
def test_damaged_user_model_falls_back_to_the_shipped_one(damaged_user_model):
    """The reported crash: one flipped byte in the calibrated model killed every
    AutoPlan fit (SIGSEGV in CatBoost's loader). Now the file fails its checksum
    before CatBoost sees it, and the shipped model is used, with one warning."""
    code = """
        import warnings
        from ilargi_sklearn import AutoPlan, FactorizedLinearRegression
        from ilargi_sklearn.datasets import make_multi_source
        from ilargi_sklearn.planner import load_cost_model, shipped_model_path
        d = make_multi_source(n_rows=300, random_state=0)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            auto = AutoPlan(FactorizedLinearRegression()).fit(d.dataset, d.target)
            auto = AutoPlan(FactorizedLinearRegression()).fit(d.dataset, d.target)
        msgs = [str(x.message) for x in w if "cost model" in str(x.message)]
        assert len(msgs) == 1, msgs
        print(msgs[0])
        model = load_cost_model("default")
        assert model.is_learned and model.source == str(shipped_model_path())
        print("fitted", auto.plan_)
    """
    rc, out, err = _python(code, {"ILARGI_CACHE_DIR": str(damaged_user_model)})
    assert rc == 0, f"exit code {rc}: {err[-2000:]}"
    assert "does not match" in out and "shipped model is used instead" in out
    assert "ilargi calibrate" in out
    assert "fitted" in out


@needs_model
def test_ilargi_fit_survives_a_damaged_model(damaged_user_model, tmp_path):
    from _cli_data import SPEC, write_star

    write_star(tmp_path / "data")
    spec = tmp_path / "star.toml"
    spec.write_text(SPEC.replace('plan = "factorized"', 'plan = "auto"'))
    code = f"""
        import sys
        from ilargi_sklearn.cli import main
        sys.exit(main(["fit", {str(spec)!r}, "--cv", "2", "--no-save", "-q"]))
    """
    rc, out, err = _python(code, {"ILARGI_CACHE_DIR": str(damaged_user_model)})
    assert rc == 0, f"exit code {rc}: {err[-2000:]}"
    assert "cross-validated" in out
    assert "does not match" in err


@needs_model
@pytest.mark.slow
def test_ilargi_calibrate_replaces_a_damaged_model(damaged_user_model, tmp_path):
    """The command that would replace the damaged model crashed on it too (it
    compares the new model with the current one); now it runs and installs a
    model that loads."""
    records = tmp_path / "r.jsonl"
    code = f"""
        import sys
        from ilargi_sklearn import cli
        from ilargi_sklearn.planner import _calibrate
        work = [
            {{"group": "synthetic", "estimator": "linear", "params": {{}},
              "data": {{"n_rows": 300, "tuple_ratio": tr}}}}
            for tr in (2.0, 5.0, 20.0)
        ]
        _calibrate.default_workloads = lambda **kw: work
        sys.exit(cli.main(["calibrate", "--records", {str(records)!r}, "-q",
                           "--budget", "60"]))
    """
    rc, out, err = _python(code, {"ILARGI_CACHE_DIR": str(damaged_user_model)})
    assert rc == 0, f"exit code {rc}: {err[-2000:]}"
    assert "does not match" in err
    # Whatever the noisy timings of the fallback say: a model that cannot be
    # loaded is never kept.
    assert "installed the new model" in out
    assert "could not be loaded" in out
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = load_cost_model(str(damaged_user_model / "cost_model.cbm"))
    assert model.is_learned


@needs_model
@pytest.mark.parametrize(
    "damage", ["flip-start", "flip-middle", "truncate", "no-checksum", "garbage"]
)
def test_model_file_is_verified_before_catboost_reads_it(tmp_path, damage):
    """Most flipped bytes make CatBoost load a different model without a word;
    every damaged file now falls back, with a warning that names the file."""
    pytest.importorskip("catboost")
    good = shipped_model_path().read_bytes()
    path = tmp_path / "m.cbm"
    data = {
        "flip-start": _flip(good, 0.0005),
        "flip-middle": _flip(good, 0.5),
        "truncate": good[: len(good) // 2],
        "no-checksum": good,
        "garbage": b"not a catboost model",
    }[damage]
    path.write_bytes(data)
    if damage != "no-checksum":
        checksum_path(path).write_text(checksum_path(shipped_model_path()).read_text())
    with pytest.warns(UserWarning, match=r"m\.cbm.*analytical") as record:
        model = load_cost_model(str(path))
    assert not model.is_learned
    reason = "no readable checksum" if damage == "no-checksum" else "does not match"
    assert reason in str(record[0].message)


def test_saved_model_has_a_checksum_and_loads(tmp_path):
    pytest.importorskip("catboost")
    from ilargi_sklearn.planner._cost_model import fit_cost_model, read_records

    if not shipped_model_path().is_file():
        pytest.skip("no shipped records")
    from ilargi_sklearn.planner._cost_model import shipped_records_path

    records = read_records(shipped_records_path())[:60]
    model = fit_cost_model(records, iterations=10, thread_count=1)
    path = save_cost_model(model, tmp_path / "m.cbm")
    side = checksum_path(path)
    assert side.is_file() and side.read_text().endswith("  m.cbm\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_cost_model(str(path)).is_learned
    # The file changes, its checksum does not: not loaded.
    path.write_bytes(_flip(path.read_bytes(), 0.5))
    with pytest.warns(UserWarning, match="does not match"):
        assert not load_cost_model(str(path)).is_learned


@needs_model
def test_shipped_model_passes_its_checksum():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_cost_model(str(shipped_model_path())).is_learned


# ------------------------------------------------------------ hardware figures
@pytest.fixture
def fake_measure(tmp_path, monkeypatch):
    """Hardware "measurements" that are counted and instant."""
    monkeypatch.setenv("ILARGI_CACHE_DIR", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return {
            "cpu_cores": 2,
            "cpu_model": "test",
            "gemm_gflops": 50.0,
            "mem_bandwidth_gbs": 10.0,
            "gather_gbs": 2.0,
        }

    monkeypatch.setattr(_hardware, "_measure_cpu", measure)
    monkeypatch.setattr(_hardware, "_measure_gpu", dict)
    _hardware._hardware_info_cached.cache_clear()
    yield calls
    _hardware._hardware_info_cached.cache_clear()


@pytest.mark.parametrize(
    "bad", [float("nan"), 0.0, -3.0, float("inf"), "fast", None, True]
)
@pytest.mark.parametrize("name", ["gemm_gflops", "cpu_cores", "gather_gbs"])
def test_hardware_figures_that_are_not_rates_are_measured_again(
    tmp_path, fake_measure, name, bad
):
    """A figure the cost model divides by is never NaN, zero, negative or
    infinite: such a cached value is measured again and the file rewritten."""
    _hardware.hardware_info()
    assert len(fake_measure) == 1
    path = tmp_path / "hardware.json"
    data = json.loads(path.read_text())
    entry = data[_hardware.machine_id()]
    entry[name] = bad
    if bad is None:
        del entry[name]
    path.write_text(json.dumps(data))

    # Intact figures are read, not measured.
    _hardware._hardware_info_cached.cache_clear()
    info = _hardware.hardware_info()
    assert len(fake_measure) == 2
    for k in ("cpu_cores", "gemm_gflops", "mem_bandwidth_gbs", "gather_gbs"):
        assert math.isfinite(info[k]) and info[k] > 0, (k, info[k])
    rewritten = json.loads(path.read_text())[_hardware.machine_id()]
    assert rewritten[name] == info[name]
    _hardware._hardware_info_cached.cache_clear()
    _hardware.hardware_info()
    assert len(fake_measure) == 2


def test_bad_gpu_figures_are_measured_again(tmp_path, fake_measure):
    _hardware.hardware_info()
    path = tmp_path / "hardware.json"
    data = json.loads(path.read_text())
    data[_hardware.machine_id()].update(
        gpu_name="X", gpu_memory_bytes=1e9, gpu_gemm_gflops=0.0, gpu_bandwidth_gbs=1
    )
    path.write_text(json.dumps(data))
    _hardware._hardware_info_cached.cache_clear()
    info = _hardware.hardware_info()
    assert len(fake_measure) == 2 and "gpu_gemm_gflops" not in info


# ------------------------------------------------------------ numba's cache
def _double(x, out):
    for i in range(x.shape[0]):
        out[i] = 2.0 * x[i]


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch, compiled_enabled):
    """numba's cache in a temporary folder; kernels made anew before and after."""
    numba = pytest.importorskip("numba")
    from ilargi_sklearn._backend import _launcher

    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path / "numba"))
    saved = dict(_launcher._state["kernels"])
    _launcher._state["kernels"].clear()
    _launcher.register("test_double", _double)
    monkeypatch.setitem(_launcher._state, "cache_warned", False)
    yield tmp_path / "numba"
    _launcher._SOURCES.pop("test_double", None)
    _launcher._state["kernels"].clear()
    _launcher._state["kernels"].update(saved)


def _damage(folder: Path, pattern: str) -> list[Path]:
    files = sorted(folder.rglob(pattern))
    for f in files:
        f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
    return files


@pytest.mark.parametrize("part", ["*.nbi", "*.nbc"])
def test_damaged_kernel_cache_is_compiled_again_with_one_warning(kernel_cache, part):
    """A truncated numba cache file made every call of its kernel raise
    (UnpicklingError from numba's loader) until someone found and deleted it."""
    from ilargi_sklearn._backend import _launcher

    x = np.arange(5.0)

    def run():
        out = np.zeros(5)
        _launcher.call("test_double", x, out)
        return out

    np.testing.assert_array_equal(run(), 2 * x)  # compiled, and cached
    assert _damage(kernel_cache, part)
    _launcher._state["kernels"].pop("test_double")  # a new process, in effect
    with pytest.warns(RuntimeWarning, match="'test_double' kernel.*compiled again"):
        np.testing.assert_array_equal(run(), 2 * x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(run(), 2 * x)
        # The cache was rewritten: the next process loads the kernel from it.
        _launcher._state["kernels"].pop("test_double")
        _launcher._state["cache_warned"] = False
        np.testing.assert_array_equal(run(), 2 * x)
    assert sum(_launcher._state["kernels"]["test_double"].stats.cache_hits.values())
    assert _launcher.numba_available()


@pytest.mark.slow
def test_fit_survives_a_damaged_kernel_cache(kernel_cache):
    """The fit that failed until the cache was deleted: logistic regression's
    kernels, their cache files truncated, give the same model."""
    from ilargi_sklearn import FactorizedLogisticRegression
    from ilargi_sklearn._backend import _launcher
    from ilargi_sklearn.datasets import make_multi_source

    d = make_multi_source(n_rows=500, random_state=0)
    y = (d.target > np.median(d.target)).astype(int)
    want = FactorizedLogisticRegression().fit(d.dataset, y).coef_
    assert _damage(kernel_cache, "*_chunk*.nbi")
    _launcher._state["kernels"].clear()
    with pytest.warns(RuntimeWarning, match="could not be read") as record:
        got = FactorizedLogisticRegression().fit(d.dataset, y).coef_
    assert len([w for w in record if "numba's cache" in str(w.message)]) == 1
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------ clear_caches
def _star(n=600, seed=0):
    from ilargi_sklearn.multisource import MultiSourceDataset

    rng = np.random.default_rng(seed)
    S = rng.standard_normal((n, 3))
    R = rng.standard_normal((40, 4))
    fk = rng.integers(0, 40, n)
    y = S @ [1.0, -2.0, 0.5] + R[fk] @ [0.3, 0.2, -1.0, 2.0] + rng.normal(0, 0.1, n)
    return S, R, fk, y, MultiSourceDataset.from_matrices([S, R], [None, fk])


def test_clear_caches_is_public_and_documented():
    import ilargi_sklearn

    assert "clear_caches" in ilargi_sklearn.__all__
    api = (Path(__file__).resolve().parents[1] / "docs" / "api.rst").read_text()
    assert "clear_caches" in api


def test_clear_caches_after_an_in_place_change(compiled_enabled):
    """The reported staleness: after an in-place change of a source, the
    documented clear_statistics_cache() left a materialized fit on the old joined
    matrix. clear_caches() makes every plan fit the new data."""
    from ilargi_sklearn import AutoPlan, FactorizedRidge, clear_caches
    from ilargi_sklearn.multisource import MultiSourceDataset, clear_statistics_cache

    S, R, fk, y, ds = _star()
    rows = np.arange(0, 600, 2)
    fits = {
        "materialized": lambda d: FactorizedRidge(strategy="materialized").fit(d, y),
        "factorized": lambda d: FactorizedRidge(strategy="factorized").fit(d, y),
        "fold": lambda d: FactorizedRidge().fit(d[rows], y[rows]),
    }
    before = {k: f(ds).coef_ for k, f in fits.items()}
    R *= 3.0
    S[:, 0] += 5.0
    fresh = MultiSourceDataset.from_matrices([S, R], [None, fk])
    want = {k: f(fresh).coef_ for k, f in fits.items()}
    clear_statistics_cache()
    stale = FactorizedRidge(strategy="materialized").fit(ds, y).coef_
    np.testing.assert_allclose(stale, before["materialized"])  # the old join
    clear_caches()
    for k, f in fits.items():
        np.testing.assert_allclose(f(ds).coef_, want[k], rtol=1e-10, err_msg=k)
        assert not np.allclose(want[k], before[k])
    # The planner's measurements go too: the next fit predicts again.
    auto = AutoPlan(FactorizedRidge(), cost_model="analytical")
    auto.fit(ds, y)
    assert auto.fit(ds, y).choice_reason_.startswith("measured")
    clear_caches()
    assert auto.fit(ds, y).choice_reason_ == "predicted"


def test_clear_caches_drops_layouts_that_copy_the_sources():
    """Terms that share a row map are stacked into one copy in the compiled
    kernels' layout, which the operator keeps: an in-place change of a source
    left it stale until clear_caches()."""
    from ilargi_sklearn import clear_caches
    from ilargi_sklearn._backend import RowMap
    from ilargi_sklearn.multisource._operators import (
        FactorizedMatrix,
        Term,
        fused_layout,
    )

    rng = np.random.default_rng(0)
    S0 = rng.standard_normal((50, 2))
    R1, R2 = rng.standard_normal((10, 2)), rng.standard_normal((10, 3))
    rows = RowMap(rng.integers(0, 10, 50), 10)
    op = FactorizedMatrix(
        [
            Term(S0, RowMap(None, 50), np.arange(2), 0),
            Term(R1, rows, np.arange(2, 4), 1),
            Term(R2, rows, np.arange(4, 7), 2),
        ],
        50,
        7,
        np.float64,
    )
    (group,) = fused_layout(op).groups
    np.testing.assert_array_equal(group.S, np.hstack([R1, R2]))
    R2 *= 3.0
    assert not np.array_equal(fused_layout(op).groups[0].S, np.hstack([R1, R2]))
    clear_caches()
    np.testing.assert_array_equal(fused_layout(op).groups[0].S, np.hstack([R1, R2]))


def test_clear_caches_drops_device_copies():
    xps = pytest.importorskip("array_api_strict")
    from ilargi_sklearn import clear_caches

    S, R, fk, y, ds = _star()
    dev = xps.Device("device1")
    v = np.arange(ds.shape[1], dtype=float)

    def on_device():
        out = ds.to_device(dev, namespace=xps) @ xps.asarray(v, device=dev)
        return np.asarray(xps.asarray(out, device=xps.Device("CPU_DEVICE")))

    moved = ds.to_device(dev, namespace=xps)
    assert ds.to_device(dev, namespace=xps) is moved  # cached on the root
    R *= 2.0
    clear_caches()
    # A new copy, of the sources as they are now (array_api_strict shares the
    # host's memory, so the old copy cannot show staleness here; CuPy's would).
    assert ds.to_device(dev, namespace=xps) is not moved
    np.testing.assert_allclose(on_device(), ds @ v)


# ------------------------------------------------------------ pickling
def test_host_dataset_pickles_after_to_device():
    """to_device hung the device copy (holding the device's namespace, a module)
    on the root operator, and the host dataset no longer pickled."""
    import pickle

    xps = pytest.importorskip("array_api_strict")
    from ilargi_sklearn import FactorizedStandardScaler

    S, R, fk, y, ds = _star()
    scaled = FactorizedStandardScaler().fit_transform(ds)
    dev = xps.Device("device1")
    for host in (ds, scaled):
        moved = host.to_device(dev, namespace=xps)
        for obj in (host, host[np.arange(10)]):
            back = pickle.loads(pickle.dumps(obj))
            np.testing.assert_array_equal(
                np.asarray(back.materialize(format="dense")),
                np.asarray(obj.materialize(format="dense")),
            )
            # The copy is a cache: made again after unpickling.
            again = back.to_device(dev, namespace=xps)
            assert again.device == moved.device
        with pytest.raises(TypeError, match=r"to_device\('cpu'\)"):
            pickle.dumps(moved)
        back = pickle.loads(pickle.dumps(moved.to_device("cpu")))
        assert back.shape == host.shape


def test_device_copies_live_in_a_weak_table_and_go_with_their_dataset():
    """The copies of a root dataset on other devices are kept in a weak table
    keyed by its operator, never on the operator itself; they go when the
    dataset goes, and the way back from a copy (a weak link) keeps no host
    dataset alive."""
    import gc
    import weakref

    xps = pytest.importorskip("array_api_strict")
    S, R, fk, y, ds = _star()
    dev = xps.Device("device1")
    moved = ds.to_device(dev, namespace=xps)
    assert ds.to_device(dev, namespace=xps) is moved
    fold = ds[np.arange(10)].to_device(dev, namespace=xps)
    assert fold.operator is not moved.operator and len(fold) == 10
    assert moved.to_device("cpu").operator is ds.operator
    for obj in (ds, moved, fold):
        assert not [k for k in vars(obj.operator) if "device" in k]
    host, copy = weakref.ref(ds.operator), weakref.ref(moved.operator)
    del ds, moved, fold, obj
    gc.collect()
    assert host() is None
    assert copy() is None


@needs_model
def test_a_failed_model_file_is_read_once_per_version(tmp_path, monkeypatch):
    """Every AutoPlan fit asks for the model: a damaged file is checked once, and
    read again only when it or its checksum file changes."""
    pytest.importorskip("catboost")
    from ilargi_sklearn.planner import _cost_model

    good = shipped_model_path().read_bytes()
    path = tmp_path / "m.cbm"
    path.write_bytes(good)
    side = checksum_path(path)
    side.write_text("0" * 64 + "  m.cbm\n")
    reads = []
    real = _cost_model._verified_bytes
    monkeypatch.setattr(
        _cost_model, "_verified_bytes", lambda p: reads.append(p) or real(p)
    )
    with pytest.warns(UserWarning, match="does not match"):
        assert not load_cost_model(str(path)).is_learned
    assert not load_cost_model(str(path)).is_learned
    assert len(reads) == 1
    # A new checksum file (written after the model, as save_cost_model does).
    side.write_text(checksum_path(shipped_model_path()).read_text())
    os.utime(side, ns=(side.stat().st_atime_ns, side.stat().st_mtime_ns + 10**9))
    assert load_cost_model(str(path)).is_learned
    assert len(reads) == 2
