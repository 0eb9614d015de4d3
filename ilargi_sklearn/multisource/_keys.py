"""Join keys: their kinds, their integer codes and the hazards of unmatched keys.

A join is computed on key codes only: each key column is factorized once over both
tables, so that equal keys get equal codes. Missing keys (NaN, None, NaT) never
match, as in SQL, unless a join asks for pandas' rule (``nulls_equal=True``: a
missing key matches a missing key).

Integer keys of every width and signedness (NumPy, pandas' nullable and Arrow
integers) are compared by value, exactly; other keys follow pandas' rules (an
integer matches an equal float, an object column of numbers and text matches
numbers and text).

Whenever a key is unmatched, :func:`key_hazards` looks at a bounded sample of the
unmatched values for the usual mistakes: text that differs by surrounding
whitespace, quotes, case or leading zeros, numbers stored as text, whole numbers
against fractional ones, and (when few rows match) which column of a composite key
never matches; :func:`row_number_hints` spots row numbers counted from the wrong
first number.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "column_codes",
    "combine_codes",
    "hazard_rows",
    "hazards_possible",
    "int_float_precision",
    "key_codes",
    "key_hazards",
    "key_kind",
    "kinds_match",
    "numbers_as_text",
    "row_number_hints",
    "time_zone",
]

#: Distinct unmatched key values looked at for hazards.
_HAZARD_SAMPLE = 2000
#: Unmatched rows looked at for hazards (the first ones).
_HAZARD_ROWS = 10 * _HAZARD_SAMPLE
#: Rows of the joined table whose distinct keys the hazards compare with (evenly
#: spaced beyond it: a hazard may then be missed, never made up).
_HAZARD_RIGHT = 500_000
#: Integers up to this magnitude are exact as float64.
_FLOAT_EXACT = 2**53


def key_kind(s: pd.Series) -> str:
    """The kind of a key column: "numeric", "string", "bool", "datetime", "mixed"
    (an object column of numbers and text), "any" (no values)."""
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        # No categories (every value missing): its dtype says nothing.
        return key_kind(pd.Series(dt.categories)) if len(dt.categories) else "any"
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
        if inferred in ("mixed-integer", "mixed"):
            return "mixed"
        return "string"
    return str(dt)


def kinds_match(a: str, b: str) -> bool:
    """Whether key columns of kinds ``a`` and ``b`` (:func:`key_kind`) can join.

    Equal kinds, "any" with every kind, and an object column of numbers and text
    ("mixed") with numbers or text, whose equal values match as in pandas.merge
    (1 matches 1, never "1").
    """
    if a == b or "any" in (a, b):
        return True
    return "mixed" in (a, b) and {a, b} <= {"mixed", "numeric", "string"}


def time_zone(s: pd.Series) -> Any:
    """The time zone of a datetime key column (None: naive, or not a datetime)."""
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        dt = dt.categories.dtype
    tz = getattr(dt, "tz", None)
    if tz is None and hasattr(dt, "pyarrow_dtype"):
        tz = getattr(dt.pyarrow_dtype, "tz", None)
    return tz


def numbers_as_text(s: pd.Series) -> list[Any]:
    """A few values of a text column when all of its first values parse as numbers."""
    head = s.dropna().head(200)
    if head.empty:
        return []
    parsed = pd.to_numeric(head.astype(str).str.strip(), errors="coerce")
    return [] if parsed.isna().any() else head.head(3).tolist()


def key_codes(
    L: pd.DataFrame,
    lk: Sequence[Any],
    R: pd.DataFrame,
    rk: Sequence[Any],
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
        codes, n_codes = combine_codes(codes, n_codes, c, n_c)
    return codes[:n_left], codes[n_left:], n_codes


def combine_codes(
    codes: np.ndarray, n_codes: int, c: np.ndarray, n_c: int
) -> tuple[np.ndarray, int]:
    """The codes of pairs ``(codes, c)``: equal pairs get equal codes, dense.

    A pair with a missing part (-1) is missing (-1).
    """
    null = (codes < 0) | (c < 0)
    # The bound is tested on Python integers, exactly. Codes are dense after each
    # step, so the product fits int64 up to about 2**31 rows; beyond, the pairs
    # are factorized as pairs.
    if n_codes * n_c <= _INT64_MAX:
        combined = codes * n_c + c
    else:
        combined = pd.MultiIndex.from_arrays([codes, c]).factorize()[0]
    # Keep the combined codes dense so that the next product stays small.
    if null.any():
        out = np.full(combined.shape[0], -1, dtype=np.int64)
        out[~null], uniq = pd.factorize(combined[~null])
    else:
        out, uniq = pd.factorize(combined)
    return out.astype(np.int64, copy=False), len(uniq)


def column_codes(
    a: pd.Series, b: pd.Series, nulls_equal: bool = False
) -> tuple[np.ndarray, int]:
    """Codes of one key column over both tables (left rows first) and their range.

    Integer keys of any width and signedness (NumPy, pandas' nullable and Arrow
    integers) are compared by value, exactly: ``int8`` 5 matches ``uint64`` 5, and
    ``uint64`` keys above the ``int64`` range match only themselves. Other keys are
    factorized together, with pandas' rules of comparison (an integer matches an
    equal float). A missing key is -1 unless ``nulls_equal``.
    """
    # Only integer columns are converted: Arrow-backed strings to NumPy is costly.
    ia, ib = _integer_values(a), _integer_values(b)
    if ia is not None and ib is not None:
        return _integer_codes(ia, ib, nulls_equal)
    both = pd.concat([a, b], ignore_index=True)
    c, uniques = pd.factorize(both, use_na_sentinel=not nulls_equal)
    return c.astype(np.int64, copy=False), len(uniques)


_INT64_MAX = int(np.iinfo(np.int64).max)


def _integer_values(s: pd.Series) -> tuple[np.ndarray, np.ndarray | None] | None:
    """An integer key column's values as a NumPy integer array and its missing mask
    (None: no value is missing); None for a column of another kind."""
    dt = s.dtype
    if isinstance(dt, np.dtype):
        return (s.to_numpy(), None) if dt.kind in "iu" else None
    if isinstance(dt, pd.CategoricalDtype) or not pd.api.types.is_integer_dtype(dt):
        return None
    np_dt = getattr(dt, "numpy_dtype", None)
    if np_dt is None or np.dtype(np_dt).kind not in "iu":
        return None
    mask = s.isna().to_numpy()
    values = s.to_numpy(dtype=np_dt, na_value=0)
    return values, (mask if mask.any() else None)


def _integer_codes(
    left: tuple[np.ndarray, np.ndarray | None],
    right: tuple[np.ndarray, np.ndarray | None],
    nulls_equal: bool,
) -> tuple[np.ndarray, int]:
    """:func:`column_codes` of two integer columns, exact for every width.

    Keys spanning a range comparable to the number of rows are their own codes,
    offset to start at 0: no hash table (ten times faster than hashing). The
    offset is taken in 64 bits (in the keys' own dtype it would wrap around:
    ``int8`` 127 - (-128)), in ``uint64`` for keys above the ``int64`` range.
    Wider ranges are factorized in a dtype that holds both sides exactly.
    """
    (va, ma), (vb, mb) = left, right
    n_a, n = va.shape[0], va.shape[0] + vb.shape[0]
    present = [v if m is None else v[~m] for v, m in ((va, ma), (vb, mb))]
    present = [v for v in present if v.size]
    codes = np.empty(n, dtype=np.int64)
    if not present:
        codes.fill(0 if nulls_equal else -1)
        return codes, 1
    lo = min(int(v.min()) for v in present)
    hi = max(int(v.max()) for v in present)
    if hi - lo < 2 * n + 1024:
        # Above the int64 range lo > 0 too (the range is small): the differences
        # are exact in uint64, and small.
        work = np.uint64 if hi > _INT64_MAX else np.int64
        for v, part in ((va, codes[:n_a]), (vb, codes[n_a:])):
            np.subtract(v, work(lo), out=part, dtype=work, casting="unsafe")
        n_codes = hi - lo + 1
    else:
        if hi <= _INT64_MAX:
            common: Any = np.int64
        elif lo >= 0:
            common = np.uint64
        else:
            # Keys below 0 and above the int64 range: Python integers (rare).
            common = object
        both = np.concatenate(
            [va.astype(common, copy=False), vb.astype(common, copy=False)]
        )
        c, uniques = pd.factorize(both)
        codes[:] = c
        n_codes = len(uniques)
    if ma is not None or mb is not None:
        # Missing keys: one code of their own (pandas' rule), or none (SQL's).
        for m, part in ((ma, codes[:n_a]), (mb, codes[n_a:])):
            if m is not None:
                part[m] = n_codes if nulls_equal else -1
        n_codes += int(nulls_equal)
    return codes, n_codes


# ----------------------------------------------------------------- hazards
def key_hazards(
    L: pd.DataFrame,
    lk: Sequence[Any],
    R: pd.DataFrame,
    rk: Sequence[Any],
    unmatched_left: np.ndarray,
    names: tuple[str, str],
    partial: bool = False,
    right_unique: bool = False,
) -> list[str]:
    """Likely reasons why the left rows ``unmatched_left`` found no partner.

    The cost is bounded whatever the tables' sizes: at most ``_HAZARD_ROWS``
    unmatched rows, ``_HAZARD_SAMPLE`` of their distinct values and the distinct
    values of ``_HAZARD_RIGHT`` rows of ``R`` (evenly spaced) are looked at.

    Parameters
    ----------
    unmatched_left : ndarray of int
        Rows of ``L`` that matched nothing (repeats allowed).
    names : (str, str)
        Labels of the left and right tables, for the messages.
    partial : bool, default=False
        Whether most rows matched: then a column of a composite key whose
        unmatched values are absent from ``R`` is not a hazard (those keys are
        just not in the table).
    right_unique : bool, default=False
        Whether ``R``'s (single) key column holds each key once: then it is its
        own distinct values, without a hash of it.

    Returns
    -------
    list of str
        One sentence per hazard found (empty: none of the known mistakes).
    """
    left_name, right_name = names
    rows = np.unique(unmatched_left[:_HAZARD_ROWS])
    step = max(1, -(-len(R) // _HAZARD_RIGHT))
    out: list[str] = []
    for a, b in zip(lk, rk):
        never = len(lk) > 1 and not partial  # look for a column that never matches
        if not never and not (_text_or_float(L[a]) or _text_or_float(R[b])):
            continue  # integers, booleans or datetimes on both sides: no hazard
        lv = _distinct(L[a].iloc[rows])[:_HAZARD_SAMPLE]
        right = R[b] if step == 1 else R[b].iloc[::step]
        rv = right.dropna().array if right_unique else _distinct(right)
        if len(lv) == 0 or len(rv) == 0:
            continue
        where = f"{left_name}.{a}", f"{right_name}.{b}"
        out += _number_hazards(lv, rv, *where)
        out += _text_hazards(lv, rv, *where, composite=len(lk) > 1)
        out += _number_text_hazards(lv, rv, *where)
        if never:
            present = pd.Index(rv).get_indexer(pd.Index(lv)) >= 0
            if not present.any():
                out.append(
                    f"none of the unmatched rows' {where[0]} values occur in "
                    f"{where[1]} (e.g. {_plain(lv[0])!r} against {_plain(rv[0])!r}): "
                    "this key column never matches."
                )
    return out


def _text_or_float(s: pd.Series) -> bool:
    """Whether a key column may hold text or fractions (what the hazards are)."""
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        dt = dt.categories.dtype
    return (
        pd.api.types.is_float_dtype(dt)
        or pd.api.types.is_string_dtype(dt)
        or pd.api.types.is_object_dtype(dt)
    )


def _distinct(s: pd.Series) -> Any:
    """The distinct present values of a column (unique first: fewer to drop)."""
    u = pd.Series(pd.unique(s))
    return u[u.notna()].array


def hazard_rows(rows: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """One row per distinct key among the first unmatched ``rows`` (bounded).

    ``codes`` are the key codes of the left table's rows: distinct codes are
    distinct keys, so the hazard checks look at few rows, however many missed.
    """
    sample = rows[:_HAZARD_ROWS]
    # A hash (duplicated) rather than a sort: first occurrences, in row order.
    first = ~pd.Series(codes[sample]).duplicated().to_numpy()
    return sample[first][:_HAZARD_SAMPLE]


def hazards_possible(
    L: pd.DataFrame, lk: Sequence[Any], R: pd.DataFrame, rk: Sequence[Any]
) -> bool:
    """Whether :func:`key_hazards` can find anything for these key columns: text
    or fractions on a side, or a composite key (a column that never matches)."""
    return len(lk) > 1 or any(
        _text_or_float(L[a]) or _text_or_float(R[b]) for a, b in zip(lk, rk)
    )


def row_number_hints(
    keys: pd.Series, n_rows: int, first: int | None, where: str, table: str
) -> list[str]:
    """Whether integer keys look like row numbers of ``table`` counted from another
    first number.

    For a row-number join (``first`` is its ``row_number``): keys that all fit the
    table's rows numbered from ``first + 1`` or ``first - 1``, but not from
    ``first``, are off by one (every row would take its neighbour's features).
    For a key join (``first`` None): keys spanning exactly 1..``n_rows`` (or
    0..``n_rows - 1``) probably number the table's rows. One O(n) pass (minimum
    and maximum).
    """
    if not pd.api.types.is_numeric_dtype(keys.dtype) or pd.api.types.is_bool_dtype(
        keys.dtype
    ):
        return []
    present = keys.dropna()
    if present.empty:
        return []
    lo, hi = present.min(), present.max()
    if lo != int(lo) or hi != int(hi):
        return []
    lo, hi = int(lo), int(hi)
    if first is not None:

        def fits(base: int) -> bool:
            return base <= lo and hi <= base + n_rows - 1

        if fits(first):
            return []
        for other in (first + 1, first - 1):
            if fits(other):
                return [
                    f"the keys of {where} span {lo}..{hi}: they number the "
                    f"{n_rows:,} rows of {table!r} from {other}, not from {first}, so "
                    "every matched row would take its neighbour's features; join "
                    f"with row_number={other}."
                ]
        return []
    for base in (1, 0):
        if (lo, hi) == (base, base + n_rows - 1):
            return [
                f"the keys of {where} are whole numbers from {lo} to {hi}, as many "
                f"as {table!r} has rows: if they number its rows, join by row "
                f"number (left_on with row_number={base}, no right key)."
            ]
    return []


def int_float_precision(a: pd.Series, b: pd.Series, names: tuple[str, str]) -> Any:
    """A warning's text when integer keys beyond 2**53 meet float keys, else None.

    Such keys are compared as floats (as in pandas.merge), where integers closer
    than the float spacing are equal.
    """
    for ints, floats, iname, fname in ((a, b, *names), (b, a, *names[::-1])):
        if not pd.api.types.is_float_dtype(floats.dtype):
            continue
        values = _integer_values(ints)
        if values is None:
            continue
        v, m = values
        v = v if m is None else v[~m]
        if v.size == 0:
            continue
        big = max(abs(int(v.min())), abs(int(v.max())))
        # An integer beyond 2**53 rounds to a float of at least 2**53: only such
        # floats can match it wrongly.
        f = floats.dropna().abs()
        if big > _FLOAT_EXACT and not f.empty and f.max() >= _FLOAT_EXACT:
            return (
                f"key {iname} holds integers beyond 2**53 (up to {big}) and {fname} "
                f"floats ({floats.dtype}): they are compared as floats, as "
                "pandas.merge does, so integers that differ by less than the float "
                f"spacing match each other; cast {fname} to integers (e.g. "
                ".astype('Int64')) for exact matches."
            )
    return None


def _number_text_hazards(lv: Any, rv: Any, left: str, right: str) -> list[str]:
    """Unmatched numbers that occur as text on the other side, or the reverse."""
    kinds = [pd.api.types.infer_dtype(pd.Series(v), skipna=True) for v in (lv, rv)]
    text = [k in _TEXT_KINDS for k in kinds]
    numbers = [k in _NUMBER_KINDS for k in kinds]
    if not (text[0] and numbers[1] or numbers[0] and text[1]):
        return []  # text against text, or numbers against numbers
    r_text = {v.strip(): v for v in rv if isinstance(v, str)}
    r_numbers = {_number_text(v): v for v in rv if _is_number(v)}
    hits = []
    for v in lv:
        if isinstance(v, str) and v.strip() in r_numbers:
            hits.append((v, r_numbers[v.strip()], left, right))
        elif _is_number(v) and _number_text(v) in r_text:
            hits.append((v, r_text[_number_text(v)], right, left))
    if not hits:
        return []
    u, k, as_text, as_numbers = hits[0]
    return [
        f"{len(hits)} of the {len(lv)} distinct unmatched {left} values match "
        f"{right} when numbers and text are compared as text (e.g. {_plain(u)!r} "
        f"against {_plain(k)!r}): {as_text} holds numbers stored as text, which "
        f"never equal the numbers of {as_numbers}; convert it, e.g. frame[col] = "
        "pd.to_numeric(frame[col])."
    ]


#: ``pandas.api.types.infer_dtype`` kinds that hold text, and numbers.
_TEXT_KINDS = {"string", "mixed", "mixed-integer"}
_NUMBER_KINDS = {
    "integer",
    "floating",
    "mixed-integer",
    "mixed-integer-float",
    "decimal",
    "mixed",
}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(
        v, (bool, np.bool_)
    )


def _number_text(v: Any) -> str:
    """A number as it would be written as text: 12 for 12 and 12.0."""
    f = float(v)
    return str(int(v)) if np.isfinite(f) and f == int(f) else str(v)


def _number_hazards(lv: Any, rv: Any, left: str, right: str) -> list[str]:
    # The dtypes first: text would be converted to NumPy objects for nothing.
    numeric = pd.api.types.is_numeric_dtype
    if not (numeric(lv.dtype) and numeric(rv.dtype)):
        return []
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


def _text_hazards(
    lv: Any, rv: Any, left: str, right_label: str, composite: bool = False
) -> list[str]:
    if not (
        all(isinstance(v, str) for v in lv[:100])
        and all(isinstance(v, str) for v in rv[:100])
    ):
        return []
    # pandas' string dtype: vectorized (Arrow) string operations where available.
    lt = pd.Series(lv).astype("str").reset_index(drop=True)
    rt = pd.Series(rv).astype("str").reset_index(drop=True)
    # Each form is computed once: the rules build on the stripped text.
    l_strip, r_strip = _strip(lt), _strip(rt)
    rules = (
        (
            "without surrounding whitespace and quotes",
            lambda stripped: stripped,
            ".str.strip().str.strip('\"\\'')",
        ),
        (
            "ignoring letter case",
            lambda stripped: stripped.str.lower(),
            ".str.lower()",
        ),
        (
            "without leading zeros",
            lambda stripped: stripped.str.lstrip("0"),
            ".str.lstrip('0'), or by casting both to numbers",
        ),
    )
    # A value that matches as it is failed on another column of a composite key
    # (a single key's unmatched values occur nowhere on the right). Each rule
    # counts only the values the rules before it did not explain.
    explained = _occurs(lt, rt) if composite else np.zeros(len(lt), dtype=bool)
    out = []
    for how, norm, fix in rules:
        if explained.all():
            break
        r_norm, l_norm = norm(r_strip), norm(l_strip)
        if r_norm.equals(rt) and l_norm.equals(lt):
            continue  # the rule changes no value: it explains none
        found = _occurs(l_norm, r_norm) & ~explained
        explained |= found
        hit = np.flatnonzero(found)
        if hit.size:
            i = int(hit[0])
            match = rt[(r_norm == l_norm.iloc[i]).to_numpy()].iloc[0]
            out.append(
                f"{hit.size} of the {len(lt)} distinct unmatched {left} values match "
                f"{right_label} when compared {how} (e.g. {lt[i]!r} against "
                f"{match!r}): clean the keys, e.g. with {fix}."
            )
    return out


def _occurs(values: pd.Series, among: pd.Series) -> np.ndarray:
    """Which ``values`` (a few) occur ``among`` the others (many).

    Arrow strings: a hash of the few values probed by the many, in Arrow (three
    times faster than hashing both; pandas' ``isin`` of Arrow strings loops in
    Python). Otherwise one hash of both.
    """
    if _arrow_backed(values) and _arrow_backed(among):
        import pyarrow as pa
        import pyarrow.compute as pc

        v, a = pa.array(values.array), pa.array(among.array)
        present = pc.filter(a, pc.is_in(a, value_set=v))
        return np.asarray(pc.is_in(v, value_set=present), dtype=bool)
    codes, _ = pd.factorize(pd.concat([values, among], ignore_index=True))
    return np.isin(codes[: len(values)], codes[len(values) :])


def _arrow_backed(s: pd.Series) -> bool:
    dt = s.dtype
    return isinstance(dt, pd.ArrowDtype) or getattr(dt, "storage", None) == "pyarrow"


def _plain(v: Any) -> Any:
    """A NumPy scalar as the Python value it holds (for readable messages)."""
    return v.item() if isinstance(v, np.generic) else v


#: What key text is stripped of in the comparisons: whitespace (with the
#: no-break space of spreadsheets) and quotes, in any order.
_STRIP = " \t\n\r\f\v\xa0\"'"


def _strip(t: pd.Series) -> pd.Series:
    """Text without surrounding whitespace and quotes (one pass: a regular
    expression is 20 times slower on Arrow strings)."""
    return t.str.strip(_STRIP)
