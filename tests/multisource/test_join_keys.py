"""Join keys of every type match as pandas.merge (or polars' join) matches them.

Integer keys of every width and signedness (NumPy, pandas' nullable and Arrow
integers, polars), mixed widths on the two sides and composite keys that contain
them are compared by value, exactly; float, string, categorical and datetime keys
follow pandas' rules. The property test draws a key dtype per side and compares
``materialize()`` with ``pandas.merge`` for inner, left and outer joins. Key
columns that cannot be joined (duplicate labels, datetimes with and without a time
zone) get errors that name them.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ilargi_sklearn.multisource import Join, JoinMatchWarning, from_frames
from ilargi_sklearn.multisource._keys import column_codes, combine_codes

pa = pytest.importorskip("pyarrow")

NUMPY_INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
NULLABLE_INTS = [
    "Int8",
    "Int16",
    "Int32",
    "Int64",
    "UInt8",
    "UInt16",
    "UInt32",
    "UInt64",
]
ARROW_INTS = [pd.ArrowDtype(getattr(pa, name)()) for name in NUMPY_INTS]
INT_DTYPES = [*NUMPY_INTS, *NULLABLE_INTS, *ARROW_INTS]

#: Integers at the edges of every width, and a few in between.
INT_POOL = sorted(
    {
        v
        for t in NUMPY_INTS
        for v in (int(np.iinfo(t).min), int(np.iinfo(t).max))
        for v in (v, v - 1, v + 1)
    }
    | {0, 1, 2, 3, 7, 100, 2**53 + 1, 2**63 + 5}
)


def int_range(dtype) -> tuple[int, int]:
    dt = pd.api.types.pandas_dtype(dtype)
    info = np.iinfo(getattr(dt, "numpy_dtype", dt))
    return int(info.min), int(info.max)


def nullable(dtype) -> bool:
    return not isinstance(dtype, str) or dtype[0].isupper()


def int_column(values, dtype) -> pd.Series:
    return pd.Series(values, dtype=dtype if nullable(dtype) else np.dtype(dtype))


def exact(s: pd.Series) -> pd.Series:
    """A key column as Python objects (None for missing): pandas compares int64
    against uint64 keys as floats, which merges 2**53 + 1 with 2**53."""
    out = s.astype(object)
    return out.where(s.notna(), None)


def joined(base, dim, how, *, exact_keys=False, nulls_equal=True):
    """``materialize()`` of the dataset and the pandas.merge reference, as
    (x, z) rows (0 where a side is missing), in pandas' row order except outer
    joins (sorted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = from_frames(
            base,
            ["x"],
            [
                Join(
                    dim,
                    on="k",
                    features=["z"],
                    how=how,
                    nulls_equal=nulls_equal,
                    min_match=0,
                )
            ],
            min_match=0,
        )
    got = np.asarray(ds.materialize(format="dense"))
    if exact_keys:
        base = base.assign(k=exact(base["k"]))
        dim = dim.assign(k=exact(dim["k"]))
    ref = base.merge(dim, on="k", how=how)[["x", "z"]].astype(float).fillna(0.0)
    ref = ref.to_numpy()
    if how == "outer":
        got = got[np.lexsort(got.T[::-1])]
        ref = ref[np.lexsort(ref.T[::-1])]
    return got, ref


def frames(left_keys, right_keys):
    base = pd.DataFrame({"k": left_keys})
    base["x"] = np.arange(1.0, len(base) + 1)
    dim = pd.DataFrame({"k": right_keys})
    dim["z"] = np.arange(1001.0, 1001 + len(dim))
    return base, dim


# ------------------------------------------------------------ integer keys
def test_int8_keys_at_both_ends_match_without_wrapping():
    """127 - (-128) wrapped around in int8: the join crashed or matched rows to
    another dimension row's features."""
    base, dim = frames(
        pd.Series([127, -128, 0, 5], dtype="int8"),
        pd.Series([5, 127, -128, 1], dtype="int8"),
    )
    got, ref = joined(base, dim, "left")
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[:, 1], [1002.0, 1003.0, 0.0, 1001.0])


