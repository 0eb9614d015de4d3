"""What a dataset holds: :class:`DatasetDescription` (``ds.describe()``), the
dataset's ``repr``, its builder's match report as a frame and the source that holds
NaN."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from ilargi_sklearn._backend._namespace import to_numpy
from ilargi_sklearn.multisource._interactions import InteractionOperator
from ilargi_sklearn.multisource._operators import AffineOperator

__all__ = [
    "DatasetDescription",
    "dataset_repr",
    "describe",
    "match_report",
    "nan_source",
]

# The functions below are methods of :class:`MultiSourceDataset` (assigned in its
# class body, as pandas assigns ``DataFrame.hist``): ``self`` is the dataset.


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"  # pragma: no cover


@dataclass
class DatasetDescription:
    """Schema and redundancy figures of a :class:`MultiSourceDataset`.

    Attributes
    ----------
    sources : pandas.DataFrame
        One row per source: rows, columns, stored non-zeros, bytes, tuple ratio
        (target rows / source rows), feature ratio (source columns / base columns)
        and the fraction of target rows it matches.
    summary : dict
        Target rows and columns, non-zeros of the sources and of the joined matrix,
        bytes factorized vs materialized (dense and CSR) and their ratio.
    """

    sources: pd.DataFrame
    summary: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        s = self.summary
        lines = [
            f"target: {s['n_rows']:,} rows x {s['n_features']:,} features",
            self.sources.to_string(),
            f"non-zeros: sources {s['nnz_sources']:,}, joined {s['nnz_joined']:,} "
            f"({s['nnz_ratio']:.2f}x)",
            f"bytes: factorized {_fmt_bytes(s['bytes_factorized'])}, joined "
            f"{_fmt_bytes(s['bytes_materialized'])} as {s['materialized_format']} "
            f"({s['bytes_ratio']:.2f}x)",
        ]
        return "\n".join(lines)

    __repr__ = __str__


def describe(self) -> DatasetDescription:
    """:meth:`MultiSourceDataset.describe`."""
    if isinstance(self.operator, InteractionOperator):
        raise TypeError(
            "describe() reports the joins of a dataset; this one holds implicit "
            "polynomial features of another: describe that dataset (the input "
            "of FactorizedPolynomialFeatures) instead."
        )
    fm = self._factorized()
    n_rows, n_cols = self.shape
    rows: dict[int, dict[str, Any]] = {}
    seen: set[int] = set()
    for t in fm.terms:
        r = rows.setdefault(
            t.source,
            {
                "rows": t.S.shape[0],
                "columns": 0,
                "nnz": 0,
                "bytes": 0,
                "sparse": t.is_sparse,
                "matched": 0.0,
            },
        )
        r["columns"] += t.S.shape[1]
        S = t.S
        if id(S) not in seen:
            seen.add(id(S))
            r["nnz"] += int(S.nnz if sp.issparse(S) else np.count_nonzero(S))
            r["bytes"] += int(
                S.data.nbytes + S.indices.nbytes + S.indptr.nbytes
                if sp.issparse(S)
                else S.nbytes
            )
        r["matched"] = max(
            r["matched"], float(t.rows.matched.mean()) if n_rows else 0.0
        )
    base_cols = rows[self._base_source]["columns"] if self._base_source in rows else 0
    table = pd.DataFrame.from_dict(rows, orient="index").sort_index()
    names = self.source_names
    table.index = [names[k] for k in table.index]
    table["tuple_ratio"] = n_rows / table["rows"].clip(lower=1)
    # Without base features (a relationship table) every source is infinitely
    # wider than the base.
    table["feature_ratio"] = table["columns"] / base_cols if base_cols else np.inf
    nnz_joined = fm.nnz()
    itemsize = self.dtype.itemsize
    sparse = fm.is_sparse
    dense_bytes = n_rows * n_cols * itemsize
    csr_bytes = nnz_joined * (itemsize + 4) + (n_rows + 1) * 8
    mat_bytes = csr_bytes if sparse else dense_bytes
    nnz_sources = int(table["nnz"].sum())
    summary = {
        "n_rows": n_rows,
        "n_features": n_cols,
        "n_sources": self.n_sources,
        "nnz_sources": nnz_sources,
        "nnz_joined": nnz_joined,
        "nnz_ratio": nnz_joined / max(nnz_sources, 1),
        "bytes_factorized": self.nbytes,
        "bytes_materialized": mat_bytes,
        "bytes_dense": dense_bytes,
        "bytes_csr": csr_bytes,
        "materialized_format": "CSR" if sparse else "dense",
        "bytes_ratio": mat_bytes / max(self.nbytes, 1),
    }
    return DatasetDescription(table, summary)


def dataset_repr(self: Any) -> str:
    """``repr`` of a :class:`MultiSourceDataset`: rows, features, sources, bytes."""
    try:
        fm = self._factorized()
    except TypeError:
        # Operators without in-memory terms (a Dask-backed dataset): no per-source
        # breakdown without touching the cluster.
        return (
            f"MultiSourceDataset({len(self):,} rows x {self.shape[1]} features, "
            f"{self.n_sources} sources on {type(self.operator).__name__}; {self.dtype})"
        )
    parts: dict[int, list[int]] = {}
    for t in fm.terms:
        p = parts.setdefault(t.source, [t.S.shape[0], 0, int(t.is_sparse)])
        p[1] += t.S.shape[1]
    names = self.source_names
    srcs = ", ".join(
        f"{names[k]} {r:,}x{c}{' sparse' if s else ''}"
        for k, (r, c, s) in sorted(parts.items())
    )
    scaled = ", scaled" if isinstance(self.operator, AffineOperator) else ""
    return (
        f"MultiSourceDataset({len(self):,} rows x {self.shape[1]} features, "
        f"{self.n_sources} sources: {srcs}; {self.dtype}{scaled}, "
        f"{_fmt_bytes(self.nbytes)})"
    )


def match_report(self: Any) -> pd.DataFrame | None:
    """How each join matched, one row per join (datasets built from frames).

    Columns: ``how``, ``on`` (the key equation), ``rows`` (rows the join was
    applied to: those its left table matched), ``matched``, ``fraction``,
    ``null_keys`` (rows whose key is missing: they match nothing),
    ``unmatched_keys`` (a few key values that found no partner), ``hazards``
    (likely key mistakes, looked for whenever a key is unmatched),
    ``rows_out`` (rows after the join), ``fan_out`` (rows of the table per
    matched row: 1 for a lookup, more where keys repeat in the table) and
    ``repeated_keys`` (a few keys that matched several rows). None for
    datasets built from matrices.
    """
    report = self._match_report
    if report is None:
        return None
    columns = [
        "how",
        "on",
        "rows",
        "matched",
        "fraction",
        "null_keys",
        "unmatched_keys",
        "hazards",
        "rows_out",
        "fan_out",
        "repeated_keys",
    ]
    frame = pd.DataFrame(report, columns=["join", *columns])
    return frame.set_index("join")


def nan_source(self) -> str | None:
    """The name of a source holding NaN (None when none does).

    Only a dataset that :attr:`allows_nan` can hold NaN; the answer is
    computed once (the sources are never modified).
    """
    if not self.allows_nan:
        return None
    if getattr(self, "_has_nan", None) is None:
        found: str | bool = False
        for t in self._factorized().terms:
            S = to_numpy(t.S)
            vals = S.data if sp.issparse(S) else S
            if np.isnan(vals).any():
                found = self._source_names[t.source]
                break
        self._has_nan = found
    return self._has_nan or None
