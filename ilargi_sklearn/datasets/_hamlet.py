"""The Hamlet benchmark datasets (Morpheus format) as MultiSourceDatasets.

Hamlet is the collection of real multi-table datasets used throughout the
factorized-learning literature (Kumar et al., "To Join or Not to Join?", SIGMOD
2016; Morpheus, VLDB 2017). Each dataset is a folder in the Morpheus format:

* ``MLY.csv``: the target, one column ``V1``, one row per target (joined) row;
* ``MLSSparse.txt`` (MatrixMarket) or ``MLSraw.txt`` (one raw integer column, one-hot
  encoded here): features of the base (fact) table, when it has any;
* ``MLFK{i}.csv``: for each target row the 1-based row of dimension table ``R_i``;
* ``MLR{i}Sparse.txt``: dimension table ``R_i`` as a MatrixMarket matrix (one-hot
  encoded attributes; its first ``n_Ri`` columns are a one-hot of the table's key).

Datasets without an ``MLS*`` file are many-to-many: the target rows are a
relationship table of foreign keys only, and the dataset has no base source.

The data are not shipped with this package (each dataset has its own terms of use);
the loader reads them from a folder given by path and never copies them.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import scipy
import scipy.sparse as sp
from scipy.io import mmread
from sklearn.utils import Bunch

from ilargi_sklearn.multisource import MultiSourceDataset

__all__ = ["HAMLET_DATASETS", "load_hamlet"]

logger = logging.getLogger(__name__)

#: Known datasets: target rows, base features, dimension tables (rows, columns), target.
HAMLET_DATASETS: dict[str, dict] = {
    "BookCrossing": {
        "n_rows": 253_120,
        "base": None,
        "dims": [(27_876, 28_022), (49_972, 53_641)],
        "target": "book rating, 1-5",
    },
    "Flights": {
        "n_rows": 66_548,
        "base": (66_548, 20),
        "dims": [(540, 718), (3_167, 6_464), (3_170, 6_467)],
        "target": "codeshare flight, 0/1",
    },
    "LastFM": {
        "n_rows": 343_747,
        "base": None,
        "dims": [(4_999, 5_019), (50_000, 50_233)],
        "target": "listening-count bin, 1-5",
    },
    "Walmart": {
        "n_rows": 421_570,
        "base": (421_570, 81),
        "dims": [(2_340, 2_387), (45, 53)],
        "target": "weekly-sales bin, 1-7",
    },
    "Yelp": {
        "n_rows": 215_879,
        "base": None,
        "dims": [(11_535, 11_706), (43_873, 43_900)],
        "target": "review stars, 1-5",
    },
}

# SciPy >= 1.12 reads MatrixMarket with the compiled fast_matrix_market; older SciPy
# has a pure-Python reader, slow on files of this size.
_FAST_MMREAD = tuple(int(p) for p in scipy.__version__.split(".")[:2]) >= (1, 12)


def _resolve_folder(name: str, path: str | os.PathLike | None) -> tuple[str, Path]:
    """The canonical dataset name and its folder."""
    if path is None:
        root = os.environ.get("ILARGI_DATA_DIR")
        if not root:
            raise ValueError(
                "give the folder of the Hamlet datasets as path=..., or set the "
                "environment variable ILARGI_DATA_DIR to a folder holding hamlet/."
            )
        path = Path(root) / "hamlet"
    path = Path(path).expanduser()
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}.")
    canonical = {k.lower(): k for k in HAMLET_DATASETS}
    key = canonical.get(name.lower())
    if key is None:
        # A folder in the same format that is not in the catalogue (Expedia,
        # MovieLens1M, or a user's own) loads too.
        for candidate in (path / name, path):
            if (candidate / "MLY.csv").is_file() and (
                candidate == path / name or candidate.name.lower() == name.lower()
            ):
                return candidate.name, candidate
        raise ValueError(
            f"unknown Hamlet dataset {name!r}; available: "
            f"{', '.join(sorted(HAMLET_DATASETS))} (or any folder in the Morpheus "
            f"format under {str(path)!r})."
        )
    if not path.is_dir():
        raise FileNotFoundError(f"Hamlet data folder {str(path)!r} does not exist.")
    if path.name.lower() == key.lower() and (path / "MLY.csv").is_file():
        return key, path
    for child in (
        path / key,
        *(p for p in path.iterdir() if p.name.lower() == key.lower()),
    ):
        if child.is_dir():
            return key, child
    raise FileNotFoundError(
        f"Hamlet dataset {key!r} not found: no folder {str(path / key)!r} (path may be "
        "the folder holding the datasets or the dataset's own folder)."
    )


def _require(folder: Path, filename: str) -> Path:
    f = folder / filename
    if not f.is_file():
        raise FileNotFoundError(f"Hamlet file {str(f)!r} is missing.")
    return f


def _read_v1(f: Path, dtype) -> np.ndarray:
    col = pd.read_csv(f, usecols=["V1"], dtype={"V1": dtype}, engine="c")["V1"]
    if col.isna().any():
        raise ValueError(f"{str(f)!r} has {int(col.isna().sum())} missing values.")
    return col.to_numpy()


def _mm_header(f: Path) -> tuple[list[str], int, tuple[int, int, int]]:
    """Banner words, lines before the first entry, and (rows, columns, entries)."""
    with open(f) as fh:
        banner = fh.readline().lower().split()
        n_lines = 1
        line = fh.readline()
        n_lines += 1
        while line.startswith("%") or not line.strip():
            line = fh.readline()
            n_lines += 1
            if not line:
                raise ValueError(f"{str(f)!r} has no MatrixMarket size line.")
    if banner[:2] != ["%%matrixmarket", "matrix"] or len(banner) < 5:
        raise ValueError(f"{str(f)!r} is not a MatrixMarket file (banner {banner}).")
    size = tuple(int(v) for v in line.split())
    if len(size) != 3:
        raise ValueError(f"{str(f)!r}: bad MatrixMarket size line {line.strip()!r}.")
    return banner, n_lines, size


def _read_coordinate(f: Path, dtype) -> sp.csr_matrix:
    """Read a ``coordinate general`` MatrixMarket file with pandas' C parser."""
    banner, skip, (r, c, n) = _mm_header(f)
    field = banner[3]
    names = ["i", "j"] if field == "pattern" else ["i", "j", "v"]
    df = pd.read_csv(
        f,
        sep=r"\s+",
        header=None,
        skiprows=skip,
        names=names,
        engine="c",
        dtype={"i": np.int64, "j": np.int64},
    )
    if len(df) != n:
        raise ValueError(f"{str(f)!r} announces {n} entries but holds {len(df)}.")
    data = np.ones(n, dtype=dtype) if field == "pattern" else df["v"].to_numpy(dtype)
    return sp.csr_matrix(
        (data, (df["i"].to_numpy() - 1, df["j"].to_numpy() - 1)),
        shape=(r, c),
        dtype=dtype,
    )