def test_narrow_keys_against_wide_keys_take_their_own_rows():
    """An int8 key against int64 keys: the offset taken in int8 silently gave a
    row no features (the wrong answer, without a word)."""
    base, dim = frames(
        pd.Series([-100, 100], dtype="int8"), pd.Series([100, -100], dtype="int64")
    )
    got, ref = joined(base, dim, "left")
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[:, 1], [1002.0, 1001.0])


@pytest.mark.parametrize(
    "left, right",
    [
        # Near the top of uint64: a small range, offset in uint64.
        ([2**64 - 1, 2**64 - 5, 2**63 + 5], [2**63 + 5, 2**64 - 1, 7]),
        # Wide range above int64: factorized in uint64.
        ([2**64 - 1, 3, 2**63], [3, 2**63, 2**64 - 1]),
    ],
)
def test_uint64_keys_above_the_int64_range(left, right):
    base, dim = frames(
        pd.Series(left, dtype="uint64"), pd.Series(right, dtype="uint64")
    )
    got, ref = joined(base, dim, "left", exact_keys=True)
    np.testing.assert_array_equal(got, ref)
    assert (got[:, 1] > 0).sum() == len(set(left) & set(right))


def test_signed_against_uint64_keys_are_exact_where_pandas_rounds():
    """int64 against uint64: pandas.merge compares them as floats and merges
    2**53 + 1 with 2**53; keys are compared exactly here."""
    base, dim = frames(
        pd.Series([2**53 + 1, -1, 2**60 + 1], dtype="int64"),
        pd.Series([2**53, 2**63 + 5, 2**60], dtype="uint64"),
    )
    got, ref = joined(base, dim, "left", exact_keys=True)
    np.testing.assert_array_equal(got[:, 1], [0.0, 0.0, 0.0])
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("left", INT_DTYPES, ids=str)
@pytest.mark.parametrize("right", ["int8", "int64", "uint64", "Int16", "UInt64"])
def test_integer_keys_of_every_width_and_signedness(left, right):
    lo_l, hi_l = int_range(left)
    lo_r, hi_r = int_range(right)
    lv = [v for v in INT_POOL if lo_l <= v <= hi_l]
    rv = [v for v in INT_POOL if lo_r <= v <= hi_r][::-1]
    left_keys = int_column(lv + ([None] if nullable(left) else []), left)
    right_keys = int_column(rv + ([None] if nullable(right) else []), right)
    base, dim = frames(left_keys, right_keys)
    for how in ("inner", "left", "outer"):
        got, ref = joined(base, dim, how, exact_keys=True)
        np.testing.assert_array_equal(got, ref, err_msg=how)


def test_composite_keys_of_narrow_integers_and_text():
    base, dim = frames(
        pd.Series([127, -128, 127, 0], dtype="int8"),
        pd.Series([127, 127, -128, 0], dtype="int64"),
    )
    base["k2"] = pd.Series([250, 3, 3, 0], dtype="uint8")
    dim["k2"] = pd.Series([3, 250, 3, 1], dtype="UInt16")
    base["k3"], dim["k3"] = ["a", "b", "a", "c"], ["a", "a", "b", "c"]
    ds = from_frames(
        base,
        ["x"],
        [Join(dim, on=["k", "k2", "k3"], features=["z"], min_match=0)],
        min_match=0,
    )
    ref = base.merge(dim, on=["k", "k2", "k3"], how="left")["z"].fillna(0)
    np.testing.assert_array_equal(ds.materialize()[:, 1], ref.to_numpy())
    np.testing.assert_array_equal(ref.to_numpy(), [1002.0, 1003.0, 1001.0, 0.0])


