"""The compiled products (``multisource/_products_numba.py``).

``T @ w`` and ``T^T y``, and ``T @ W`` and ``T^T Y`` with a few columns, of a NumPy
factorized matrix run through one compiled pass over the target rows when numba
is available; they must equal the NumPy path (the reference, run with the compiled
kernels off) and the materialized product, over random schemas: inner, left and
outer joins, snowflakes (composed index vectors), overlapping columns, dense and
sparse sources in every base format the plan picks, float32 and float64, read-only
arrays, empty and tiny inputs.
"""

from __future__ import annotations

import contextlib
import os
import pickle

import numpy as np
import pytest
import scipy.sparse as sp
from _helpers import assert_close, dense
from hypothesis import event, given
from hypothesis import strategies as st

from ilargi_sklearn._backend import _launcher
from ilargi_sklearn._backend._launcher import CompiledUnavailable
from ilargi_sklearn.multisource import MultiSourceDataset, _operators
from ilargi_sklearn.multisource import _products_numba as pn
from ilargi_sklearn.multisource._operators import AffineOperator
from ilargi_sklearn.utils._testing import SCENARIOS, random_dataset

pytest.importorskip("numba")

# Compiled kernels on, whatever the caller's environment says.
pytestmark = pytest.mark.usefixtures("compiled_enabled")


@contextlib.contextmanager
def numpy_path():
    """The NumPy path of the operators (the compiled kernels off) inside the block."""
    old = os.environ.get(_launcher.NO_NUMBA_ENV)
    os.environ[_launcher.NO_NUMBA_ENV] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ[_launcher.NO_NUMBA_ENV]
        else:
            os.environ[_launcher.NO_NUMBA_ENV] = old


def check_products(op, seed=0, *, compiled=True, ks=None):
    """``T @ w`` and ``T^T y`` of ``op`` equal the NumPy path and the materialized
    product (tolerances of the table, bounded by ``|T| |w|``); ``compiled``: the
    plan of the compiled products exists; ``ks``: column counts of the
    few-column products checked too (:func:`check_matmat`, default :data:`KS`)."""
    rng = np.random.default_rng(seed)
    n, m = op.shape
    T = dense(op.materialize("dense")).astype(np.float64)
    dtype = op.dtype
    for X_dtype in (dtype, np.float64):
        w = rng.standard_normal(m).astype(X_dtype)
        y = rng.standard_normal(n).astype(X_dtype)
        got_w, got_y = op.matmul(w), op.rmatmul(y)
        with numpy_path():
            want_w, want_y = op.matmul(w), op.rmatmul(y)
        assert got_w.dtype == want_w.dtype and got_y.dtype == want_y.dtype
        assert got_w.shape == (n,) and got_y.shape == (m,)
        bound_w = np.abs(T) @ np.abs(w.astype(np.float64))
        bound_y = np.abs(T).T @ np.abs(y.astype(np.float64))
        kw = {"dtype": got_w.dtype, "kind": "compiled"}
        assert_close(got_w, want_w, bound=bound_w, **kw, err_msg="T @ w vs NumPy")
        assert_close(got_y, want_y, bound=bound_y, **kw, err_msg="T^T y vs NumPy")
        kw["kind"] = "operator"
        assert_close(got_w, T @ w, bound=bound_w, **kw, err_msg="T @ w vs dense")
        assert_close(got_y, T.T @ y, bound=bound_y, **kw, err_msg="T^T y vs dense")
    plan = op.__dict__.get("_product_plan")
    assert (plan is not None) == compiled, plan
    if compiled:
        check_matmat(op, T, seed, KS if ks is None else ks)
    return plan


#: Column counts of the few-column products: unrolled (tuple widths: up to
#: ``pn.UNROLL_COLUMNS``, 8) and not, up to ``pn.MATMAT_COLUMNS`` (16).
KS = (1, 2, 5, 9, 16)


