"""Joins never lose or multiply rows in silence.

A join that repeats rows (a key occurs more than once in the joined table) warns,
naming the join and a few repeated keys, unless declared with ``validate=``, which
checks the relationship as ``pandas.merge(validate=...)`` does. Unmatched keys
that a known key mistake explains warn at any match rate; row-number joins that
are off by one say which first number to use. A target of the base table's length
given for a dataset with other rows points at the joins and ``ds.align``. Index
vectors given to ``from_matrices`` are checked and owned by the dataset.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from ilargi_sklearn import MultiSourceDataset
from ilargi_sklearn.linear_model import FactorizedLinearRegression, FactorizedRidge
from ilargi_sklearn.multisource import (
    Join,
    JoinFanOutWarning,
    JoinMatchWarning,
    from_frames,
)
from ilargi_sklearn.multisource._keys import _HAZARD_SAMPLE, hazard_rows

SPELLINGS = {
    "one_to_one": "1:1",
    "one_to_many": "1:m",
    "many_to_one": "m:1",
    "many_to_many": "m:m",
}


def stores_and_sales(n_sales: int = 400, seed: int = 0):
    rng = np.random.default_rng(seed)
    stores = pd.DataFrame(
        {"store": [f"S{i:02d}" for i in range(20)], "size": rng.uniform(1, 9, 20)}
    )
    sales = pd.DataFrame(
        {
            "store": rng.choice(stores["store"], n_sales),
            "q": rng.integers(1, 5, n_sales).astype(float),
        }
    )
    sales["y"] = 2 * sales["q"] + rng.normal(size=n_sales)
    return sales, stores


# ------------------------------------------------------------ fan-out
def test_a_duplicated_lookup_key_warns_with_the_join_and_the_key():
    sales, stores = stores_and_sales()
    dup = pd.concat([stores, stores.iloc[[3]].assign(size=99.0)], ignore_index=True)
    with pytest.warns(JoinFanOutWarning) as record:
        ds = from_frames(
            sales, ["q"], [Join(dup, on="store", features=["size"], name="stores")]
        )
    (w,) = record
    msg = str(w.message)
    n_dup = int((sales["store"] == "S03").sum())
    assert "join 'stores'" in msg and "1 key occurs more than once" in msg
    assert "'S03'" in msg and f"adds {n_dup:,} rows" in msg
    assert f"({len(sales):,} rows in, {len(sales) + n_dup:,} out)" in msg
    assert "validate='many_to_many'" in msg and "ds.align(y)" in msg
    assert len(ds) == len(sales.merge(dup, on="store")) == len(sales) + n_dup
    report = ds.match_report_.loc["stores"]
    assert report["rows_out"] == len(ds) and report["repeated_keys"] == ["S03"]
    assert report["fan_out"] == pytest.approx(len(ds) / len(sales))


@pytest.mark.parametrize("validate", ["one_to_many", "1:m", "many_to_many", "m:m"])
def test_declared_repeats_do_not_warn(validate):
    sales, stores = stores_and_sales()
    dup = pd.concat([stores, stores.iloc[[3]]], ignore_index=True)
    # One row per store on the left, several sales per store on the right.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = from_frames(
            stores,
            ["size"],
            [Join(sales, on="store", features=["q"], validate=validate)],
        )
    assert len(ds) == len(sales)
    if validate in ("one_to_many", "1:m"):
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = from_frames(
            sales, ["q"], [Join(dup, on="store", features=["size"], validate=validate)]
        )
    assert len(ds) > len(sales)


def test_the_fan_out_warning_suggests_the_relationship_the_tables_have():
    sales, stores = stores_and_sales()
    with pytest.warns(JoinFanOutWarning, match="validate='one_to_many'"):
        from_frames(stores, ["size"], [Join(sales, on="store", features=["q"])])
    dup = pd.concat([stores, stores.iloc[[3]]], ignore_index=True)
    with pytest.warns(JoinFanOutWarning, match="validate='many_to_many'"):
        from_frames(sales, ["q"], [Join(dup, on="store", features=["size"])])


def test_repeated_keys_that_no_row_takes_change_nothing_and_do_not_warn():
    sales, stores = stores_and_sales()
    extra = pd.DataFrame({"store": ["ZZ", "ZZ"], "size": [1.0, 2.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = from_frames(
            sales,
            ["q"],
            [Join(pd.concat([stores, extra]), on="store", features=["size"])],
        )
    assert len(ds) == len(sales)
    assert ds.match_report_["fan_out"].tolist() == [1.0]
    assert ds.match_report_["rows_out"].tolist() == [len(sales)]


def _validate_case(left_dup: bool, right_dup: bool):
    left = pd.DataFrame({"k": [1, 2, 3] + ([2] if left_dup else []), "x": 1.0})
    right = pd.DataFrame({"k": [1, 2, 4] + ([1] if right_dup else []), "z": 2.0})
    return left, right


@pytest.mark.parametrize("left_dup", [False, True])
@pytest.mark.parametrize("right_dup", [False, True])
@pytest.mark.parametrize("rule", list(SPELLINGS))
@pytest.mark.parametrize("short", [False, True])
def test_validate_raises_exactly_where_pandas_merge_does(
    left_dup, right_dup, rule, short
):
    left, right = _validate_case(left_dup, right_dup)
    validate = SPELLINGS[rule] if short else rule
    try:
        expected = len(left.merge(right, on="k", how="left", validate=validate))
    except pd.errors.MergeError:
        expected = None
    join = Join(right, on="k", features=["z"], validate=validate, name="dim")
    if expected is None:
        side = "base" if left_dup and rule in ("one_to_one", "one_to_many") else "dim"
        with pytest.raises(pd.errors.MergeError) as info:
            from_frames(left, ["x"], [join])
        msg = str(info.value)
        assert f"join 'dim': validate={validate!r}" in msg
        assert f"unique keys in table {side!r}" in msg
        assert ("[2]" if side == "base" else "[1]") in msg
        assert isinstance(info.value, ValueError)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", JoinMatchWarning)
            ds = from_frames(left, ["x"], [join])
        assert len(ds) == expected


def test_validate_counts_missing_keys_only_when_they_match():
    left = pd.DataFrame({"k": [1.0, np.nan, np.nan], "x": 1.0})
    right = pd.DataFrame({"k": [1.0, 2.0], "z": 2.0})
    join = Join(right, on="k", features=["z"], validate="one_to_one", min_match=0)
    from_frames(left, ["x"], [join])  # missing keys match nothing: no repeats
    with pytest.raises(pd.errors.MergeError, match=r"\[nan\]"):
        from_frames(left, ["x"], [Join(**{**join.__dict__, "nulls_equal": True})])


def test_an_unknown_validate_is_refused():
    left, right = _validate_case(False, False)
    with pytest.raises(ValueError, match=r"validate must be one of .*'m:m'.*got 'm:n'"):
        from_frames(left, ["x"], [Join(right, on="k", features=["z"], validate="m:n")])


# ------------------------------------------------------------ target length
def test_a_base_length_target_for_a_fanned_out_dataset_names_the_join():
    sales, stores = stores_and_sales()
    dup = pd.concat([stores, stores.iloc[[3]]], ignore_index=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", JoinFanOutWarning)
        ds = from_frames(
            sales, ["q"], [Join(dup, on="store", features=["size"], name="stores")]
        )
    for est in (FactorizedLinearRegression(), FactorizedRidge()):
        with pytest.raises(ValueError) as info:
            est.fit(ds, sales["y"])
        msg = str(info.value)
        assert f"X has {len(ds):,} rows but y has {len(sales):,}" in msg
        assert "join 'stores' repeats rows" in msg and "['S03']" in msg
        assert "ds.align(y)" in msg
    with pytest.raises(
        ValueError, match=r"sample_weight has .*ds.align\(sample_weight\)"
    ):
        FactorizedRidge().fit(
            ds, ds.align(sales["y"]), sample_weight=np.ones(len(sales))
        )
    FactorizedRidge().fit(ds, ds.align(sales["y"]))  # the fix works


def test_a_base_length_target_after_inner_and_outer_joins_names_them():
    base = pd.DataFrame({"k": [1, 2, 3, 4], "x": [1.0, 2.0, 3.0, 4.0]})
    dim = pd.DataFrame({"k": [1, 2, 3, 9], "z": [1.0, 2.0, 3.0, 4.0]})
    ds = from_frames(
        base, ["x"], [Join(dim, on="k", features=["z"], how="inner", name="a")]
    )
    with pytest.raises(ValueError, match=r"inner join 'a' drops 1 unmatched rows"):
        FactorizedRidge().fit(ds, np.ones(4))
    ds = from_frames(
        base, ["x"], [Join(dim, on="k", features=["z"], how="outer", name="b")]
    )
    with pytest.raises(ValueError, match=r"outer join 'b' adds 1 rows of its table"):
        FactorizedRidge().fit(ds, np.ones(4))


# ------------------------------------------------------------ partial mismatch
def test_a_padded_code_warns_even_when_most_rows_match():
    """One padded store code left its rows with zero features in silence."""
    sales, stores = stores_and_sales()
    stores.loc[7, "store"] = " S07"
    n_lost = int((sales["store"] == "S07").sum())
    assert 0 < n_lost < 0.1 * len(sales)
    with pytest.warns(JoinMatchWarning) as record:
        ds = from_frames(
            sales, ["q"], [Join(stores, on="store", features=["size"], name="stores")]
        )
    (w,) = record
    msg = str(w.message)
    assert (
        f"join 'stores' (left, base.store = stores.store) matched {len(sales) - n_lost:,}"
        in msg
    )
    assert "'S07' against ' S07'" in msg and ".str.strip()" in msg
    assert "only a warning" in msg
    assert ds.match_report_.loc["stores", "hazards"][0].startswith("1 of the 1")


def test_unmatched_keys_without_a_hazard_stay_silent():
    sales, stores = stores_and_sales()
    stores = stores[stores["store"] != "S07"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = from_frames(sales, ["q"], [Join(stores, on="store", features=["size"])])
    assert ds.match_report_["hazards"].tolist() == [[]]
    assert ds.match_report_["unmatched_keys"].tolist() == [["S07"]]


def test_a_composite_key_column_absent_for_a_few_rows_is_no_hazard():
    base = pd.DataFrame({"a": [1, 1, 2, 2, 3], "b": ["u", "v", "u", "v", "w"]})
    base["x"] = np.arange(5.0)
    dim = pd.DataFrame({"a": [1, 1, 2, 2], "b": ["u", "v", "u", "v"], "z": 1.0})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_frames(base, ["x"], [Join(dim, on=["a", "b"], features=["z"])])


def test_hazard_checks_look_at_one_row_per_distinct_key_and_a_bounded_number():
    rows = np.arange(10_000)
    codes = rows % 7
    sample = hazard_rows(rows, codes)
    np.testing.assert_array_equal(np.sort(codes[sample]), np.arange(7))
    sample = hazard_rows(rows, rows)
    assert sample.shape[0] == _HAZARD_SAMPLE


# ------------------------------------------------------------ row numbers
@pytest.mark.parametrize("given, keys, right", [(0, (1, 50), 1), (1, (0, 49), 0)])
def test_row_numbers_off_by_one_say_which_first_number(given, keys, right):
    rng = np.random.default_rng(0)
    lo, hi = keys
    base = pd.DataFrame({"r": rng.integers(lo, hi + 1, 500), "x": 1.0})
    base.loc[0, "r"], base.loc[1, "r"] = lo, hi
    table = pd.DataFrame({"z": rng.normal(size=50)})
    with pytest.warns(JoinMatchWarning) as record:
        from_frames(
            base,
            ["x"],
            [Join(table, left_on="r", row_number=given, features=["z"], name="t")],
        )
    msg = str(record[0].message)
    assert f"The keys of base.r span {lo}..{hi}" in msg
    assert f"from {right}, not from {given}" in msg and f"row_number={right}" in msg
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = from_frames(
            base, ["x"], [Join(table, left_on="r", row_number=right, features=["z"])]
        )
    np.testing.assert_allclose(
        ds.materialize()[:, 1], table["z"].to_numpy()[base["r"] - right]
    )


def test_keys_spanning_the_row_numbers_of_a_barely_matched_table_are_named():
    base = pd.DataFrame({"r": np.arange(1, 41) % 20 + 1, "x": 1.0})
    table = pd.DataFrame({"id": np.arange(100, 120), "z": np.arange(20.0)})
    with pytest.raises(
        ValueError,
        match=r"whole numbers from 1 to 20, as many as 't' has rows.*row_number=1",
    ):
        from_frames(
            base,
            ["x"],
            [Join(table, left_on="r", right_on="id", features=["z"], name="t")],
        )


# ------------------------------------------------------------ from_matrices
def test_index_vectors_belong_to_the_dataset():
    """A caller's later write to its index array changed the dataset, and one out
    of range made a fit read past the source."""
    rng = np.random.default_rng(0)
    base, dim = rng.normal(size=(8, 2)), rng.normal(size=(3, 2))
    idx = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    for ind in (idx, pd.Series(idx), idx.astype(np.int32)):
        ds = MultiSourceDataset.from_matrices([base, dim], [None, ind])
        before = ds.materialize().copy()
        ind[0] = 2
        ind[1] = 10**6
        np.testing.assert_array_equal(ds.materialize(), before)
        FactorizedRidge().fit(ds, rng.normal(size=8))
        ind[:2] = [0, 1]


@pytest.mark.parametrize(
    "ind, exc, pattern",
    [
        (np.array([0.0, 1.0, 2.0]), TypeError, "integer index vector"),
        (np.array([True, False, True]), TypeError, "integer index vector"),
        (
            np.array([0, 3, 1]),
            ValueError,
            r"values in \[0, 3\]; expected -1 .* \[0, 3\)",
        ),
        (np.array([0, -2, 1]), ValueError, r"values in \[-2, 1\]"),
        (
            np.array([0, 1], dtype=np.uint64) + np.uint64(2**63),
            ValueError,
            "expected -1",
        ),
        (
            np.array([0, 1]),
            ValueError,
            r"disagree on the number of target rows: \[2, 3\]",
        ),
        (np.array([[0, 1, 2]]), TypeError, "1-D integer index vector"),
    ],
)
def test_bad_index_vectors_are_refused(ind, exc, pattern):
    with pytest.raises(exc, match=pattern):
        MultiSourceDataset.from_matrices(
            [np.ones((3, 1)), np.ones((3, 1))], [None, ind]
        )


@pytest.mark.parametrize("validate", ["one_to_one", "1:m", "x"])
def test_dask_frames_refuse_what_they_cannot_check(validate):
    dd = pytest.importorskip("dask.dataframe")
    from ilargi_sklearn.distributed import dask_from_frames

    facts = dd.from_pandas(pd.DataFrame({"k": [1, 2, 3], "x": 1.0}), npartitions=1)
    dim = pd.DataFrame({"k": [1, 2], "z": [1.0, 2.0]})
    pattern = "validate must be one of" if validate == "x" else "checks the fact"
    with pytest.raises(ValueError, match=pattern):
        dask_from_frames(
            facts, ["x"], [Join(dim, on="k", features=["z"], validate=validate)]
        )