def test_combined_codes_beyond_int64_are_paired_instead_of_multiplied():
    """codes * n_c + c overflows once n_codes * n_c passes 2**63: the pairs are
    factorized instead (equal pairs, equal codes)."""
    codes = np.array([0, 2**40, 5, 2**40, -1], dtype=np.int64)
    c = np.array([2**30, 1, 2**30, 1, 0], dtype=np.int64)
    out, n = combine_codes(codes, 2**41, c, 2**31)
    assert n == 3 and out[1] == out[3] and len({out[0], out[1], out[2]}) == 3
    assert out[4] == -1 and out[:4].max() < n


def test_missing_integer_keys_form_one_code_only_with_nulls_equal():
    a = pd.Series([1, None, 3], dtype="Int8")
    b = pd.Series([None, 3], dtype=pd.ArrowDtype(pa.uint64()))
    codes, n = column_codes(a, b, nulls_equal=False)
    assert codes[1] == -1 and codes[3] == -1 and codes[2] == codes[4]
    codes, n = column_codes(a, b, nulls_equal=True)
    assert codes[1] == codes[3] >= 0 and codes[2] == codes[4] != codes[1]
    assert codes.max() < n


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_polars_integer_keys_match_as_polars_joins(how):
    pl = pytest.importorskip("polars")
    pairs = [
        (pl.Int8, pl.Int64),
        (pl.UInt64, pl.UInt64),
        (pl.Int64, pl.Int8),
        (pl.Int16, pl.UInt32),
    ]
    for left_type, right_type in pairs:
        lo = max(int(np.iinfo(str(t).lower()).min) for t in (left_type, right_type))
        hi = min(int(np.iinfo(str(t).lower()).max) for t in (left_type, right_type))
        left_keys = [
            k for k in [127, -128, None, 5, 2**62, 0] if k is None or lo <= k <= hi
        ]
        right_keys = [
            k for k in [5, 127, None, 2**62, -128, 6] if k is None or lo <= k <= hi
        ]
        left = pl.DataFrame(
            {
                "k": pl.Series(left_keys, dtype=left_type),
                "x": np.arange(1.0, len(left_keys) + 1),
            }
        )
        dim = pl.DataFrame(
            {
                "k": pl.Series(right_keys, dtype=right_type),
                "z": np.arange(1001.0, 1001 + len(right_keys)),
            }
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = from_frames(
                left,
                ["x"],
                [Join(dim, on="k", features=["z"], how=how, min_match=0)],
                min_match=0,
            )
        got = np.asarray(ds.materialize(format="dense"))
        # polars' join, with SQL's rule for missing keys (the default here too).
        ref = (
            left.join(dim, on="k", how="full" if how == "outer" else how)
            .select(["x", "z"])
            .fill_null(0.0)
            .to_numpy()
        )
        got = got[np.lexsort(got.T[::-1])]
        ref = ref[np.lexsort(ref.T[::-1])]
        np.testing.assert_array_equal(got, ref, err_msg=f"{left_type} {right_type}")


def test_arrow_integer_keys_with_nulls_above_2_53_stay_exact():
    """Arrow integers with nulls became floats: 2**53 + 1 and 2**53 merged."""
    base = pa.table({"k": pa.array([2**53 + 1, None, 7], pa.int64()), "x": [1.0, 2, 3]})
    dim = pa.table(
        {"k": pa.array([2**53, 7, None], pa.int64()), "z": [1001.0, 1002, 1003]}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = from_frames(
            base, ["x"], [Join(dim, on="k", features=["z"], min_match=0)], min_match=0
        )
    np.testing.assert_array_equal(ds.materialize()[:, 1], [0.0, 0.0, 1002.0])


# ------------------------------------------------------------ other kinds
def test_object_keys_mixing_numbers_and_text_match_as_pandas():
    base, dim = frames(
        pd.Series([1, "a", 2, "1"], dtype=object),
        pd.Series([1, 2.0, "a"], dtype=object),
    )
    for how in ("inner", "left", "outer"):
        got, ref = joined(base, dim, how)
        np.testing.assert_array_equal(got, ref)
    # Against a column of numbers alone, as pandas.merge does: 1 matches 1, not "1".
    base, dim = frames(
        pd.Series([1, "a", "1"], dtype=object), pd.Series([1, 2], dtype="int64")
    )
    got, ref = joined(base, dim, "left")
    np.testing.assert_array_equal(got, ref)
    np.testing.assert_array_equal(got[:, 1], [1001.0, 0.0, 0.0])


def test_numbers_stored_as_text_beside_numbers_are_named():
    base, dim = frames(
        pd.Series(["1", "2", 3, 4, 5], dtype=object), pd.Series([1, 2, 3, 4, 5])
    )
    with pytest.warns(
        JoinMatchWarning, match=r"'1' against 1\): base.k holds numbers stored as text"
    ):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])
    base, dim = frames(
        pd.Series([1, 2, 3, 4, 5]), pd.Series([" 1", "2", 3, 4, 5], dtype=object)
    )
    with pytest.warns(
        JoinMatchWarning,
        match=r"1 against ' 1'\): join0.k holds numbers stored as text",
    ):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])


