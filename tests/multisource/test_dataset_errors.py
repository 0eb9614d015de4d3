"""Bad inputs to the dataset builders and operators.

Each case checks the error type, its message (it must name what is wrong and where),
and that the caller's frames and arrays are unchanged afterwards.
"""

from __future__ import annotations

import copy
import re

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from ilargi_sklearn.multisource import (
    Join,
    JoinMatchWarning,
    MultiSourceDataset,
    from_frames,
)


def _snapshot(obj):
    if sp.issparse(obj):
        return (
            type(obj),
            obj.format,
            obj.shape,
            obj.dtype,
            [np.array(a, copy=True) for a in _sparse_arrays(obj)],
        )
    return copy.deepcopy(obj)


def _sparse_arrays(A):
    if A.format in ("csr", "csc"):
        return [A.data, A.indices, A.indptr]
    if A.format == "coo":
        return [A.data, A.row, A.col]
    return [A.toarray()]


def _assert_unchanged(obj, snap):
    if isinstance(obj, pd.DataFrame):
        pd.testing.assert_frame_equal(obj, snap, check_exact=True)
    elif sp.issparse(obj):
        kind, fmt, shape, dtype, arrays = snap
        assert (type(obj), obj.format, obj.shape, obj.dtype) == (
            kind,
            fmt,
            shape,
            dtype,
        )
        for a, b in zip(_sparse_arrays(obj), arrays):
            np.testing.assert_array_equal(a, b)
    elif isinstance(obj, np.ndarray):
        assert obj.dtype == snap.dtype and obj.shape == snap.shape
        np.testing.assert_array_equal(obj, snap)
    elif isinstance(obj, list | tuple):
        assert len(obj) == len(snap)
        for a, b in zip(obj, snap):
            _assert_unchanged(a, b)
    elif isinstance(obj, Join):
        _assert_unchanged(obj.table, snap.table)


def raises_unchanged(exc, match, func, *inputs):
    """``func()`` raises ``exc`` matching ``match``; ``inputs`` are left as they were."""
    snaps = [_snapshot(x) for x in inputs]
    with pytest.raises(exc, match=match):
        func()
    for x, s in zip(inputs, snaps):
        _assert_unchanged(x, s)


# ------------------------------------------------------------------ from_frames
def frames():
    base = pd.DataFrame(
        {
            "k": [1, 2, 3, 2],
            "a": [1.0, 2.0, 3.0, 4.0],
            "c": ["x", "y", "x", "y"],
            "t": pd.to_datetime(["2020-01-01"] * 4),
        }
    )
    dim = pd.DataFrame(
        {
            "k": [1, 2, 5],
            "b": [10.0, 20.0, 30.0],
            "c": ["x", "z", "x"],
            "matched": [1.0, 0.0, 1.0],
        }
    )
    sub = pd.DataFrame({"b": [10.0, 20.0], "e": [0.5, 0.25]})
    return base, dim, sub


def _with(frame, **cols):
    out = frame.copy()
    for k, v in cols.items():
        out[k] = v
    return out


