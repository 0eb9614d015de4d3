"""Source kinds: another engine's sources reach ``from_matrices`` through a
registered builder, not through the data-structure package importing the engine."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.multisource import _matrices
from ilargi_sklearn.multisource._matrices import register_source_kind


class _Tagged:
    """A stand-in for another engine's array."""

    def __init__(self, data):
        self.data = np.asarray(data, dtype=float)
        self.shape = self.data.shape


@pytest.fixture
def tagged_kind():
    calls = []

    def build(cls, sources, indicators, mappings, feature_names, **kwargs):
        calls.append(kwargs)
        plain = [S.data if isinstance(S, _Tagged) else S for S in sources]
        return cls.from_matrices(plain, indicators, mappings, feature_names)

    register_source_kind("tagged", lambda S: isinstance(S, _Tagged), build)
    yield calls
    del _matrices._SOURCE_KINDS["tagged"]


def test_a_registered_kind_builds_its_sources(tagged_kind):
    rng = np.random.default_rng(0)
    S, R = rng.normal(size=(6, 2)), rng.normal(size=(3, 2))
    idx = np.array([0, 1, 2, 0, 1, -1])
    ds = MultiSourceDataset.from_matrices(
        [_Tagged(S), R], [None, idx], source_names=["a", "b"], dtype=np.float32
    )
    assert tagged_kind == [
        {
            "source_names": ["a", "b"],
            "priority": None,
            "dtype": np.float32,
            "allow_nan": False,
        }
    ]
    plain = MultiSourceDataset.from_matrices([S, R], [None, idx])
    np.testing.assert_array_equal(ds.materialize(), plain.materialize())
    # Sources of no registered kind never reach the kind's builder.
    MultiSourceDataset.from_matrices([S, R], [None, idx])
    assert len(tagged_kind) == 1


def test_dask_sources_load_the_engine_on_demand():
    """``import ilargi_sklearn`` does not import ``ilargi_sklearn.distributed``;
    a Dask source in ``from_matrices`` loads it and gets the Dask-backed dataset."""
    pytest.importorskip("dask.array", reason="the [dask] extra is not installed")
    code = textwrap.dedent(
        """
        import sys
        import numpy as np
        import dask.array as da
        from ilargi_sklearn import MultiSourceDataset
        assert "ilargi_sklearn.distributed" not in sys.modules
        base = da.from_array(np.arange(8.0).reshape(4, 2), chunks=2)
        idx = np.array([0, 1, 1, -1])
        ds = MultiSourceDataset.from_matrices([base, np.eye(2)], [None, idx])
        assert type(ds.operator).__name__ == "DaskFactorizedMatrix"
        mem = MultiSourceDataset.from_matrices([base.compute(), np.eye(2)], [None, idx])
        np.testing.assert_allclose((ds @ np.ones(4)).compute(), mem @ np.ones(4))
        print("ok")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