def test_non_string_column_labels_join_as_in_pandas():
    base = pd.DataFrame({0: [1, 2, 3], 1: [1.0, 2.0, 3.0]})
    dim = pd.DataFrame({0: [3, 1], 5: [30.0, 10.0]})
    ds = from_frames(base, [1], [Join(dim, on=0, features=[5], name="d")])
    assert list(ds.feature_names) == ["base__1", "d__5"]
    ref = base.merge(dim, on=0, how="left")[5].fillna(0).to_numpy()
    np.testing.assert_array_equal(ds.materialize()[:, 1], ref)
    ds = from_frames(base, [1], [Join(dim, left_on=[0], right_on=(0,), features=[5])])
    np.testing.assert_array_equal(ds.materialize()[:, 1], ref)


@pytest.mark.parametrize(
    "side, cols",
    [("base", ["k", "k", "x"]), ("dim", ["k", "k", "z"]), ("dim", ["k", "z", "z"])],
)
def test_duplicate_column_names_are_named(side, cols):
    base = pd.DataFrame({"k": [1, 2], "x": [1.0, 2.0]})
    dim = pd.DataFrame({"k": [1, 2], "z": [5.0, 6.0]})
    if side == "base":
        base = pd.DataFrame([[1, 1, 1.0], [2, 2, 2.0]], columns=cols)
    else:
        dim = pd.DataFrame([[1, 1, 5.0], [2, 2, 6.0]], columns=cols)
    twice = [c for c in cols if cols.count(c) > 1][0]
    table = "base" if side == "base" else "dim"
    with pytest.raises(
        ValueError, match=rf"table '{table}' has several columns named \['{twice}'\]"
    ):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"], name="dim")])


def test_datetimes_with_and_without_a_time_zone_are_refused():
    base = pd.DataFrame(
        {"k": pd.to_datetime(["2020-01-01", "2020-01-02"]).tz_localize("UTC")}
    ).assign(x=[1.0, 2.0])
    dim = pd.DataFrame({"k": pd.to_datetime(["2020-01-01"]), "z": [1.0]})
    with pytest.raises(TypeError, match="with and without a time zone"):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])
    with pytest.raises(ValueError, match="datetime64"):
        base.merge(dim, on="k")  # pandas refuses them too