def _frame_cases():
    base, dim, sub = frames()
    nan_base = _with(base, a=[1.0, np.nan, 3.0, 4.0])
    nan_dim = _with(dim, b=[10.0, np.nan, 30.0])
    inf_base = _with(base, a=[1.0, np.inf, 3.0, 4.0])
    inf_dim = _with(dim, b=[10.0, -np.inf, 30.0])
    na_cat = _with(dim, c=["x", None, "x"])
    na_int = _with(base, a=pd.array([1, None, 3, 4], dtype="Int64"))
    str_key = _with(dim, k=["1", "2", "5"])
    bool_key = _with(dim, k=[True, False, True])
    str_time = _with(dim, t=["2020-01-01", "x", "y"])
    no_match = _with(dim, k=[7, 8, 9])
    all_missing = _with(base, c=[None, None, None, None])
    J = Join
    return [
        # missing and infinite values name the source and the column
        (
            "nan base",
            ValueError,
            r"source 'base', column 'a' has 1 NaN values; pass base_impute=\.\.\. \('zero', "
            r"'mean', 'median', 'joined_mean' or a number\)",
            lambda: from_frames(nan_base, ["a"]),
            [nan_base],
        ),
        (
            "nan join",
            ValueError,
            r"source 'dim', column 'b' has 1 NaN values; pass impute=\.\.\. on its Join",
            lambda: from_frames(
                base, ["a"], [J(nan_dim, on="k", features=["b"], name="dim")]
            ),
            [base, nan_dim],
        ),
        (
            "nullable NA",
            ValueError,
            "source 'base', column 'a' has 1 NaN values",
            lambda: from_frames(na_int, ["a"]),
            [na_int],
        ),
        (
            "inf base",
            ValueError,
            "source 'base', column 'a' contains infinite values",
            lambda: from_frames(inf_base, ["a"]),
            [inf_base],
        ),
        (
            "-inf join",
            ValueError,
            "source 'dim', column 'b' contains infinite values",
            lambda: from_frames(
                base, ["a"], [J(inf_dim, on="k", features=["b"], name="dim")]
            ),
            [base, inf_dim],
        ),
        (
            "inf is not imputed",
            ValueError,
            "source 'dim', column 'b' contains infinite",
            lambda: from_frames(
                base,
                ["a"],
                [J(inf_dim, on="k", features=["b"], name="dim", impute="mean")],
            ),
            [base, inf_dim],
        ),
        (
            "missing category",
            ValueError,
            r"source 'dim', column 'c' has 1 missing values; pass impute=\.\.\. on its Join "
            "to encode them as all-zero rows",
            lambda: from_frames(
                base, ["a"], [J(na_cat, on="k", features=["c"], name="dim")]
            ),
            [base, na_cat],
        ),
        (
            "bad impute",
            ValueError,
            "impute of table 'dim' must be None, 'zero', 'mean', 'median', 'joined_mean', "
            "'missing' or a finite number, got 'average'",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, on="k", features=["b"], name="dim", impute="average")],
            ),
            [base, dim],
        ),
        (
            "nan impute",
            ValueError,
            "base_impute of table 'base' must be .* got nan",
            lambda: from_frames(nan_base, ["a"], base_impute=np.nan),
            [nan_base],
        ),
        # keys
        (
            "int vs str keys",
            TypeError,
            r"join 'dim': key base.k \(int64\) and dim.k \((str|object)\) have incompatible "
            r"dtypes: dim.k holds numbers stored as text \(e.g. \['1', '2', '5'\]\); "
            r"convert it first, e.g. frame\['k'\] = pd.to_numeric\(frame\['k'\]\)",
            lambda: from_frames(
                base, ["a"], [J(str_key, on="k", features=["b"], name="dim")]
            ),
            [base, str_key],
        ),
        (
            "int vs bool keys",
            TypeError,
            r"key base.k \(int64\) and dim.k \(bool\)",
            lambda: from_frames(
                base, ["a"], [J(bool_key, on="k", features=["b"], name="dim")]
            ),
            [base, bool_key],
        ),
        (
            "datetime vs str keys",
            TypeError,
            r"key base.t \(datetime64.*\) and dim.t \((str|object)\)",
            lambda: from_frames(
                base, ["a"], [J(str_time, on="t", features=["b"], name="dim")]
            ),
            [base, str_time],
        ),
        (
            "missing left key",
            ValueError,
            r"key columns \['kk'\] not found in table 'base'; its columns are \['k', 'a'",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, left_on="kk", right_on="k", features=["b"], name="dim")],
            ),
            [base, dim],
        ),
        (
            "missing right key",
            ValueError,
            r"key columns \['kk'\] not found in table 'dim'",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, left_on="k", right_on="kk", features=["b"], name="dim")],
            ),
            [base, dim],
        ),
        (
            "missing via key",
            ValueError,
            r"key columns \['e'\] not found in table 'dim'",
            lambda: from_frames(
                base,
                ["a"],
                [
                    J(dim, on="k", features=["b"], name="dim"),
                    J(sub, on="e", features=["b"], name="sub", via="dim"),
                ],
            ),
            [base, dim, sub],
        ),
        (
            "on and left_on",
            ValueError,
            "join 'dim': give either on or left_on/right_on",
            lambda: from_frames(
                base, ["a"], [J(dim, on="k", left_on="k", features=["b"], name="dim")]
            ),
            [base, dim],
        ),
        (
            "left_on alone",
            ValueError,
            "join 'dim': give on, or both left_on and right_on",
            lambda: from_frames(
                base, ["a"], [J(dim, left_on="k", features=["b"], name="dim")]
            ),
            [base, dim],
        ),
        (
            "key lengths",
            ValueError,
            r"left_on \['k', 'a'\] and right_on \['k'\] must have the same length",
            lambda: from_frames(
                base,
                ["a"],
                [
                    J(
                        dim,
                        left_on=["k", "a"],
                        right_on=["k"],
                        features=["b"],
                        name="dim",
                    )
                ],
            ),
            [base, dim],
        ),
        # join structure
        (
            "unknown via",
            ValueError,
            r"join 'dim': via='nope' names no earlier table; known: \['base'\]",
            lambda: from_frames(
                base, ["a"], [J(dim, on="k", features=["b"], name="dim", via="nope")]
            ),
            [base, dim],
        ),
        (
            "forward via",
            ValueError,
            "join 'dim': via='later' names no earlier table",
            lambda: from_frames(
                base,
                ["a"],
                [
                    J(dim, on="k", features=["b"], name="dim", via="later"),
                    J(dim, on="k", features=["b"], name="later"),
                ],
            ),
            [base, dim],
        ),
        (
            "bad how",
            ValueError,
            "join 'dim': how must be 'inner', 'left' or 'outer', got 'right'",
            lambda: from_frames(
                base, ["a"], [J(dim, on="k", features=["b"], name="dim", how="right")]
            ),
            [base, dim],
        ),
        (
            "duplicate join names",
            ValueError,
            "duplicate source name 'dim'",
            lambda: from_frames(
                base,
                ["a"],
                [
                    J(dim, on="k", features=["b"], name="dim"),
                    J(dim, on="k", features=["c"], name="dim"),
                ],
            ),
            [base, dim],
        ),
        (
            "join named like the base",
            ValueError,
            "duplicate source name 'base'",
            lambda: from_frames(
                base, ["a"], [J(dim, on="k", features=["b"], name="base")]
            ),
            [base, dim],
        ),
        (
            "inner join matching nothing",
            ValueError,
            r"join 'dim' \(inner, base.k = dim.k\) matched 0 of 4 rows \(0%\); unmatched "
            r"keys include \[1, 2, 3\]\..* No row matched: the keys are probably wrong. If "
            r"this is intended, pass min_match=0",
            lambda: from_frames(
                base,
                ["a"],
                [J(no_match, on="k", features=["b"], name="dim", how="inner")],
            ),
            [base, no_match],
        ),
        (
            "empty base",
            ValueError,
            "table 'base' is empty",
            lambda: from_frames(base.iloc[:0], ["a"]),
            [base],
        ),
        (
            "empty join table",
            ValueError,
            "table 'dim' is empty",
            lambda: from_frames(
                base, ["a"], [J(dim.iloc[:0], on="k", features=["b"], name="dim")]
            ),
            [base, dim],
        ),
        # features
        (
            "base feature not in table",
            ValueError,
            r"features \['zz'\] not found in table 'base'; its columns are",
            lambda: from_frames(base, ["a", "zz"]),
            [base],
        ),
        (
            "join feature not in table",
            ValueError,
            r"features \['zz'\] not found in table 'dim'",
            lambda: from_frames(
                base, ["a"], [J(dim, on="k", features=["zz"], name="dim")]
            ),
            [base, dim],
        ),
        (
            "repeated feature",
            ValueError,
            r"features of table 'base' list \['a'\] more than once",
            lambda: from_frames(base, ["a", "c", "a"]),
            [base],
        ),
        (
            "stray categorical",
            ValueError,
            r"categorical columns \['k'\] of table 'dim' are not among its features",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, on="k", features=["b"], name="dim", categorical=["k"])],
            ),
            [base, dim],
        ),
        (
            "datetime feature",
            TypeError,
            "source 'base', column 't' has dtype datetime64.*neither numeric nor categorical",
            lambda: from_frames(base, ["t"]),
            [base],
        ),
        (
            "categorical with only missing values",
            ValueError,
            "no features selected.*categorical column whose values all are missing",
            lambda: from_frames(all_missing, ["c"], base_impute="zero"),
            [all_missing],
        ),
        (
            "no features",
            ValueError,
            "no features selected",
            lambda: from_frames(base, [], [J(dim, on="k", name="dim")]),
            [base, dim],
        ),
        (
            "indicator name taken",
            ValueError,
            r"feature names must be unique; \['dim__matched'\]",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, on="k", features=["matched"], name="dim", indicator=True)],
            ),
            [base, dim],
        ),
        # overlapping columns
        (
            "coalesce categorical",
            ValueError,
            "coalesce: column 'c' of table 'base' is categorical",
            lambda: from_frames(
                base,
                ["c"],
                [J(dim, on="k", features=["c"], name="dim")],
                coalesce=["c"],
            ),
            [base, dim],
        ),
        (
            "coalesce unknown",
            ValueError,
            "coalesce names 'bb', which no table lists",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, on="k", features=["b"], name="dim")],
                coalesce=["bb"],
            ),
            [base, dim],
        ),
        (
            "priority unknown",
            ValueError,
            r"priority names unknown sources \['dims'\]; known: \['base', 'dim'\]",
            lambda: from_frames(
                base,
                ["a"],
                [J(dim, on="k", features=["b"], name="dim")],
                priority=["dims"],
            ),
            [base, dim],
        ),
        # types
        (
            "int dtype",
            ValueError,
            "dtype must be float32 or float64, got int64",
            lambda: from_frames(base, ["a"], dtype=np.int64),
            [base],
        ),
        (
            "float16 dtype",
            ValueError,
            "dtype must be float32 or float64, got float16",
            lambda: from_frames(base, ["a"], dtype=np.float16),
            [base],
        ),
        (
            "base not a frame",
            TypeError,
            "base must be a pandas.* got numpy.ndarray",
            lambda: from_frames(base.to_numpy(), ["a"]),
            [base],
        ),
        (
            "join not a Join",
            TypeError,
            r"joins\[0\] must be a Join, got DataFrame",
            lambda: from_frames(base, ["a"], [dim]),
            [base, dim],
        ),
        (
            "Join of an array",
            TypeError,
            "join 'dim': table must be a pandas.* got numpy.ndarray",
            lambda: from_frames(base, ["a"], [J(dim.to_numpy(), on="k", name="dim")]),
            [base, dim],
        ),
    ]


