"""dask.dataframe fact tables joined with Join specs, against from_frames."""

import numpy as np
import pandas as pd
import pytest

dd = pytest.importorskip("dask.dataframe", reason="the [dask] extra is not installed")
distributed = pytest.importorskip(
    "dask.distributed", reason="the [dask] extra (distributed) is not installed"
)

from ilargi_sklearn.distributed import DaskFactorizedMatrix, dask_from_frames  # noqa: E402
from ilargi_sklearn.multisource import Join, from_frames  # noqa: E402

N = 600


def _tables(seed=0):
    rng = np.random.default_rng(seed)
    facts = pd.DataFrame(
        {
            "x1": rng.standard_normal(N),
            "x2": rng.standard_normal(N),
            "store": rng.integers(0, 12, N),  # 10 and 11 have no store row: left join
            "day": rng.choice(["mon", "tue", "wed"], N),
            "week": rng.integers(0, 3, N),
        }
    )
    stores = pd.DataFrame(
        {
            "store_id": np.arange(10)[::-1],
            "size": rng.uniform(1, 5, 10),
            "kind": rng.choice(["a", "b", "c"], 10),
            "region": rng.integers(0, 4, 10),
        }
    )
    regions = pd.DataFrame({"region": [3, 2, 1, 0], "pop": rng.uniform(size=4)})
    calendar = pd.DataFrame(
        {
            "day": ["mon", "tue", "wed"] * 3,
            "week": np.repeat([0, 1, 2], 3),
            "temp": rng.standard_normal(9),
        }
    )
    return facts, stores, regions, calendar


def _joins(stores, regions, calendar):
    return [
        Join(
            stores,
            left_on="store",
            right_on="store_id",
            features=["size", "kind"],
            name="stores",
            indicator=True,
        ),
        Join(regions, on="region", features=["pop"], name="regions", via="stores"),
        Join(calendar, on=["day", "week"], features=["temp"], name="calendar"),
    ]


def test_matches_from_frames(dask_client):
    facts, stores, regions, calendar = _tables()
    joins = _joins(stores, regions, calendar)
    mem = from_frames(facts, ["x1", "x2"], joins, sparse=False)
    ds = dask_from_frames(dd.from_pandas(facts, npartitions=4), ["x1", "x2"], joins)
    assert isinstance(ds.operator, DaskFactorizedMatrix)
    assert ds.operator.n_chunks == 4
    assert list(ds.feature_names) == list(mem.feature_names)
    np.testing.assert_allclose(
        ds.materialize().compute(), mem.materialize(), rtol=1e-12, atol=1e-12
    )
    G, G_ref = ds.gram(), mem.gram()
    np.testing.assert_allclose(
        G,
        np.asarray(G_ref.todense() if hasattr(G_ref, "todense") else G_ref),
        rtol=1e-10,
        atol=1e-10,
    )


def test_unsupported_joins(dask_client):
    facts, stores, regions, calendar = _tables(1)
    base = dd.from_pandas(facts, npartitions=2)
    with pytest.raises(
        ValueError, match="how must be 'left', got 'inner' .a Dask-backed dataset keeps"
    ):
        dask_from_frames(
            base,
            ["x1"],
            [
                Join(
                    stores,
                    left_on="store",
                    right_on="store_id",
                    features=["size"],
                    how="inner",
                )
            ],
        )
    dup = pd.concat([stores, stores.iloc[:1]])
    with pytest.raises(ValueError, match="more than once"):
        dask_from_frames(
            base,
            ["x1"],
            [Join(dup, left_on="store", right_on="store_id", features=["size"])],
        )
    with pytest.raises(TypeError, match="not numeric"):
        dask_from_frames(base, ["day"], [])
    with pytest.raises(TypeError, match="dask.dataframe"):
        dask_from_frames(facts, ["x1"], [])


@pytest.mark.parametrize("nulls_equal", [False, True])
def test_missing_keys_follow_from_frames(dask_client, nulls_equal):
    facts = pd.DataFrame({"x": [1.0, 2.0, 3.0, 4.0], "k": [7.0, np.nan, 9.0, np.nan]})
    dim = pd.DataFrame({"k": [np.nan, 7.0, 9.0], "z": [20.0, 10.0, 5.0]})
    join = Join(dim, on="k", features=["z"], nulls_equal=nulls_equal)
    dds = dask_from_frames(dd.from_pandas(facts, npartitions=2), ["x"], [join])
    mem = from_frames(facts, ["x"], [join])
    w = np.array([0.0, 1.0])
    np.testing.assert_array_equal((dds @ w).compute(), mem @ w)
    np.testing.assert_array_equal(dds.base_rows_, np.arange(4))
