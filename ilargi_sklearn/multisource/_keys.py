"""Join keys: their kinds, their integer codes and the hazards of unmatched keys.

A join is computed on key codes only: each key column is factorized once over both
tables, so that equal keys get equal codes. Missing keys (NaN, None, NaT) never
match, as in SQL, unless a join asks for pandas' rule (``nulls_equal=True``: a
missing key matches a missing key).

When few rows match, :func:`key_hazards` looks at the unmatched key values for the
usual mistakes: text that differs by surrounding whitespace, quotes, case or
leading zeros, whole numbers against fractional ones, and which column of a
composite key never matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["column_codes", "key_codes", "key_hazards", "key_kind", "numbers_as_text"]

#: Distinct unmatched key values looked at for hazards.
_HAZARD_SAMPLE = 2000


def key_kind(s: pd.Series) -> str:
    """The kind of a key column: "numeric", "string", "bool", "datetime", "any"."""
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        return key_kind(pd.Series(dt.categories))
    if pd.api.types.is_bool_dtype(dt):
        return "bool"
    if pd.api.types.is_numeric_dtype(dt):
        return "numeric"
    if pd.api.types.is_datetime64_any_dtype(dt):
        return "datetime"
    if pd.api.types.is_string_dtype(dt) or pd.api.types.is_object_dtype(dt):
        inferred = pd.api.types.infer_dtype(s, skipna=True)
        if inferred in ("integer", "floating", "mixed-integer-float", "decimal"):
            return "numeric"
        if inferred == "empty":
            return "any"
        return "string"
    return str(dt)


def numbers_as_text(s: pd.Series) -> list[Any]:
    """A few values of a text column when all of its first values parse as numbers."""
    head = s.dropna().head(200)
    if head.empty:
        return []
    parsed = pd.to_numeric(head.astype(str).str.strip(), errors="coerce")
    return [] if parsed.isna().any() else head.head(3).tolist()


def key_codes(
    L: pd.DataFrame,
    lk: Sequence[str],
    R: pd.DataFrame,
    rk: Sequence[str],
    nulls_equal: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Integer codes of the (composite) join keys of both tables.

    Equal keys get equal codes on both sides, in ``range(n_codes)``. A row with a
    missing key gets -1 (it matches nothing) unless ``nulls_equal``, where missing
    values form one code of their own, as in ``pandas.merge``.
    """
    n_left = len(L)
    codes = None
    n_codes = 1
    for a, b in zip(lk, rk):
        c, n_c = column_codes(L[a], R[b], nulls_equal)
        if codes is None:
            codes, n_codes = c, n_c
            continue
        combined = codes * n_c + c
        null = (codes < 0) | (c < 0)
        # Keep the combined codes dense so products never overflow.
        if null.any():
            codes = np.full(combined.shape[0], -1, dtype=np.int64)
            codes[~null], uniq = pd.factorize(combined[~null])
        else:
            codes, uniq = pd.factorize(combined)
        n_codes = len(uniq)
    return codes[:n_left], codes[n_left:], n_codes


def column_codes(
    a: pd.Series, b: pd.Series, nulls_equal: bool = False
) -> tuple[np.ndarray, int]:
    """Codes of one key column over both tables (left rows first) and their range.

    Integer keys (NumPy dtypes: no missing values) spanning a range comparable to
    the number of rows are their own codes, offset to start at 0: no hash table
    (ten times faster than hashing). Other keys are factorized; a
    missing key is -1 unless ``nulls_equal``.
    """
    # Check the dtypes first: converting Arrow-backed strings to NumPy is costly.
    if (
        all(isinstance(s.dtype, np.dtype) and s.dtype.kind in "iu" for s in (a, b))
        and len(a)
        and len(b)
    ):
        va, vb = a.to_numpy(), b.to_numpy()
        lo = min(int(va.min()), int(vb.min()))
        hi = max(int(va.max()), int(vb.max()))
        if hi - lo < 2 * (len(va) + len(vb)) + 1024:
            c = np.empty(len(va) + len(vb), dtype=np.int64)
            np.subtract(va, lo, out=c[: len(va)], casting="unsafe")
            np.subtract(vb, lo, out=c[len(va) :], casting="unsafe")
            return c, hi - lo + 1
    both = pd.concat([a, b], ignore_index=True)
    c, uniques = pd.factorize(both, use_na_sentinel=not nulls_equal)
    return c.astype(np.int64, copy=False), len(uniques)