_FRAME_CASES = _frame_cases()


@pytest.mark.parametrize(
    ("exc", "match", "func", "inputs"),
    [c[1:] for c in _FRAME_CASES],
    ids=[c[0] for c in _FRAME_CASES],
)
def test_from_frames_bad_input(exc, match, func, inputs):
    raises_unchanged(exc, match, func, *inputs)


@pytest.mark.parametrize(
    ("impute", "fill"), [("zero", 0.0), ("mean", 3.5), ("median", 3.5), (-1.0, -1.0)]
)
def test_opt_in_imputation(impute, fill):
    base = pd.DataFrame({"k": [0, 1, 2, 3], "a": [1.0, np.nan, 2.0, np.nan]})
    dim = pd.DataFrame(
        {
            "k": [0, 1, 2],
            "b": [np.nan, 4.0, 3.0],
            "g": [None, "u", "v"],
        }
    )
    snaps = [_snapshot(base), _snapshot(dim)]
    base_fill = {"zero": 0.0, "mean": 1.5, "median": 1.5}.get(impute, fill)
    ds = from_frames(
        base,
        ["a"],
        [Join(dim, on="k", features=["b", "g"], impute=impute, name="dim")],
        base_impute=impute,
    )
    _assert_unchanged(base, snaps[0])
    _assert_unchanged(dim, snaps[1])
    expected = np.array(
        [
            [
                1.0,
                fill,
                0,
                0,
            ],  # dim.b missing: imputed; dim.g missing: all-zero one-hot
            [base_fill, 4.0, 1, 0],
            [2.0, 3.0, 0, 1],
            [base_fill, 0.0, 0, 0],  # unmatched: zeros, not the imputed value
        ]
    )
    np.testing.assert_allclose(ds.materialize("dense"), expected)
    # The same numbers from pandas: impute over each table's rows, then merge.
    ref = base.assign(a=base["a"].fillna(base_fill)).merge(
        dim.assign(b=dim["b"].fillna(fill)), on="k", how="left"
    )
    np.testing.assert_allclose(
        ds.materialize("dense")[:, :2], ref[["a", "b"]].fillna(0.0)
    )