def _read_mm(f: Path, dtype, engine: str = "auto") -> sp.csr_matrix:
    """A MatrixMarket file as CSR of ``dtype``.

    ``engine="auto"`` uses SciPy's reader when it is the compiled one (SciPy >= 1.12,
    2-3x faster than pandas on the Hamlet tables), else pandas' C parser for
    ``coordinate general`` files (pattern, integer or real) instead of the
    pure-Python reader of older SciPy.
    """
    banner, _, _ = _mm_header(f)
    simple = (
        banner[2] == "coordinate"
        and banner[3] in ("pattern", "integer", "real")
        and (banner[4] == "general")
    )
    if engine == "pandas" or (engine == "auto" and not _FAST_MMREAD and simple):
        if not simple:
            raise ValueError(
                f"{str(f)!r}: the pandas reader takes coordinate general files."
            )
        return _read_coordinate(f, dtype)
    return sp.csr_matrix(mmread(f), dtype=dtype)


def _onehot_raw(values: np.ndarray, dtype) -> tuple[sp.csr_matrix, np.ndarray]:
    cats, codes = np.unique(values, return_inverse=True)
    n = values.shape[0]
    S = sp.csr_matrix(
        (np.ones(n, dtype=dtype), (np.arange(n), codes.ravel())),
        shape=(n, cats.shape[0]),
    )
    return S, cats


