"""Random multi-source schemas for tests: every integration scenario of DESIGN.md 2."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ilargi_sklearn.multisource import MultiSourceDataset

__all__ = ["SCENARIOS", "random_dataset"]

SCENARIOS = (
    "star",
    "left",
    "inner",
    "outer",
    "snowflake",
    "many_to_many",
    "overlap",
    "sparse",
    "union",
    "float32",
)


def _source(
    rng: np.random.Generator, r: int, c: int, sparse: bool, nonneg: bool
) -> Any:
    if sparse:
        S = sp.random(r, c, density=0.3, random_state=rng, format="csr")
        if not nonneg:
            S.data = rng.standard_normal(S.data.shape[0])
        return S
    return rng.random((r, c)) if nonneg else rng.standard_normal((r, c))


def random_dataset(
    seed: int = 0,
    *,
    n_rows: int = 60,
    n_sources: int = 3,
    scenario: str = "star",
    nonneg: bool = False,
    dtype: Any = np.float64,
) -> MultiSourceDataset:
    """A small random dataset for one integration scenario.

    Parameters
    ----------
    seed : int
        Seed of the generator.
    n_rows : int
        Target rows (before a union doubles them).
    n_sources : int
        Number of sources (1-4), the base included when there is one.
    scenario : str
        One of :data:`SCENARIOS`.
    nonneg : bool
        Draw non-negative values (for GNMF).
    dtype : dtype
        float64 or float32 (``scenario="float32"`` forces float32).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"scenario must be one of {SCENARIOS}, got {scenario!r}.")
    rng = np.random.default_rng(seed)
    if scenario == "float32":
        dtype = np.float32
    sparse = scenario == "sparse"
    n_dims = max(n_sources - 1, 1)
    has_base = scenario != "many_to_many"
    sources, indicators = [], []
    if has_base:
        sources.append(_source(rng, n_rows, int(rng.integers(1, 4)), sparse, nonneg))
        indicators.append(None)
    for d in range(n_dims if has_base else max(n_sources, 2)):
        r = int(rng.integers(2, max(3, n_rows // 4)))
        c = int(rng.integers(1, 5))
        sources.append(_source(rng, r, c, sparse and d % 2 == 0, nonneg))
        idx = rng.integers(0, r, n_rows)
        if scenario in ("left", "outer") or (scenario == "snowflake" and d > 0):
            idx[rng.random(n_rows) < 0.25] = -1
        indicators.append(idx)
    if scenario == "snowflake" and len(sources) >= 2:
        # A second hop: a table keyed by the first dimension's rows, composed.
        r1 = sources[-1].shape[0] if not has_base else sources[1].shape[0]
        hop_rows = int(rng.integers(2, 6))
        hop_of_dim = rng.integers(0, hop_rows, r1)
        dim_idx = indicators[1] if has_base else indicators[0]
        composed = np.where(dim_idx >= 0, hop_of_dim[np.maximum(dim_idx, 0)], -1)
        sources.append(_source(rng, hop_rows, 2, False, nonneg))
        indicators.append(composed)
    if scenario == "outer" and has_base:
        # Rows of a dimension table that match no base row: the base is -1 there.
        extra = int(rng.integers(1, 5))
        base_idx = np.concatenate([np.arange(n_rows), np.full(extra, -1)])
        indicators = [base_idx] + [
            np.concatenate([i, rng.integers(0, sources[k + 1].shape[0], extra) * 0 - 1])
            for k, i in enumerate(indicators[1:])
        ]
        indicators[1][-extra:] = rng.integers(0, sources[1].shape[0], extra)
    if scenario == "inner":
        keep = np.ones(n_rows, dtype=bool)
        keep[rng.random(n_rows) < 0.2] = False
        keep[0] = True
        indicators = [
            (np.arange(n_rows)[keep] if i is None else i[keep]) for i in indicators
        ]
    mappings = None
    if scenario == "overlap" and len(sources) >= 2:
        # Two sources share their first target column (ownership rule).
        offsets = np.cumsum([0] + [S.shape[1] for S in sources])
        mappings = [np.arange(offsets[k], offsets[k + 1]) for k in range(len(sources))]
        mappings[1] = mappings[1].copy()
        mappings[1][0] = 0
        used = np.unique(np.concatenate(mappings))
        remap = np.full(offsets[-1], -1)
        remap[used] = np.arange(used.size)
        mappings = [remap[m] for m in mappings]
        for k in range(1, len(indicators)):
            if indicators[k] is not None:
                indicators[k] = indicators[k].copy()
                indicators[k][rng.random(indicators[k].shape[0]) < 0.3] = -1
    ds = MultiSourceDataset.from_matrices(sources, indicators, mappings, dtype=dtype)
    if scenario == "union":
        # Same schema by construction: the dataset stacked on a row subset of itself,
        # so the second half repeats rows of the shared sources.
        return MultiSourceDataset.union(
            [ds, ds[rng.permutation(len(ds))[: len(ds) // 2]]]
        )
    return ds