def test_missing_keys_never_match_unless_nulls_equal():
    # SQL's rule by default; pandas.merge's with nulls_equal=True (from_frames'
    # Notes). Missing keys are counted in the match report.
    base = pd.DataFrame({"k": [1.0, np.nan, 3.0], "a": [1.0, 2.0, 3.0]})
    dim = pd.DataFrame({"k": [np.nan, 1.0], "b": [5.0, 6.0]})
    with pytest.warns(JoinMatchWarning, match="1 rows have a missing key"):
        ds = from_frames(base, ["a"], [Join(dim, on="k", features=["b"], name="d")])
    np.testing.assert_allclose(ds.materialize("dense"), [[1, 6], [2, 0], [3, 0]])
    report = ds.match_report_.loc["d"]
    assert (report["rows"], report["matched"], report["null_keys"]) == (3, 1, 1)
    # Composite keys: a missing part is a missing key.
    base2 = base.assign(j=["a", "b", "c"])
    dim2 = dim.assign(j=["b", "a"])
    with pytest.warns(JoinMatchWarning):
        ds2 = from_frames(base2, ["a"], [Join(dim2, on=["k", "j"], features=["b"])])
    np.testing.assert_allclose(ds2.materialize("dense")[:, 1], [6, 0, 0])
    same = Join(dim, on="k", features=["b"], nulls_equal=True)
    ds = from_frames(base, ["a"], [same])
    ref = base.merge(dim, on="k", how="left").fillna(0.0)
    np.testing.assert_allclose(ds.materialize("dense"), ref[["a", "b"]])
    # One-to-many: rows with a missing key on the right are never partners.
    many = pd.DataFrame({"k": [np.nan, 1.0, 1.0, np.nan], "b": [5.0, 6.0, 7.0, 8.0]})
    with pytest.warns(JoinMatchWarning):
        ds = from_frames(base, ["a"], [Join(many, on="k", features=["b"])])
    np.testing.assert_allclose(
        ds.materialize("dense"), [[1, 6], [1, 7], [2, 0], [3, 0]]
    )
    ds = from_frames(
        base, ["a"], [Join(many, on="k", features=["b"], nulls_equal=True)]
    )
    ref = base.merge(many, on="k", how="left").fillna(0.0)
    np.testing.assert_allclose(ds.materialize("dense"), ref[["a", "b"]])