@contextlib.contextmanager
def spy(*names):
    """Count the calls of ``_operators.NAME`` (the compiled products) inside."""
    calls = dict.fromkeys(names, 0)
    real = {name: getattr(_operators, name) for name in names}

    def wrap(name):
        def f(*args):
            calls[name] += 1
            return real[name](*args)

        return f

    for name in names:
        setattr(_operators, name, wrap(name))
    try:
        yield calls
    finally:
        for name in names:
            setattr(_operators, name, real[name])


def check_matmat(op, T, seed=0, ks=KS):
    """``T @ W`` and ``T^T Y`` with ``k`` columns equal the NumPy path and the
    materialized product, through the compiled path where it pays."""
    rng = np.random.default_rng(seed + 1)
    n, m = op.shape
    plan = op._product_plan
    for k in ks:
        X_dtype = op.dtype if k % 2 else np.float64
        W = rng.standard_normal((m, k)).astype(X_dtype)
        Y = rng.standard_normal((n, k)).astype(X_dtype)
        with spy("fused_matmat", "fused_rmatmat") as calls:
            got_W, got_Y = op.matmul(W), op.rmatmul(Y)
        # One column as a 2-D array keeps the NumPy path (its sums).
        assert calls["fused_matmat"] == int(pn.matmat_pays(plan, k)), (k, calls)
        assert calls["fused_rmatmat"] == int(k > 1), (k, calls)
        with numpy_path():
            want_W, want_Y = op.matmul(W), op.rmatmul(Y)
        assert got_W.dtype == want_W.dtype and got_Y.dtype == want_Y.dtype
        assert got_W.shape == (n, k) and got_Y.shape == (m, k)
        bound_W = np.abs(T) @ np.abs(W.astype(np.float64))
        bound_Y = np.abs(T).T @ np.abs(Y.astype(np.float64))
        kw = {"dtype": got_W.dtype, "kind": "compiled"}
        msg = f"k={k}"
        assert_close(
            got_W, want_W, bound=bound_W, **kw, err_msg=f"T @ W vs NumPy {msg}"
        )
        assert_close(
            got_Y, want_Y, bound=bound_Y, **kw, err_msg=f"T^T Y vs NumPy {msg}"
        )
        kw["kind"] = "operator"
        assert_close(got_W, T @ W, bound=bound_W, **kw, err_msg=f"T @ W vs dense {msg}")
        assert_close(
            got_Y, T.T @ Y, bound=bound_Y, **kw, err_msg=f"T^T Y vs dense {msg}"
        )


# ------------------------------------------------------------ the test scenarios
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("seed", [0, 1])
def test_products_equal_numpy_on_the_scenarios(scenario, seed):
    ds = random_dataset(seed, scenario=scenario, n_rows=200)
    plan = check_products(ds.operator, seed)
    assert plan.n_rows == len(ds)


# ------------------------------------------------------------- random schemas
_BASES = ("none", "dense", "wide_dense", "one", "coo", "csr", "dense_sparse")


def _base_source(rng, kind, n, dtype):
    """A base (identity) source whose plan format is ``kind``."""
    if kind == "dense":
        return rng.standard_normal((n, int(rng.choice([1, 3])))).astype(dtype)
    if kind == "wide_dense":  # more columns than the tuple path takes
        return rng.standard_normal((n, pn.TUPLE_COLUMNS + 3)).astype(dtype)
    if kind == "one":  # a one-hot column: one entry per row
        width = int(rng.integers(1, 6))
        cols = rng.integers(0, width, n)
        vals = rng.choice([1.0, 2.5, -1.0], n)
        return sp.csr_matrix(
            (vals.astype(dtype), cols, np.arange(n + 1)), shape=(n, width)
        )
    if kind == "coo":  # fewer entries than rows
        return sp.random(
            n, 6, density=0.08, random_state=rng, format="csr", dtype=dtype
        )
    if kind == "csr":
        return sp.random(
            n, 12, density=0.4, random_state=rng, format="csr", dtype=dtype
        )
    # nearly dense: the plan keeps it dense (no more bytes than CSR)
    S = rng.standard_normal((n, 3)).astype(dtype)
    S[0, 0] = 0.0
    return sp.csr_matrix(S)


