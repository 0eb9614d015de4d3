"""Explicit state: the settings, the bounded caches, the statistics' key, slices.

A fit's result never depends on what ran before it in the process (with the
default settings, bit for bit; with caching off, bit for bit what a new process
computes), the settings live in one place (``set_config`` / ``config_context`` /
``get_config``) that the older per-cache functions write through, the caches
share one bounded, thread-safe implementation whose entries go with their
dataset, validation records nothing, the statistics' key never copies a device
array to the host, and ``ds[idx]`` is a new dataset every time.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from sklearn.model_selection import KFold

import ilargi_sklearn
from ilargi_sklearn import (
    MultiSourceDataset,
    clear_caches,
    config_context,
    get_config,
    set_config,
)
from ilargi_sklearn.datasets import make_multi_source
from ilargi_sklearn.linear_model import FactorizedLinearRegression, FactorizedRidge
from ilargi_sklearn.multisource import _lineage, set_statistics_cache
from ilargi_sklearn.multisource._bounded import BoundedCache
from ilargi_sklearn.multisource._cache import _CACHE, set_materialization_cache
from ilargi_sklearn.multisource._lineage import array_key, lineage_of
from ilargi_sklearn.multisource._slices import _SLICES
from ilargi_sklearn.multisource._statistics import centered_gram
from ilargi_sklearn.multisource._stats_cache import _STATS, statistics_cached
from ilargi_sklearn.planner import AutoPlan
from ilargi_sklearn.planner._auto import _HISTORY
from ilargi_sklearn.utils._validation import validate_X

N_FOLDS = 5


def star(n_rows=2000, seed=0):
    bunch = make_multi_source(
        n_rows,
        n_sources=2,
        tuple_ratio=20,
        feature_ratio=4,
        n_base_features=4,
        random_state=seed,
    )
    return bunch.dataset, bunch.target


# ------------------------------------------------------------------ settings
def test_config_context_restores_and_set_config_persists():
    default = get_config()
    assert default["statistics_downdating"] is False
    assert default["compiled_kernels"] is True
    with config_context(statistics_cache_bytes=0, plan_history_size=3):
        assert get_config()["statistics_cache_bytes"] == 0
        with config_context(plan_history_size=5):
            assert get_config()["plan_history_size"] == 5
        assert get_config()["plan_history_size"] == 3
    assert get_config() == default
    # Restored also when the block raises.
    with pytest.raises(RuntimeError), config_context(statistics_downdating=True):
        assert get_config()["statistics_downdating"] is True
        raise RuntimeError
    assert get_config() == default
    set_config(slice_memo_entries=7)
    assert get_config()["slice_memo_entries"] == 7
    # get_config hands out a copy.
    get_config()["slice_memo_entries"] = 100
    assert get_config()["slice_memo_entries"] == 7


def test_config_context_is_per_thread_and_set_config_per_process():
    seen = {}

    def other():
        seen["downdating"] = get_config()["statistics_downdating"]
        seen["entries"] = get_config()["slice_memo_entries"]

    with config_context(statistics_downdating=True):
        set_config(slice_memo_entries=9)
        t = threading.Thread(target=other)
        t.start()
        t.join()
    # The block's override stays in its thread; set_config reaches every thread.
    assert seen == {"downdating": False, "entries": 9}


@pytest.mark.parametrize(
    "settings, error, match",
    [
        ({"statistics_cache": 0}, TypeError, "statistics_cache"),
        ({"statistics_cache_bytes": -1}, ValueError, 'non-negative int or "auto"'),
        ({"plan_history_size": "auto"}, ValueError, "plan_history_size"),
        ({"statistics_downdating": 1}, TypeError, "True or False"),
    ],
)
def test_bad_settings_name_the_culprit(settings, error, match):
    with pytest.raises(error, match=match):
        set_config(**settings)
    with pytest.raises(error, match=match), config_context(**settings):
        pass  # pragma: no cover


def test_old_knobs_write_through_the_config():
    set_statistics_cache(12345)
    assert get_config()["statistics_cache_bytes"] == 12345
    assert get_config()["slice_memo_bytes"] == 12345
    assert _STATS.max_bytes == 12345
    set_statistics_cache()
    assert get_config()["statistics_cache_bytes"] == "auto"
    assert _STATS.max_bytes > 0
    set_config(statistics_cache_bytes=None)  # None leaves a setting as it is
    assert get_config()["statistics_cache_bytes"] == "auto"
    set_materialization_cache(max_entries=2, max_bytes=999)
    assert get_config()["materialization_cache_entries"] == 2
    assert (_CACHE.max_entries, _CACHE.max_bytes) == (2, 999)
    with config_context(materialization_cache_bytes=0):
        assert _CACHE.max_bytes == 0 and not _CACHE.enabled


def test_compiled_kernels_setting():
    from ilargi_sklearn._backend._launcher import numba_available

    with config_context(compiled_kernels=False):
        assert not numba_available()
    ds, y = star(n_rows=500, seed=1)
    from ilargi_sklearn import FactorizedKMeans

    a = FactorizedKMeans(n_clusters=3, n_init=1, random_state=0).fit(ds)
    with config_context(compiled_kernels=False):
        b = FactorizedKMeans(n_clusters=3, n_init=1, random_state=0).fit(ds)
    np.testing.assert_array_equal(a.labels_, b.labels_)


def test_plan_history_size_bounds_the_history():
    with config_context(plan_history_size=1):
        for seed in (2, 3):
            ds, y = star(n_rows=300, seed=seed)
            AutoPlan(FactorizedRidge()).fit(ds, y)
        assert len(_HISTORY) == 1
    with config_context(plan_history_size=0):
        clear_caches()
        ds, y = star(n_rows=300, seed=4)
        AutoPlan(FactorizedRidge()).fit(ds, y)
        assert len(_HISTORY) == 0


def test_clear_caches_clears_all_four():
    ds, y = star(n_rows=600, seed=5)
    rows = np.arange(500)
    FactorizedRidge().fit(ds[rows], y[rows])
    FactorizedRidge(strategy="materialized").fit(ds, y)
    AutoPlan(FactorizedRidge()).fit(ds, y)
    assert len(_STATS) and len(_CACHE) and len(_SLICES) and len(_HISTORY)
    clear_caches()
    assert not (len(_STATS) or len(_CACHE) or len(_SLICES) or len(_HISTORY))


# --------------------------------------------------------- history independence
def _folds(n):
    return [train for train, _ in KFold(N_FOLDS).split(np.zeros(n))]


def test_a_fit_does_not_depend_on_earlier_fits():
    # With the default settings: a fold fitted after other folds of its root
    # gives the bits it gives in an empty cache (no implicit downdating).
    ds, y = star(n_rows=4000, seed=6)
    folds = _folds(len(ds))
    cold = FactorizedRidge(alpha=0.1).fit(ds[folds[2]], y[folds[2]])
    clear_caches()
    for rows in folds[:2]:
        FactorizedRidge(alpha=0.1).fit(ds[rows], y[rows])
    warm = FactorizedRidge(alpha=0.1).fit(ds[folds[2]], y[folds[2]])
    assert ds.cache_info()["statistics"]["downdates"] == 0
    # Bitwise on purpose: the claim is "the same bits whatever ran before".
    np.testing.assert_array_equal(warm.coef_, cold.coef_)
    assert warm.intercept_ == cold.intercept_


def test_downdating_is_an_opt_in_that_agrees_to_rounding():
    ds, y = star(n_rows=4000, seed=6)
    folds = _folds(len(ds))
    cold = FactorizedRidge(alpha=0.1).fit(ds[folds[2]], y[folds[2]])
    clear_caches()
    with config_context(statistics_downdating=True):
        for rows in folds[:2]:
            FactorizedRidge(alpha=0.1).fit(ds[rows], y[rows])
        warm = FactorizedRidge(alpha=0.1).fit(ds[folds[2]], y[folds[2]])
    assert ds.cache_info()["statistics"]["downdates"] == 2
    np.testing.assert_allclose(warm.coef_, cold.coef_, rtol=1e-10, atol=1e-12)


_COLD_SCRIPT = """
import json, sys
import numpy as np
from sklearn.model_selection import KFold
from ilargi_sklearn.datasets import make_multi_source
from ilargi_sklearn.linear_model import FactorizedRidge
b = make_multi_source(4000, n_sources=2, tuple_ratio=20, feature_ratio=4,
                      n_base_features=4, random_state=7)