# ----------------------------------------------------------------- from_matrices
def _matrix_cases():
    S0 = np.arange(6.0).reshape(3, 2)
    S1 = np.eye(2)
    idx = np.array([0, 1, 1])
    nan1 = np.array([[1.0, np.nan], [0.0, 1.0]])
    inf1 = sp.csr_matrix(np.array([[1.0, 0.0], [0.0, np.inf]]))
    two_ones = sp.csr_matrix(np.array([[1, 0], [1, 1], [0, 1]]))
    not_binary = sp.csr_matrix(np.array([[2.0, 0], [0, 1], [1, 0]]))
    wide = sp.csr_matrix(np.ones((3, 3)))
    out_of_range = np.array([0, 2, 1])
    below = np.array([0, -2, 1])
    floats = np.array([0.0, 1.0, 1.0])
    short = np.array([0, 1])
    big = np.array([0, 2**63, 1], dtype=np.uint64)
    names = ["a", "b", "c", "d"]
    F = MultiSourceDataset.from_matrices
    return [
        (
            "nan dense",
            ValueError,
            "source 's1', column 'd' contains NaN or infinite values",
            lambda: F([S0, nan1], [None, idx], feature_names=names),
            [S0, nan1, idx],
        ),
        (
            "inf sparse",
            ValueError,
            "source 'dim', column 'd' contains NaN or infinite values",
            lambda: F(
                [S0, inf1], [None, idx], feature_names=names, source_names=["b", "dim"]
            ),
            [S0, inf1, idx],
        ),
        (
            "nan default names",
            ValueError,
            "source 's1', column 's1__1' contains NaN",
            lambda: F([S0, nan1], [None, idx]),
            [S0, nan1, idx],
        ),
        (
            "two ones in a row",
            ValueError,
            "indicator of source 's1' has 2 ones in target row 1; a target row takes at most "
            "one row of each source",
            lambda: F([S0, S1], [None, two_ones]),
            [S0, S1, two_ones],
        ),
        (
            "non-binary indicator",
            ValueError,
            "indicator of source 's1' must be binary",
            lambda: F([S0, S1], [None, not_binary]),
            [S0, S1, not_binary],
        ),
        (
            "indicator columns",
            ValueError,
            "indicator of source 's1' has 3 columns but the source has 2 rows",
            lambda: F([S0, S1], [None, wide]),
            [S0, S1, wide],
        ),
        (
            "index out of range",
            ValueError,
            r"indicator of source 's1' has values in \[0, 2\]; expected -1 \(no match\) or a "
            r"row in \[0, 2\)",
            lambda: F([S0, S1], [None, out_of_range]),
            [S0, S1, out_of_range],
        ),
        (
            "index below -1",
            ValueError,
            r"has values in \[-2, 1\]",
            lambda: F([S0, S1], [None, below]),
            [S0, S1, below],
        ),
        (
            "uint64 index beyond int64",
            ValueError,
            r"has values in \[0, 9223372036854775808\]",
            lambda: F([S0, S1], [None, big]),
            [S0, S1, big],
        ),
        (
            "float index vector",
            TypeError,
            r"indicator of source 's1' must be a 1-D integer index vector or a sparse binary "
            r"matrix, got dtype float64 and shape \(3,\)",
            lambda: F([S0, S1], [None, floats]),
            [S0, S1, floats],
        ),
        (
            "mismatched indicator lengths",
            ValueError,
            r"indicators disagree on the number of target rows: \[2, 3\]",
            lambda: F([S0, S1], [None, short]),
            [S0, S1, short],
        ),
        (
            "identity of another length",
            ValueError,
            r"indicators disagree on the number of target rows: \[2, 3\]",
            lambda: F([S0, S1], [None, None]),
            [S0, S1],
        ),
        (
            "number of indicators",
            ValueError,
            "got 2 sources but 1 indicators",
            lambda: F([S0, S1], [None]),
            [S0, S1],
        ),
        (
            "no sources",
            ValueError,
            "at least one source is required",
            lambda: F([], []),
            [],
        ),
        (
            "mapping length",
            ValueError,
            r"mapping of source 's1' must be an integer vector of length 2 \(one target "
            r"column per source column, -1: unused\)",
            lambda: F([S0, S1], [None, idx], [None, np.array([2])]),
            [S0, S1, idx],
        ),
        (
            "float mapping",
            ValueError,
            "mapping of source 's1' must be an integer vector",
            lambda: F([S0, S1], [None, idx], [None, np.array([2.0, 3.0])]),
            [S0, S1, idx],
        ),
        (
            "mapping collision",
            ValueError,
            "mapping of source 's1' sends two columns to one target column",
            lambda: F([S0, S1], [None, idx], [None, np.array([2, 2])]),
            [S0, S1, idx],
        ),
        (
            "mapping below -1",
            ValueError,
            "mapping of source 's1' has values below -1",
            lambda: F([S0, S1], [None, idx], [None, np.array([2, -2])]),
            [S0, S1, idx],
        ),
        (
            "number of mappings",
            ValueError,
            "got 2 sources but 1 mappings",
            lambda: F([S0, S1], [None, idx], [None]),
            [S0, S1, idx],
        ),
        (
            "feature_names length",
            ValueError,
            "got 3 feature names for 4 target columns",
            lambda: F([S0, S1], [None, idx], feature_names=["a", "b", "c"]),
            [S0, S1, idx],
        ),
        (
            "duplicate feature names",
            ValueError,
            r"feature names must be unique; \['a'\] appear more than once",
            lambda: F([S0, S1], [None, idx], feature_names=["a", "b", "a", "c"]),
            [S0, S1, idx],
        ),
        (
            "duplicate source names",
            ValueError,
            r"source_names must be 2 distinct names, got \['x', 'x'\]",
            lambda: F([S0, S1], [None, idx], source_names=["x", "x"]),
            [S0, S1, idx],
        ),
        (
            "bad priority",
            ValueError,
            r"priority must list distinct source indices, got \[0, 5\]",
            lambda: F([S0, S1], [None, idx], priority=[0, 5]),
            [S0, S1, idx],
        ),
        (
            "string source",
            TypeError,
            "source 's0' has dtype <U1; sources must be numeric",
            lambda: F([np.array([["a"]])], [None]),
            [],
        ),
        (
            "3-D source",
            ValueError,
            r"source 's0' must be 2-D, got shape \(3, 1, 1\)",
            lambda: F([np.ones((3, 1, 1))], [None]),
            [],
        ),
        (
            "int dtype",
            ValueError,
            "dtype must be float32 or float64, got int64",
            lambda: F([S0], [None], dtype=np.int64),
            [S0],
        ),
        (
            "unknown dtype",
            ValueError,
            "dtype must be float32 or float64, got 'float65'",
            lambda: F([S0], [None], dtype="float65"),
            [S0],
        ),
    ]


