"""The vocabulary of plans and devices (``_backend/_plan.py``) and the boundary that
hands results back to the caller (``utils/_validation.Caller``)."""

import numpy as np
import pytest

from ilargi_sklearn._backend._plan import (
    DEVICE_OPTIONS,
    DEVICES,
    PLANS,
    STRATEGIES,
    DeviceUnavailableError,
    Plan,
    UnsupportedOnDeviceError,
)
from ilargi_sklearn.planner._auto import _resource_failure
from ilargi_sklearn.planner._features import split_plan
from ilargi_sklearn.utils._validation import Caller, check_device


def test_plan_names_round_trip():
    assert PLANS == (
        "factorized-cpu",
        "materialized-cpu",
        "factorized-gpu",
        "materialized-gpu",
    )
    for name in PLANS:
        plan = Plan.parse(name)
        assert plan.name == str(plan) == name
        assert split_plan(name) == (plan.strategy, plan.device)
    assert Plan.parse("materialized") == Plan("materialized", "cpu")
    assert DEVICE_OPTIONS == ("auto", *DEVICES)
    assert set(STRATEGIES) == {p.strategy for p in map(Plan.parse, PLANS)}


@pytest.mark.parametrize("name", ["joined-cpu", "factorized-tpu", "factorized-"])
def test_unknown_plans_are_named(name):
    with pytest.raises(ValueError, match="unknown plan"):
        Plan.parse(name)
    with pytest.raises(ValueError, match="unknown plan"):
        split_plan(name)


def test_bare_strategy_is_not_a_plan_name_for_the_planner():
    with pytest.raises(ValueError, match="unknown plan 'factorized'"):
        split_plan("factorized")


def test_fallbacks_follow_the_exception_type_not_its_message():
    assert _resource_failure(DeviceUnavailableError("x"), "gpu") == "GPU unusable"
    assert (
        _resource_failure(UnsupportedOnDeviceError("x"), "gpu")
        == "not supported on the GPU"
    )
    # An error that merely mentions the GPU is the user's to see.
    assert _resource_failure(RuntimeError("bad GPU setting"), "gpu") is None
    assert _resource_failure(DeviceUnavailableError("x"), "cpu") is None
    assert _resource_failure(MemoryError(), "cpu") == "out of memory"
    # Subclasses keep the earlier untyped contracts.
    assert issubclass(DeviceUnavailableError, RuntimeError)
    assert issubclass(UnsupportedOnDeviceError, NotImplementedError)


def test_gpu_request_without_gpu_raises_the_typed_error(monkeypatch):
    from ilargi_sklearn._backend import _gpu

    monkeypatch.setattr(_gpu, "probe_gpu", lambda: (False, "no driver"))
    with pytest.raises(DeviceUnavailableError, match="no driver"):
        check_device("gpu")


def test_caller_hands_numpy_back_unchanged_and_moves_other_namespaces():
    xp = pytest.importorskip("array_api_strict")
    out = np.arange(3.0)
    assert Caller(np.ones((2, 2))).give(out) is out
    assert Caller(np.ones((2, 2))).give(None) is None
    on_strict = Caller(xp.ones((2, 2))).give(out)
    assert type(on_strict).__module__.startswith("array_api_strict")
    np.testing.assert_array_equal(np.asarray(on_strict), out)
    back = Caller(np.ones((2, 2))).give(xp.asarray(out))
    assert isinstance(back, np.ndarray)


def test_the_dataset_hands_out_the_operator_for_a_strategy():
    from ilargi_sklearn.planner import clear_materialization_cache
    from ilargi_sklearn.planner._auto import is_materialization_cached
    from ilargi_sklearn.utils._testing import random_dataset

    ds = random_dataset(3, scenario="star")
    clear_materialization_cache()
    assert ds.operator_for("factorized") is ds.operator
    fold = ds[np.arange(0, len(ds) - 2)]
    assert not is_materialization_cached(fold)
    joined = fold.operator_for("materialized")
    assert is_materialization_cached(fold) and is_materialization_cached(ds)
    np.testing.assert_allclose(
        joined.materialize(), fold.operator.materialize(), rtol=0, atol=1e-12
    )
    with pytest.raises(ValueError, match="strategy must be"):
        ds.operator_for("joined")
    clear_materialization_cache()


def test_the_old_dataset_path_still_imports_and_old_pickles_load(monkeypatch):
    import pickle
    import subprocess
    import sys

    for name in list(sys.modules):
        if name == "ilargi_sklearn.dataset" or name.startswith(
            "ilargi_sklearn.dataset."
        ):
            monkeypatch.delitem(sys.modules, name)

    from ilargi_sklearn.multisource import DatasetSchema, MultiSourceDataset
    from ilargi_sklearn.utils._testing import random_dataset

    with pytest.warns(FutureWarning, match="renamed ilargi_sklearn.multisource"):
        from ilargi_sklearn.dataset import MultiSourceDataset as Old
    assert Old is MultiSourceDataset
    # A pickle written before the rename names the old modules.
    ds = random_dataset(1)
    old = pickle.dumps(ds, protocol=0).replace(
        b"ilargi_sklearn.multisource", b"ilargi_sklearn.dataset"
    )
    assert b"ilargi_sklearn.dataset._" in old
    with pytest.warns(FutureWarning, match="renamed"):
        back = pickle.loads(old)
    assert isinstance(back, MultiSourceDataset)
    np.testing.assert_array_equal(back.materialize(), ds.materialize())
    assert DatasetSchema.__module__ == "ilargi_sklearn.multisource._schema"
    # In a fresh process, unpickling alone (no import of ilargi_sklearn first).
    code = (
        "import pickle, sys, warnings; warnings.simplefilter('ignore');"
        "obj = pickle.loads(sys.stdin.buffer.read()); print(type(obj).__module__)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=old, capture_output=True, check=True
    )
    assert out.stdout.decode().strip() == "ilargi_sklearn.multisource._multi_source"