rows = [t for t, _ in KFold(5).split(np.zeros(4000))][3]
est = FactorizedRidge(alpha=0.3).fit(b.dataset[rows], b.target[rows])
print(json.dumps([est.coef_.tobytes().hex(), float(est.intercept_).hex()]))
"""


def test_caching_off_is_bit_identical_to_a_cold_process():
    ds, y = star(n_rows=4000, seed=7)
    folds = _folds(len(ds))
    with config_context(
        statistics_cache_bytes=0,
        slice_memo_bytes=0,
        materialization_cache_bytes=0,
        statistics_downdating=True,  # off with the cache: nothing to downdate from
    ):
        for rows in folds[:3] + [np.arange(len(ds))]:
            FactorizedRidge(alpha=0.3).fit(ds[rows], y[rows])
        est = FactorizedRidge(alpha=0.3).fit(ds[folds[3]], y[folds[3]])
        assert ds.cache_info()["statistics"]["entries"] == 0
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(ilargi_sklearn.__file__))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, "-c", _COLD_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    coef, intercept = json.loads(out.stdout.strip().splitlines()[-1])
    assert est.coef_.tobytes().hex() == coef
    assert float(est.intercept_).hex() == intercept


# -------------------------------------------------------------- bounded cache
def _budgets(entries=None, nbytes=None):
    return {"max_entries": lambda: entries, "max_bytes": lambda: nbytes}


def test_bounded_cache_evicts_by_entries_least_recently_used_first():
    cache = BoundedCache("test", **_budgets(entries=2))
    g = object()
    cache.put((g, "a"), 1)
    cache.put((g, "b"), 2)
    assert cache.get((g, "a")) == 1  # "a" now the most recently used
    cache.put((g, "c"), 3)
    assert cache.keys() == [(g, "a"), (g, "c")]
    assert cache.info()["evictions"] == 1
    # Asking is not using: holds() leaves the order as it is.
    assert cache.holds((g, "a"))
    cache.put((g, "d"), 4)
    assert cache.keys() == [(g, "c"), (g, "d")]


def test_bounded_cache_evicts_by_bytes_and_refuses_oversized_entries():
    budget = {"bytes": 100}
    cache = BoundedCache("test", max_bytes=lambda: budget["bytes"])
    g = object()
    assert cache.put((g, 1), "x", 60)
    assert cache.put((g, 2), "y", 30)
    assert cache.nbytes == 90
    assert cache.put((g, 3), "z", 50)  # evicts the first (60 bytes)
    assert cache.keys() == [(g, 2), (g, 3)] and cache.nbytes == 80
    assert not cache.put((g, 4), "too big", 101)
    assert cache.keys() == [(g, 2), (g, 3)]
    # A smaller budget takes effect at the next store.
    budget["bytes"] = 40
    cache.put((g, 5), "w", 10)
    assert cache.keys() == [(g, 5)] and cache.nbytes == 10
    budget["bytes"] = 0
    assert not cache.enabled and not cache.put((g, 6), "v", 0)


def test_bounded_cache_counts_hits_and_misses_per_group():
    cache = BoundedCache("test")
    g, h = object(), object()
    cache.put((g, 1), "x", 8)
    assert cache.get((g, 1)) == "x"
    assert cache.get((g, 2)) is None
    assert cache.get((h, 1)) is None
    assert cache.get((g, 1), count=False) == "x"
    assert cache.info(g) == {"entries": 1, "bytes": 8, "hits": 1, "misses": 1}
    assert cache.info(h)["misses"] == 1
    assert cache.info()["hits"] == 1 and cache.info()["misses"] == 2


class _Owner:
    """A weakly referenceable stand-in for a root operator."""


def test_bounded_cache_drops_a_group_with_its_owner():
    cache = BoundedCache("test")
    owner, other = _Owner(), _Owner()
    g, h = object(), object()
    cache.put((g, 1), "x", 1)
    cache.put((g, 2), "y", 1)
    cache.put((h, 1), "z", 1)
    cache.count(g, "downdates")
    cache.watch(owner, group=g)
    cache.watch(owner, group=g)  # watched once
    cache.watch(other, group=h)
    del owner
    gc.collect()
    assert cache.keys() == [(h, 1)]
    assert g not in cache._groups and cache.nbytes == 1


def test_bounded_cache_finalizer_never_waits_for_the_lock():
    # A collection inside a thread that holds the lock (the collector runs
    # wherever it likes): the finalizer leaves the entry for the next call.
    cache = BoundedCache("test")
    owner, g = _Owner(), object()
    cache.put((g, 1), "x", 5)
    cache.watch(owner, group=g)
    with cache._lock:
        del owner
        gc.collect()  # would deadlock if the finalizer waited
        assert (g, 1) in cache._entries
    assert cache.keys() == [] and cache.nbytes == 0


def test_bounded_cache_drops_a_key_with_its_owner():
    cache = BoundedCache("test")
    a, b = _Owner(), _Owner()
    cache.put((1, 1), "x")
    cache.put((1, 2), "y")
    cache.watch(a, key=(1, 1))
    cache.watch(b, key=(1, 2))
    del a
    gc.collect()
    assert cache.keys() == [(1, 2)]


def test_bounded_cache_computes_a_key_once_across_threads():
    cache = BoundedCache("test")
    g = object()
    calls = []

    def compute():
        calls.append(1)
        time.sleep(0.05)  # the others arrive while this one computes
        return "value", 8

    results = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        results.append(cache.get_or_compute((g, "k"), compute))

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["value"] * 8 and len(calls) == 1
    info = cache.info(g)
    assert info["misses"] == 1 and info["hits"] == 7


def test_bounded_cache_stays_consistent_under_concurrent_stores():
    cache = BoundedCache("test", **_budgets(entries=50, nbytes=4000))
    groups = [object() for _ in range(4)]

    def worker(i):
        rng = np.random.default_rng(i)
        for j in range(400):
            g = groups[int(rng.integers(4))]
            key = (g, int(rng.integers(100)))
            if rng.random() < 0.5:
                cache.put(key, j, int(rng.integers(1, 200)))
            else:
                cache.get(key)
            if j % 97 == 0:
                cache.discard_group(g)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    sizes = [n for _, n in cache._entries.values()]
    assert cache.nbytes == sum(sizes) <= 4000
    assert len(cache) <= 50


def test_statistics_entries_go_with_their_dataset():
    ds, y = star(n_rows=500, seed=8)
    rows = np.arange(400)
    FactorizedRidge().fit(ds[rows], y[rows])
    FactorizedRidge(strategy="materialized").fit(ds, y)
    token = ds._root_token
    assert _STATS.keys(token) and _CACHE.keys(token) and len(_SLICES)
    del ds
    gc.collect()
    assert not _STATS.keys(token) and not _CACHE.keys(token)
    assert len(_SLICES) == 0


# ------------------------------------------------------------ the key
def test_validation_records_nothing():
    ds, y = star(n_rows=500, seed=9)
    op = validate_X(FactorizedRidge(), ds, reset=True)
    assert len(_STATS) == 0
    # An operator without its lineage is computed, never cached.
    centered_gram(op, None, True, y[:, None])
    assert len(_STATS) == 0
    op, lineage = validate_X(FactorizedRidge(), ds, reset=True, return_lineage=True)
    assert lineage.key() == lineage_of(ds, op).key()
    centered_gram(op, None, True, y[:, None], lineage=lineage)
    assert ds.cache_info()["statistics"]["entries"] == 2


def test_the_planner_asks_the_fits_key():
    ds, y = star(n_rows=600, seed=10)
    rows = np.arange(500)
    weights = [1 + i % 3 for i in range(500)]  # a list of ints, as a user passes
    assert statistics_cached(ds[rows], "factorized", weights) is None
    FactorizedRidge().fit(ds[rows], y[rows], sample_weight=weights)
    assert statistics_cached(ds[rows], "factorized", weights) == "fold"
    assert statistics_cached(ds[rows], "factorized") is None
    assert statistics_cached(ds[rows], "materialized", weights) is None


def test_array_key_tells_arrays_apart():
    pytest.importorskip("array_api_strict")
    import array_api_strict as xps

    dev = xps.Device("device1")
    rng = np.random.default_rng(0)
    y = rng.standard_normal(1000)
    keys = set()
    for a in (
        y,
        y[::-1].copy(),
        np.roll(y, 1),
        y + np.where(np.arange(1000) == 7, 1e-9, 0),
    ):
        keys.add(array_key(xps.asarray(a, device=dev)))
    assert len(keys) == 4
    assert array_key(xps.asarray(y, device=dev)) == array_key(
        xps.asarray(y, device=dev)
    )
    # NumPy arrays are keyed by their bytes.
    assert array_key(y) == array_key(y.copy()) != array_key(y[::-1].copy())


def test_device_target_and_weights_are_never_copied_to_the_host_for_a_key(
    monkeypatch,
):
    pytest.importorskip("array_api_strict")
    import array_api_strict as xps

    dev = xps.Device("device1")
    ds, y = star(n_rows=800, seed=11)
    dsd = ds.to_device(dev, namespace=xps)
    n = len(ds)
    copied = []
    original = _lineage.to_numpy

    def counting(a):
        copied.append(tuple(getattr(a, "shape", ())))
        return original(a)

    monkeypatch.setattr(_lineage, "to_numpy", counting)
    y_dev = xps.asarray(y, device=dev)
    w = np.random.default_rng(0).uniform(0.5, 2.0, n)
    first = FactorizedRidge().fit(dsd, y_dev, sample_weight=w)
    second = FactorizedRidge(alpha=2.0).fit(dsd, y_dev, sample_weight=w)
    info = dsd.cache_info()["statistics"]
    assert info["entries"] == 2 and info["hits"] == 2  # keyed, and found again
    assert not [s for s in copied if s and s[0] == n], copied
    assert first.coef_.shape == second.coef_.shape


# ------------------------------------------------------------------ slices
def test_every_slice_is_a_new_dataset():
    ds, _ = star(n_rows=500, seed=12)
    rows = np.arange(0, 500, 2)
    a = ds[rows]
    b = ds[rows]
    assert a is not b
    assert a.operator is b.operator  # the gathered rows are shared underneath
    a.categories_["x"] = [1]
    a.schema_ = "changed"
    c = ds[rows]
    assert "x" not in c.categories_ and "x" not in b.categories_
    assert c.schema_ is ds.schema_
    np.testing.assert_array_equal(c.materialize("dense"), ds.materialize("dense")[rows])


def test_memoized_slices_keep_their_key_digest(monkeypatch):
    ds, y = star(n_rows=500, seed=13)
    rows = np.arange(400)
    FactorizedRidge().fit(ds[rows], y[rows])
    calls = []
    original = _lineage.digest

    def counting(a):
        calls.append(np.shape(a))
        return original(a)

    monkeypatch.setattr(_lineage, "digest", counting)
    FactorizedRidge(alpha=2.0).fit(ds[rows], y[rows])
    # The rows' digest comes from the memo of the gathered rows; only the
    # target (400, 1) is digested again.
    assert calls == [(400, 1)]
    assert ds.cache_info()["statistics"]["hits"] == 2


def test_pickled_slice_of_a_scaled_dataset():
    import pickle

    from ilargi_sklearn import FactorizedStandardScaler

    ds, y = star(n_rows=300, seed=14)
    rows = np.arange(200)
    scaled = FactorizedStandardScaler().fit(ds[rows]).transform(ds[rows])
    assert scaled._scaled_from is not None
    loaded = pickle.loads(pickle.dumps(scaled))
    assert loaded._scaled_from is None
    a = FactorizedRidge().fit(scaled, y[rows])
    b = FactorizedRidge().fit(loaded, y[rows])
    np.testing.assert_array_equal(a.coef_, b.coef_)


def test_datasets_of_other_constructions_still_key():
    rng = np.random.default_rng(0)
    S, R = rng.normal(size=(60, 2)), rng.normal(size=(6, 3))
    ds = MultiSourceDataset.from_matrices([S, R], [None, np.arange(60) % 6])
    op = ds.operator
    lineage = lineage_of(ds, op)
    assert lineage is not None and lineage.rows is None
    assert lineage.key()[1] == "root"
    # A cast dataset is a new root; its operator is not the old root's.
    assert lineage_of(ds, ds.astype(np.float32).operator) is None
    assert FactorizedLinearRegression().fit(ds, rng.normal(size=60)).coef_.shape == (5,)


def test_the_planner_counts_a_slices_figures_once(monkeypatch):
    from ilargi_sklearn.planner import _features

    ds, _ = star(n_rows=500, seed=15)
    rows = np.arange(400)
    calls = []
    original = _features._data_features

    def counting(X):
        calls.append(1)
        return original(X)

    monkeypatch.setattr(_features, "_data_features", counting)
    first = _features.data_features(ds[rows])
    assert _features.data_features(ds[rows]) == first  # a new slice, same rows
    assert len(calls) == 1
    _features.data_features(ds)
    assert len(calls) == 2