_MATRIX_CASES = _matrix_cases()


@pytest.mark.parametrize(
    ("exc", "match", "func", "inputs"),
    [c[1:] for c in _MATRIX_CASES],
    ids=[c[0] for c in _MATRIX_CASES],
)
def test_from_matrices_bad_input(exc, match, func, inputs):
    raises_unchanged(exc, match, func, *inputs)


def test_non_canonical_sparse_inputs_are_not_modified():
    # Duplicates and explicit zeros are fixed on a copy: the caller's matrices keep
    # their arrays (a shared-array in-place sum_duplicates once corrupted them).
    S = sp.csr_matrix((np.array([1.0, 2.0, 0.0]), [1, 0, 1], [0, 3]), shape=(1, 2))
    ind = sp.csr_matrix((np.array([1.0, 0.0, 1.0]), [0, 1, 1], [0, 2, 3]), shape=(2, 2))
    dim = np.array([[5.0], [6.0]])
    snaps = [_snapshot(S), _snapshot(ind)]
    ds = MultiSourceDataset.from_matrices([S, dim], [np.zeros(2, dtype=np.int64), ind])
    _assert_unchanged(S, snaps[0])
    _assert_unchanged(ind, snaps[1])
    np.testing.assert_allclose(
        ds.materialize("dense"), [[2.0, 1.0, 5.0], [2.0, 1.0, 6.0]]
    )