def load_hamlet(name, path=None, *, dtype=np.float64, engine="auto"):
    """Load a Hamlet benchmark dataset (Morpheus format) as a MultiSourceDataset.

    Reads the dataset from ``path`` (nothing is copied or cached): the base table's
    features when it has any (``MLSSparse.txt``, or ``MLSraw.txt`` one-hot encoded),
    the dimension tables ``MLR{i}Sparse.txt`` and their 1-based foreign keys
    ``MLFK{i}.csv``, and the target ``MLY.csv``.

    Parameters
    ----------
    name : str
        Dataset name, case-insensitive: one of ``"BookCrossing"``, ``"Flights"``,
        ``"LastFM"``, ``"Walmart"``, ``"Yelp"`` (see :data:`HAMLET_DATASETS`), or the
        name of any other folder under ``path`` in the same format.
    path : str or path-like, optional
        The folder holding the datasets (``path / name``) or the dataset's own folder.
        Default ``$ILARGI_DATA_DIR/hamlet``.
    dtype : {np.float64, np.float32}, default=np.float64
        Dtype of the sources.
    engine : {"auto", "scipy", "pandas"}, default="auto"
        MatrixMarket reader. ``"auto"`` uses :func:`scipy.io.mmread` on SciPy >= 1.12
        (compiled) and pandas' C parser on older SciPy, whose pure-Python reader is
        slow on the larger files.

    Returns
    -------
    data : sklearn.utils.Bunch
        ``dataset`` (MultiSourceDataset; sources ``"S"`` for the base table when there
        is one, then ``"R1"``, ``"R2"``, ...), ``target`` (``MLY.csv`` column ``V1``),
        ``name``, ``path`` (the dataset folder), ``source_shapes`` (dict of source
        name to shape), ``n_rows``, ``many_to_many`` (True when there is no base
        table), ``base_categories`` (the raw values behind the one-hot columns of
        ``MLSraw.txt``, else None), ``target_description`` and ``DESCR``.

    Raises
    ------
    ValueError
        Unknown dataset name (the message lists the available ones), or
        inconsistent files (foreign keys out of range, lengths that disagree).
    FileNotFoundError
        A missing folder or file (the message names the path).

    See Also
    --------
    load_flights : the nycflights13 star schema, from DataFrames.
    make_multi_source : synthetic star schemas with a planted model.

    Notes
    -----
    Reading time on a 2-core machine (SciPy 1.17): Flights 0.03-0.1 s, the largest
    (BookCrossing, LastFM, Yelp) 0.1-0.25 s, most of it parsing the CSV keys and
    target; on the dimension tables SciPy's compiled MatrixMarket reader is 2-3x
    faster than pandas. The one-hot tables are kept as CSR; the joined matrix is
    never built.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from ilargi_sklearn.datasets import load_hamlet
    >>> tmp = tempfile.TemporaryDirectory()
    >>> d = pathlib.Path(tmp.name) / "Tiny"
    >>> d.mkdir()
    >>> _ = (d / "MLY.csv").write_text('"V1"\\n1\\n0\\n1\\n')
    >>> _ = (d / "MLFK1.csv").write_text('"V1"\\n1\\n2\\n2\\n')
    >>> _ = (d / "MLR1Sparse.txt").write_text(
    ...     "%%MatrixMarket matrix coordinate pattern general\\n2 3 3\\n1 1\\n2 2\\n2 3\\n")
    >>> data = load_hamlet("Tiny", d.parent)
    >>> data.dataset.shape, data.many_to_many
    ((3, 3), True)
    >>> data.dataset.materialize("dense")
    array([[1., 0., 0.],
           [0., 1., 1.],
           [0., 1., 1.]])
    >>> tmp.cleanup()
    """
    if engine not in ("auto", "scipy", "pandas"):
        raise ValueError(f"engine must be 'auto', 'scipy' or 'pandas', got {engine!r}.")
    dtype = np.dtype(dtype)
    if dtype not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype}.")
    key, folder = _resolve_folder(name, path)
    t0 = time.perf_counter()

    y = _read_v1(_require(folder, "MLY.csv"), np.float64)
    n_rows = y.shape[0]
    if np.all(y == np.round(y)):
        y = y.astype(np.int64)

    sources, indicators, names, feature_names = [], [], [], []
    base_categories = None
    if (folder / "MLSSparse.txt").is_file():
        S = _read_mm(folder / "MLSSparse.txt", dtype, engine)
        feature_names += [f"S__{j}" for j in range(S.shape[1])]
    elif (folder / "MLSraw.txt").is_file():
        raw = _read_v1(folder / "MLSraw.txt", np.int64)
        S, base_categories = _onehot_raw(raw, dtype)
        feature_names += [f"S__{v}" for v in base_categories]
    else:
        S = None
    if S is not None:
        if S.shape[0] != n_rows:
            raise ValueError(
                f"the base table of {key!r} has {S.shape[0]} rows but MLY.csv has {n_rows}."
            )
        sources.append(S)
        indicators.append(None)
        names.append("S")

    i = 1
    while (folder / f"MLR{i}Sparse.txt").is_file() or (
        folder / f"MLFK{i}.csv"
    ).is_file():
        R = _read_mm(_require(folder, f"MLR{i}Sparse.txt"), dtype, engine)
        fk_file = _require(folder, f"MLFK{i}.csv")
        fk = _read_v1(fk_file, np.int64)
        if fk.shape[0] != n_rows:
            raise ValueError(
                f"{str(fk_file)!r} has {fk.shape[0]} rows but MLY.csv has {n_rows}."
            )
        if fk.size and (fk.min() < 1 or fk.max() > R.shape[0]):
            raise ValueError(
                f"{str(fk_file)!r} holds keys in [{fk.min()}, {fk.max()}]; 1-based keys "
                f"into R{i} must lie in [1, {R.shape[0]}]."
            )
        sources.append(R)
        indicators.append(fk - 1)
        names.append(f"R{i}")
        feature_names += [f"R{i}__{j}" for j in range(R.shape[1])]
        i += 1
    if i == 1:
        raise FileNotFoundError(
            f"Hamlet dataset folder {str(folder)!r} has no dimension table "
            "(MLR1Sparse.txt and MLFK1.csv)."
        )
    ds = MultiSourceDataset.from_matrices(
        sources,
        indicators,
        feature_names=feature_names,
        source_names=names,
        dtype=dtype,
    )
    logger.info(
        "loaded Hamlet %s from %s in %.2f s", key, folder, time.perf_counter() - t0
    )
    meta = HAMLET_DATASETS.get(key, {})
    return Bunch(
        dataset=ds,
        target=y,
        name=key,
        path=folder,
        source_shapes={n: s.shape for n, s in zip(names, sources)},
        n_rows=n_rows,
        many_to_many=S is None,
        base_categories=base_categories,
        target_description=meta.get("target", "MLY.csv column V1"),
        DESCR=__doc__,
    )