# ----------------------------------------------------------------- hazards
def key_hazards(
    L: pd.DataFrame,
    lk: Sequence[str],
    R: pd.DataFrame,
    rk: Sequence[str],
    unmatched_left: np.ndarray,
    names: tuple[str, str],
) -> list[str]:
    """Likely reasons why the left rows ``unmatched_left`` found no partner.

    Parameters
    ----------
    unmatched_left : ndarray of int
        Rows of ``L`` that matched nothing (repeats allowed).
    names : (str, str)
        Labels of the left and right tables, for the messages.

    Returns
    -------
    list of str
        One sentence per hazard found (empty: none of the known mistakes).
    """
    left_name, right_name = names
    rows = np.unique(unmatched_left)[: 50 * _HAZARD_SAMPLE]
    out: list[str] = []
    for a, b in zip(lk, rk):
        la = L[a].iloc[rows].dropna()
        lv = pd.unique(la)[:_HAZARD_SAMPLE]
        rv = pd.unique(R[b].dropna())
        if len(lv) == 0 or len(rv) == 0:
            continue
        where = f"{left_name}.{a}", f"{right_name}.{b}"
        out += _number_hazards(lv, rv, *where)
        out += _text_hazards(lv, rv, *where)
        if len(lk) > 1:
            present = pd.Index(rv).get_indexer(pd.Index(lv)) >= 0
            if not present.any():
                out.append(
                    f"none of the unmatched rows' {where[0]} values occur in "
                    f"{where[1]} (e.g. {_plain(lv[0])!r} against {_plain(rv[0])!r}): "
                    "this key column never matches."
                )
    return out


def _number_hazards(lv: Any, rv: Any, left: str, right: str) -> list[str]:
    lv, rv = np.asarray(lv), np.asarray(rv)
    if lv.dtype.kind not in "iuf" or rv.dtype.kind not in "iuf":
        return []
    lf, rf = lv.astype(np.float64), rv.astype(np.float64)
    out = []
    for whole, frac, wname, fname in ((lf, rf, left, right), (rf, lf, right, left)):
        if np.all(whole == np.round(whole)):
            fractional = frac[frac != np.round(frac)]
            if fractional.size:
                out.append(
                    f"{fname} holds fractional numbers (e.g. {fractional[0]:g}) while "
                    f"{wname} holds whole numbers: only whole numbers can match; is it "
                    "the right column, or scaled differently?"
                )
    return out


def _text_hazards(lv: Any, rv: Any, left: str, right_label: str) -> list[str]:
    if not (
        all(isinstance(v, str) for v in lv[:100])
        and all(isinstance(v, str) for v in rv[:100])
    ):
        return []
    lt = pd.Series([str(v) for v in lv])
    rt = pd.Series([str(v) for v in rv])
    rules = (
        (
            "without surrounding whitespace and quotes",
            _strip,
            ".str.strip().str.strip('\"\\'')",
        ),
        ("ignoring letter case", lambda t: _strip(t).str.lower(), ".str.lower()"),
        (
            "without leading zeros",
            lambda t: _strip(t).str.lstrip("0"),
            ".str.lstrip('0'), or by casting both to numbers",
        ),
    )
    # A value that matches as it is failed on another column of a composite key.
    # Each rule counts only the values the rules before it did not explain.
    explained = pd.Index(rt).get_indexer(pd.Index(lt)) >= 0
    out = []
    for how, norm, fix in rules:
        right = pd.DataFrame({"norm": norm(rt), "value": rt}).drop_duplicates("norm")
        lookup = pd.Index(right["norm"]).get_indexer(pd.Index(norm(lt)))
        found = (lookup >= 0) & ~explained
        explained |= found
        hit = np.flatnonzero(found)
        if hit.size:
            i = int(hit[0])
            out.append(
                f"{hit.size} of the {len(lt)} distinct unmatched {left} values match "
                f"{right_label} when compared {how} (e.g. {lt[i]!r} against "
                f"{right['value'].iloc[int(lookup[i])]!r}): clean the keys, e.g. "
                f"with {fix}."
            )
    return out


def _plain(v: Any) -> Any:
    """A NumPy scalar as the Python value it holds (for readable messages)."""
    return v.item() if isinstance(v, np.generic) else v


def _strip(t: pd.Series) -> pd.Series:
    return t.str.strip().str.strip("\"'").str.strip()