# -------------------------------------------------------------- dataset methods
@pytest.fixture
def ds():
    rng = np.random.default_rng(0)
    return MultiSourceDataset.from_matrices(
        [rng.standard_normal((6, 2)), rng.standard_normal((3, 2))],
        [None, np.array([0, 1, 2, -1, 0, 1])],
    )


@pytest.mark.parametrize(
    ("key", "exc", "match"),
    [
        (0, IndexError, r"use ds\[0:1\] or ds\[\[0\]\] instead of ds\[0\]"),
        (np.int64(2), IndexError, r"instead of ds\[2\]"),
        (
            ([0, 1], 0),
            IndexError,
            r"selects rows only: use ds\[rows\] or ds\[rows, \.\.\.\]",
        ),
        ((np.array([0, 1]), np.array([0, 1])), IndexError, "selects rows only"),
        ((slice(None), slice(0, 1)), IndexError, "selects rows only"),
        (([0], ..., 0), IndexError, "selects rows only"),
        (np.array([0.5, 1.0]), IndexError, "got dtype float64 with shape"),
        ("a", IndexError, "rows must be an integer array, a boolean mask or a slice"),
        (np.array([[0, 1]]), IndexError, r"got dtype int64 with shape \(1, 2\)"),
        (
            np.array([True, False]),
            IndexError,
            r"boolean mask has shape \(2,\), expected \(6,\)",
        ),
        ([0, 6], IndexError, "index 6 is out of bounds"),
        ([-7], IndexError, "index -7 is out of bounds"),
    ],
)
def test_bad_slicing_keys(ds, key, exc, match):
    snap = _snapshot(key) if isinstance(key, np.ndarray) else None
    with pytest.raises(exc, match=match):
        ds[key]
    if snap is not None:
        _assert_unchanged(key, snap)