@st.composite
def schemas(draw):
    """Sources, indicators, mappings and options of a random dataset."""
    n = draw(st.integers(1, 40))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    dtype = draw(st.sampled_from([np.float64, np.float32]))
    # From the seed: every base format about equally often (hypothesis favours
    # the first elements of sampled_from).
    base = _BASES[seed % len(_BASES)]
    n_dims = draw(st.integers(1, 3))
    sources, indicators = [], []
    if base != "none":
        sources.append(_base_source(rng, base, n, dtype))
        indicators.append(None)
    for _ in range(n_dims):
        r = draw(st.integers(0, 8))
        c = draw(st.integers(1, 4))
        if draw(st.booleans()):
            S = sp.random(r, c, density=0.5, random_state=rng, format="csr")
            S = S.astype(dtype)
            if draw(st.booleans()):
                S.data[:] = 1  # a one-hot encoding: binary, values not read
        else:
            S = rng.standard_normal((r, c)).astype(dtype)
        join = draw(st.sampled_from(["inner", "left", "snowflake"]))
        if r == 0:
            idx = np.full(n, -1)
        else:
            idx = rng.integers(0, r, n)
            if join != "inner":
                idx[rng.random(n) < 0.3] = -1
            if join == "snowflake" and indicators and indicators[-1] is not None:
                # A hop through the previous dimension: composed index vectors.
                prev = indicators[-1]
                hop = rng.integers(0, r, max(int(prev.max()) + 1, 1))
                idx = np.where(prev >= 0, hop[np.maximum(prev, 0)], -1)
        sources.append(S)
        indicators.append(idx)
    overlap = draw(st.booleans())
    mappings = None
    if overlap:
        # Each source places its columns into a narrower target, injectively:
        # columns shared between sources, owned by priority.
        widths = [S.shape[1] for S in sources]
        m = draw(st.integers(max(widths), sum(widths)))
        mappings = [rng.choice(m, w, replace=False) for w in widths]
    read_only = draw(st.booleans())
    return {
        "sources": sources,
        "indicators": indicators,
        "mappings": mappings,
        "dtype": dtype,
        "base": base,
        "read_only": read_only,
        "seed": seed,
    }


def _read_only(a):
    if a is None:
        return None
    if sp.issparse(a):
        for arr in (a.data, a.indices, a.indptr):
            arr.flags.writeable = False
        return a
    a = np.array(a)
    a.flags.writeable = False
    return a


@given(spec=schemas())
def test_products_equal_numpy_on_random_schemas(spec):
    sources, indicators = spec["sources"], spec["indicators"]
    if spec["base"] in ("one", "coo", "csr") and spec["seed"] // len(_BASES) % 2:
        sources[0].data[:] = 1  # binary base
    if spec["read_only"]:
        sources = [_read_only(S) for S in sources]
        indicators = [_read_only(i) for i in indicators]
    ds = MultiSourceDataset.from_matrices(
        sources, indicators, spec["mappings"], dtype=spec["dtype"]
    )
    event(f"base {spec['base']}")
    # The few-column products on every third example, with one column count:
    # numba compiles (or loads) their kernels per count and per schema (about a
    # second each); the other counts are checked on the scenarios and below.
    ks = (3,) if spec["seed"] % 3 == 0 else ()
    plan = check_products(ds.operator, spec["seed"], ks=ks)
    if plan.kind != pn.BASE_NONE:
        event(f"binary base {plan.binary}")
    for group in plan.groups:
        event("binary source" if any(s.binary for s in group) else "valued source")
    want = {"none": pn.BASE_NONE, "one": pn.BASE_ONE, "coo": pn.BASE_COO}
    want["csr"] = pn.BASE_CSR
    base = sources[0]
    if sp.issparse(base) and _operators._dense_is_smaller(base):
        want[spec["base"]] = pn.BASE_NONE  # read as dense rows
    if spec["base"] in want and spec["mappings"] is None:
        assert plan.kind == want[spec["base"]]
    if spec["base"] in ("dense", "wide_dense", "dense_sparse"):
        assert plan.dense is not None and plan.kind == pn.BASE_NONE