def test_big_integers_against_float_keys_warn():
    base, dim = frames(
        pd.Series([2**53 + 1, 5], dtype="int64"), pd.Series([float(2**53), 5.0])
    )
    with pytest.warns(JoinMatchWarning, match=r"beyond 2\*\*53.*compared as floats"):
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])
    got, ref = joined(base, dim, "left")
    np.testing.assert_array_equal(got, ref)  # as pandas.merge: 2**53 + 1 matches
    # Floats below 2**53 cannot equal a rounded integer beyond it: no warning.
    base, dim = frames(pd.Series([2**60, 5]), pd.Series([2.0**52, 5.0]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_frames(base, ["x"], [Join(dim, on="k", features=["z"])])


# ------------------------------------------------------------ property test
def _family_dtypes():
    return {
        "int": INT_DTYPES,
        "float": ["float64", "float32"],
        "string": [object, "str", "category"],
        "datetime": ["datetime64[ns]", "datetime64[us]", "datetime64[s]", "utc"],
    }


TIMES = pd.to_datetime(
    format="ISO8601",
    arg=[
        "2013-01-01",
        "2013-01-01 01:00",
        "2013-06-30",
        "1999-12-31 23:59:59",
        "2020-02-29",
    ],
)
TEXT = ["a", "b", "ab", "A", " a", "0"]
FLOATS = [0.0, -0.0, 0.5, 1.0, 2.0, -3.25, 1e10]


@st.composite
def key_column(draw, family: str, dtype, n: int):
    picks = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    missing = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    if family == "int":
        lo, hi = int_range(dtype)
        pool = [v for v in INT_POOL if lo <= v <= hi]
        # The pool's small values come first on every side: matches happen.
        values = [
            pool[p % min(len(pool), 12)] if p % 3 else pool[p % len(pool)]
            for p in picks
        ]
        if nullable(dtype):
            values = [None if m else v for v, m in zip(values, missing)]
        return int_column(values, dtype)
    if family == "float":
        values = [
            np.nan if m else FLOATS[p % len(FLOATS)] for p, m in zip(picks, missing)
        ]
        return pd.Series(values, dtype=dtype)
    if family == "string":
        values = [None if m else TEXT[p % len(TEXT)] for p, m in zip(picks, missing)]
        return pd.Series(values, dtype=dtype)
    values = [pd.NaT if m else TIMES[p % len(TIMES)] for p, m in zip(picks, missing)]
    s = pd.Series(pd.DatetimeIndex(values))
    if dtype == "utc":
        return s.dt.tz_localize("UTC")
    return s.astype(dtype)


@st.composite
def key_pair(draw):
    families = _family_dtypes()
    family = draw(st.sampled_from(sorted(families)))
    left_dtype = draw(st.sampled_from(families[family]))
    right_dtype = draw(st.sampled_from(families[family]))
    if family == "datetime" and (left_dtype == "utc") != (right_dtype == "utc"):
        right_dtype = left_dtype  # refused on purpose (tested above)
    n_left, n_right = draw(st.integers(1, 8)), draw(st.integers(1, 8))
    left = draw(key_column(family, left_dtype, n_left))
    right = draw(key_column(family, right_dtype, n_right))
    return family, left, right


@given(pair=key_pair(), how=st.sampled_from(["inner", "left", "outer"]))
def test_keys_of_every_dtype_match_as_pandas_merge(pair, how):
    family, left, right = pair
    base, dim = frames(left, right)
    exact_keys = family == "int"
    keys = [exact(t["k"]) if exact_keys else t["k"] for t in (base, dim)]
    if how == "inner" and not np.isin(keys[0].dropna(), keys[1].dropna()).any():
        return  # no row left: from_frames refuses that (tested elsewhere)
    got, ref = joined(base, dim, how, exact_keys=exact_keys)
    np.testing.assert_array_equal(got, ref)


@given(pair=key_pair(), how=st.sampled_from(["left", "outer"]))
def test_int_and_float_keys_match_as_pandas_merge(pair, how):
    """Numbers of both kinds: compared as floats, as pandas does (values below
    2**53, where that is exact)."""
    family, left, _ = pair
    if family != "int":
        return
    small = left.dropna()
    small = small[(small.astype(float).abs() < 2**53).to_numpy()]
    if small.empty:
        return
    right = pd.Series(small.astype(float).to_numpy()[::-1].tolist() + [0.5, np.nan])
    base, dim = frames(small.reset_index(drop=True), right)
    # The reference on Python numbers (1 == 1.0): pandas cannot merge Arrow
    # integers with floats that are not whole.
    got, ref = joined(base, dim, how, exact_keys=True)
    np.testing.assert_array_equal(got, ref)