@pytest.mark.parametrize(
    ("func", "exc", "match"),
    [
        (
            lambda ds: ds @ np.ones(3),
            ValueError,
            re.escape("right operand has shape (3,); expected (4,) or (4, k)"),
        ),
        (lambda ds: ds @ np.ones((5, 2)), ValueError, re.escape("shape (5, 2)")),
        (lambda ds: ds @ np.ones((4, 2, 1)), ValueError, re.escape("shape (4, 2, 1)")),
        (lambda ds: ds @ 2.0, ValueError, re.escape("right operand has shape ()")),
        (
            lambda ds: np.ones(4) @ ds,
            ValueError,
            re.escape("left operand has shape (4,); expected (6,) or (6, k)"),
        ),
        (
            lambda ds: np.ones((2, 4)) @ ds,
            ValueError,
            re.escape("left operand has shape (2, 4); expected (k, 6)"),
        ),
        (
            lambda ds: ds.T @ np.ones(4),
            ValueError,
            re.escape("right operand has shape (4,); expected (6,) or (6, k)"),
        ),
        (
            lambda ds: ds.T @ np.ones((6, 2, 2)),
            ValueError,
            re.escape("shape (6, 2, 2)"),
        ),
        (lambda ds: ds @ ds, TypeError, "product of two MultiSourceDatasets"),
        (
            lambda ds: ds.gram(weights=np.ones(5)),
            ValueError,
            re.escape("weights operand has shape (5,); expected (6,)"),
        ),
        (
            lambda ds: ds.gram(weights=np.ones((6, 1))),
            ValueError,
            "weights must be 1-D",
        ),
        (
            lambda ds: ds.gram(format="coo"),
            ValueError,
            "format must be 'auto', 'dense' or 'sparse', got 'coo'",
        ),
        (
            lambda ds: ds.materialize("csr"),
            ValueError,
            "format must be 'auto', 'dense' or 'sparse', got 'csr'",
        ),
        (lambda ds: ds.sum(axis=2), ValueError, "axis must be 0, 1 or None, got 2"),
        (
            lambda ds: ds.astype(np.int32),
            ValueError,
            "dtype must be float32 or float64",
        ),
        (
            lambda ds: ds * np.ones(4),
            TypeError,
            "scalar multiplication only, got ndarray",
        ),
        (
            lambda ds: ds / 0,
            ZeroDivisionError,
            "division of a MultiSourceDataset by zero",
        ),
        (lambda ds: ds**-1, ValueError, r"ds \*\* -1: only powers p > 0"),
        (lambda ds: ds + 1, TypeError, "adding a scalar or array"),
        (lambda ds: np.asarray(ds), TypeError, r"shape \(6, 4\).*ds\.materialize\(\)"),
    ],
)
def test_bad_operands(ds, func, exc, match):
    M = ds.materialize("dense")
    with pytest.raises(exc, match=match):
        func(ds)
    np.testing.assert_array_equal(ds.materialize("dense"), M)  # the dataset is intact


def test_operands_are_not_modified(ds):
    rng = np.random.default_rng(1)
    w, W = rng.standard_normal(4), rng.standard_normal((4, 2))
    v, d = rng.standard_normal(6), rng.random(6)
    snaps = [x.copy() for x in (w, W, v, d)]
    ds @ w, ds @ W, ds.T @ v, v @ ds, ds.gram(weights=d), ds[::2] @ w
    for x, s in zip((w, W, v, d), snaps):
        np.testing.assert_array_equal(x, s)