# --------------------------------------------------------------- formats, edges
def _star(n=50, base=None, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    if base is None:
        base = rng.standard_normal((n, 3)).astype(dtype)
    D = rng.standard_normal((7, 4)).astype(dtype)
    idx = rng.integers(-1, 7, n)
    return MultiSourceDataset.from_matrices([base, D], [None, idx], dtype=dtype)


@pytest.mark.parametrize("n", [40, 2 * pn.BLOCK_ROWS + 17])
def test_plan_formats_of_the_base(n):
    # Also over several blocks of the row passes (the sparse base's own loop).
    rng = np.random.default_rng(0)
    one = sp.csr_matrix((np.ones(n), rng.integers(0, 5, n), np.arange(n + 1)))
    few = sp.random(n, 8, density=0.05, random_state=0, format="csr")
    many = sp.random(n, 8, density=0.5, random_state=0, format="csr")
    full = sp.csr_matrix(rng.standard_normal((n, 2)))
    kinds = {}
    for name, base in [("one", one), ("few", few), ("many", many), ("full", full)]:
        op = _star(n, base).operator
        check_products(op)
        kinds[name] = op._product_plan
    assert kinds["one"].kind == pn.BASE_ONE and kinds["one"].binary
    assert not kinds["few"].binary
    assert kinds["few"].kind == pn.BASE_COO
    assert kinds["few"].rows.shape == (few.nnz,)
    assert kinds["many"].kind == pn.BASE_CSR
    # A dense CSR takes no more bytes dense: read as dense rows.
    assert kinds["full"].kind == pn.BASE_NONE and kinds["full"].dense is not None


def test_tiny_and_empty_inputs():
    # One target row, a dimension without rows (every row unmatched).
    ds = MultiSourceDataset.from_matrices(
        [np.ones((1, 2)), np.zeros((0, 3))], [None, np.array([-1])]
    )
    check_products(ds.operator)
    # No target rows: the NumPy path (nothing to compile for).
    ds = MultiSourceDataset.from_matrices(
        [np.ones((0, 2)), np.ones((3, 2))], [None, np.zeros(0, dtype=np.int64)]
    )
    op = ds.operator
    assert op.matmul(np.ones(4)).shape == (0,)
    np.testing.assert_array_equal(op.rmatmul(np.zeros(0)), np.zeros(4))
    assert op.__dict__.get("_product_plan") is None


def test_base_only_and_device_operators_keep_the_numpy_path():
    ds = MultiSourceDataset.from_matrices([np.ones((5, 2))], [None])
    check_products(ds.operator, compiled=False)


def test_matmul_out_and_affine():
    op = _star(60).operator
    w = np.random.default_rng(1).standard_normal(op.n_cols)
    out = np.full(op.n_rows, np.nan)
    res = op.matmul(w, out=out)
    assert res is out
    with numpy_path():
        want = op.matmul(w)
    assert_close(out, want, kind="compiled")
    aff = AffineOperator(op, scale=np.full(op.n_cols, 2.0), offset=np.ones(op.n_cols))
    T = (op.materialize("dense") - 1.0) * 2.0
    assert_close(aff.matmul(w), T @ w, kind="compiled", scale=np.abs(T).sum())
    y = np.arange(op.n_rows, dtype=np.float64)
    assert_close(aff.rmatmul(y), T.T @ y, kind="compiled", scale=np.abs(T).sum() * 60)


def test_wrong_shapes_raise_naming_the_shapes():
    op = _star(10).operator
    for bad in (np.ones(op.n_cols + 1), np.ones(op.n_cols - 1)):
        with pytest.raises(ValueError, match=rf"expected \({op.n_cols},\)"):
            op.matmul(bad)
    with pytest.raises(ValueError, match=rf"expected \({op.n_rows},\)"):
        op.rmatmul(np.ones(op.n_rows + 2))


@pytest.mark.parametrize("scenario", ["left", "sparse", "overlap"])
def test_results_do_not_depend_on_the_thread_count(scenario, monkeypatch):
    # Force several chunks on several threads: T @ w writes each row from one
    # thread (bitwise the same); T^T y sums per-chunk tables (equal to rounding).
    ds = random_dataset(3, scenario=scenario, n_rows=3000)
    op = ds.operator
    rng = np.random.default_rng(0)
    w, y = rng.standard_normal(op.n_cols), rng.standard_normal(op.n_rows)
    one = op.matmul(w), op.rmatmul(y)
    monkeypatch.setattr(_launcher, "n_threads", lambda: 2)
    names = ("products_gather", "products_scatter")
    for name in names + ("products_source", "products_source_t"):
        monkeypatch.setitem(_launcher.MIN_CHUNK_ROWS, name, 20)
    assert _launcher.chunks(op.n_rows, 20, 2) > 1
    tasks, threads = pn._source_tasks(op._product_plan, 2, "products_source")
    assert len(tasks) > len(op._product_plan.groups)  # sources split in row ranges
    assert threads == 2
    two = op.matmul(w), op.rmatmul(y)
    np.testing.assert_array_equal(one[0], two[0])
    assert_close(two[1], one[1], kind="compiled", scale=np.abs(y).sum())
    with numpy_path():
        assert_close(two[1], op.rmatmul(y), kind="compiled", scale=np.abs(y).sum())


def test_small_products_stay_on_the_calling_thread(monkeypatch):
    # Several row groups give several tasks, but below the size where a second
    # thread pays they all run on the calling thread (no pool launch).
    ds = random_dataset(3, scenario="star", n_rows=300)
    op = ds.operator
    monkeypatch.setattr(_launcher, "n_threads", lambda: 2)
    w = np.ones(op.n_cols)
    op.matmul(w)
    tasks, threads = pn._source_tasks(op._product_plan, 2, "products_source")
    assert len(tasks) == len(op._product_plan.groups) > 1
    assert threads == 1
    launched = []
    original = _launcher.run_kernel_tasks
    monkeypatch.setattr(
        _launcher,
        "run_kernel_tasks",
        lambda *a: (launched.append(a[1:]), original(*a)),
    )
    op.matmul(w)
    op.rmatmul(np.ones(op.n_rows))
    assert launched == []


def test_compile_failure_falls_back_to_numpy(monkeypatch):
    op = _star(30).operator
    w = np.ones(op.n_cols)
    with numpy_path():
        want = op.matmul(w), op.rmatmul(np.ones(op.n_rows))

    def fail(*args, **kwargs):
        raise CompiledUnavailable("no compiler here")

    monkeypatch.setattr(_operators, "fused_matvec", fail)
    monkeypatch.setattr(_operators, "fused_rmatvec", fail)
    got = op.matmul(w), op.rmatmul(np.ones(op.n_rows))
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_compiled_path_is_taken_and_the_plan_is_not_pickled(monkeypatch):
    op = _star(30).operator
    calls = []
    real = _operators.fused_matvec
    monkeypatch.setattr(
        _operators, "fused_matvec", lambda *a: calls.append(1) or real(*a)
    )
    op.matmul(np.ones(op.n_cols))
    assert calls and isinstance(op._product_plan, _operators.ProductPlan)
    clone = pickle.loads(pickle.dumps(op))
    assert "_product_plan" not in clone.__dict__
    np.testing.assert_array_equal(
        clone.matmul(np.ones(op.n_cols)), op.matmul(np.ones(op.n_cols))
    )


def test_slices_build_their_own_plan():
    op = _star(80).operator
    rows = np.array([5, 3, 3, 70, 0])
    check_products(op)
    sub = op.take_rows(rows)
    plan = check_products(sub)
    assert plan.n_rows == 5 and plan is not op._product_plan


def test_integer_right_hand_sides():
    op = _star(20).operator
    w = np.arange(op.n_cols)
    with numpy_path():
        want = op.matmul(w), op.rmatmul(np.arange(op.n_rows))
    got = op.matmul(w), op.rmatmul(np.arange(op.n_rows))
    assert got[0].dtype == want[0].dtype and got[1].dtype == want[1].dtype
    assert_close(got[0], want[0], kind="compiled", scale=1e3)
    assert_close(got[1], want[1], kind="compiled", scale=1e4)


def test_clear_caches_drops_the_plan():
    # The plan holds facts about the sources (a binary source's values are not
    # read): after an in-place change of a source, clear_caches() rebuilds it.
    import ilargi_sklearn

    n = 50
    rng = np.random.default_rng(2)
    hot = sp.csr_matrix((np.ones(6), rng.integers(0, 4, 6), np.arange(7)))
    ds = MultiSourceDataset.from_matrices(
        [rng.standard_normal((n, 2)), hot], [None, rng.integers(0, 6, n)]
    )
    op = ds.operator
    w = rng.standard_normal(op.n_cols)
    op.matmul(w)
    assert op._product_plan.groups[0][0].binary
    op.terms[1].S.data[:] = 3.0
    ilargi_sklearn.clear_caches()
    assert "_product_plan" not in op.__dict__
    assert_close(op.matmul(w), dense(op.materialize()) @ w, kind="compiled")
    assert not op._product_plan.groups[0][0].binary


# ------------------------------------------------------- few-column products
def test_few_column_products_take_the_compiled_path():
    # A sparse base (no dense identity source): every k from 2 up to the limit
    # is compiled; wider ones, k = 0 and k = 1 (a 2-D column) take the NumPy path.
    n = 300
    rng = np.random.default_rng(4)
    base = sp.random(n, 6, density=0.08, random_state=0, format="csr")
    op = _star(n, base).operator
    T = dense(op.materialize("dense"))
    op.matmul(np.ones(op.n_cols))
    assert op._product_plan.dense is None
    assert KS[-1] == pn.MATMAT_COLUMNS and KS[-2] == pn.UNROLL_COLUMNS + 1
    check_matmat(op, T, ks=(1, 3, pn.MATMAT_COLUMNS))
    assert all(pn.matmat_pays(op._product_plan, k) for k in range(2, 17))
    for k in (0, 1, pn.MATMAT_COLUMNS + 1):
        W = rng.standard_normal((op.n_cols, k))
        Y = rng.standard_normal((op.n_rows, k))
        with spy("fused_matmat", "fused_rmatmat") as calls:
            got = op.matmul(W), op.rmatmul(Y)
        assert calls == {"fused_matmat": 0, "fused_rmatmat": 0}
        assert_close(got[0], T @ W, kind="operator", bound=np.abs(T) @ np.abs(W))
        assert_close(got[1], T.T @ Y, kind="operator", bound=np.abs(T).T @ np.abs(Y))


def test_few_column_matmul_with_a_dense_base_pays_only_in_registers():
    # A dense base of 3 columns: its coefficients are kept in registers up to
    # UNROLL_COLUMNS columns of W; wider, or a base wider than TUPLE_COLUMNS,
    # takes the NumPy path for T @ W (T^T Y stays compiled).
    op = _star(120).operator
    op.matmul(np.ones(op.n_cols))
    plan = op._product_plan
    assert pn.matmat_pays(plan, pn.UNROLL_COLUMNS)
    assert not pn.matmat_pays(plan, pn.UNROLL_COLUMNS + 1)
    wide = _star(120, np.ones((120, pn.TUPLE_COLUMNS + 1))).operator
    wide.matmul(np.ones(wide.n_cols))
    assert not pn.matmat_pays(wide._product_plan, 2)
    check_matmat(wide, dense(wide.materialize("dense")), ks=(2, 9))


def test_few_column_products_out_and_integers():
    op = _star(70).operator
    rng = np.random.default_rng(5)
    W = rng.integers(-3, 4, (op.n_cols, 4))
    out = np.full((op.n_rows, 4), np.nan)
    with spy("fused_matmat") as calls:
        res = op.matmul(W, out=out)
    assert res is out and calls["fused_matmat"] == 1
    with numpy_path():
        want = op.matmul(W)
    assert res.dtype == want.dtype
    assert_close(res, want, kind="compiled", scale=1e2)
    Y = rng.integers(-3, 4, (op.n_rows, 4))
    got = op.rmatmul(Y)
    with numpy_path():
        want = op.rmatmul(Y)
    assert got.dtype == want.dtype
    assert_close(got, want, kind="compiled", scale=1e3)
    # A Fortran-ordered right-hand side (a transposed parameter block).
    Wf = np.asfortranarray(rng.standard_normal((op.n_cols, 3)))
    Yf = np.asfortranarray(rng.standard_normal((op.n_rows, 3)))
    T = dense(op.materialize("dense"))
    assert_close(op.matmul(Wf), T @ Wf, kind="operator", bound=np.abs(T) @ np.abs(Wf))
    assert_close(
        op.rmatmul(Yf), T.T @ Yf, kind="operator", bound=np.abs(T).T @ np.abs(Yf)
    )


@pytest.mark.parametrize("scenario", ["left", "sparse", "overlap", "star"])
def test_few_column_results_across_threads(scenario, monkeypatch):
    # Several chunks on two threads: T @ W writes each row from one thread
    # (bitwise the same), T^T Y sums per-chunk tables (equal to rounding).
    op = random_dataset(5, scenario=scenario, n_rows=3000).operator
    rng = np.random.default_rng(0)
    W = rng.standard_normal((op.n_cols, 5))
    Y = rng.standard_normal((op.n_rows, 5))
    one = op.matmul(W), op.rmatmul(Y)
    monkeypatch.setattr(_launcher, "n_threads", lambda: 2)
    for name in ("products_gather_k", "products_scatter_k"):
        monkeypatch.setitem(_launcher.MIN_CHUNK_ROWS, name, 20)
    with spy("fused_matmat", "fused_rmatmat") as calls:
        two = op.matmul(W), op.rmatmul(Y)
    assert calls["fused_rmatmat"] == 1
    assert calls["fused_matmat"] == int(pn.matmat_pays(op._product_plan, 5))
    np.testing.assert_array_equal(one[0], two[0])
    scale = np.abs(Y).sum()
    assert_close(two[1], one[1], kind="compiled", scale=scale)
    with numpy_path():
        assert_close(two[1], op.rmatmul(Y), kind="compiled", scale=scale)


def test_few_column_compile_failure_falls_back_to_numpy(monkeypatch):
    op = _star(30).operator
    W = np.ones((op.n_cols, 3))
    Y = np.ones((op.n_rows, 3))
    with numpy_path():
        want = op.matmul(W), op.rmatmul(Y)

    def fail(*args, **kwargs):
        raise CompiledUnavailable("no compiler here")

    monkeypatch.setattr(_operators, "fused_matmat", fail)
    monkeypatch.setattr(_operators, "fused_rmatmat", fail)
    got = op.matmul(W), op.rmatmul(Y)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
