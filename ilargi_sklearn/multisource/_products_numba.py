"""Compiled (numba) products of a factorized matrix: ``T x`` and ``T^T y``, and
``T X`` and ``T^T Y`` with a few columns.

NumPy evaluates ``T x`` per row group as a gather of the source-side product into an
n-length temporary and an add (``np.take``, then ``+=``), and ``T^T y`` as one
``np.bincount`` per row group; each pass reads and writes n-length arrays. Here each
product makes one pass over the target rows for all row groups:

* ``T x``: the source-side products ``z_g = sum_t S_t x_t`` of every row group are
  stacked in one float64 table ``P`` (group ``g`` from ``offsets[g]``, followed by
  one zero entry, ``offsets[g] + pads[g]``, that its unmatched rows take), by
  compiled row products of the sources (:func:`_source_chunk` for CSR,
  :func:`_dense_source_chunk` for dense rows). Then :func:`_gather_chunk` writes
  each output row once: the identity source's row times its coefficients plus one
  table entry per row group, summed in a register.
* ``T^T y``: :func:`_scatter_chunk` sums ``y`` into per-chunk float64 tables of all
  row groups and of the columns of a sparse identity source, and
  :func:`_dense_t_chunk` sums a dense identity source's columns times ``y`` in
  registers, in a second pass over the chunk's rows (1.3x faster than one pass
  that does both); then each source's transposed product with its table
  (:func:`_source_t`, :func:`_dense_source_t`).

The few-column products (``k`` up to :data:`MATMAT_COLUMNS`) make the same passes
with a row of ``k`` values per entry: the sources' products with ``X`` (BLAS and
SciPy, source-sized) fill a ``total x k`` table, :func:`_gather_k_chunk` writes
each output row once (the dense base's dot products plus the first group's table
row, then the other groups' rows), and :func:`_scatter_k_chunk` sums the rows
of ``Y`` into per-chunk tables; the dense base's ``X0^T Y`` is one BLAS product and
each source's transposed product one BLAS or SciPy product with its table. Up to
:data:`UNROLL_COLUMNS` columns, ``k`` is a compile-time constant (a tuple's length:
the loops over the columns unroll, 1.7-2.5x faster gathers at 2 and 5 columns) and
a dense base's coefficients a tuple of tuples (in registers); wider, one kernel
takes ``k`` at run time. ``T X`` with a dense base that the registers cannot hold
keeps the NumPy path (:func:`matmat_pays`), and so does one column as a 2-D
right-hand side (the linear models' statistics ``T^T S Y`` with one target: their
sums then stay those of the NumPy path, which the elastic net's alpha grid relies
on to equal scikit-learn's bit for bit). Against the NumPy path's gathers into per-source
temporaries and adds, at one thread, 2 to 16 columns: ``T X`` 0.97-1.78x and
``T^T Y`` 1.09-2.21x on the Hamlet datasets, a tie on the 4M-row star
(0.95-1.13x); about 1.0x at 32 columns, where the output's writes dominate
(``benchmarks/README.md``, "Few-column products").

The identity source (the base table) is read inside the row pass in the format
chosen for it when the operator's plan is built (``_operators.ProductPlan``): dense
rows, CSR (a loop over each row's entries), COO (a loop over the entries of the
chunk, for a base with fewer entries than rows, where CSR's per-row loop of zero or
one trips mispredicts: 3.4x faster on Hamlet's Flights) or one entry per row (a
one-hot column: the entry's column and value, no row pointers). A dense identity
source of at most :data:`TUPLE_COLUMNS` columns gets its coefficients (and its
column count) as a tuple: numba then compiles the row's dot product, or its eight
column sums, for that width, unrolled and in registers (1.3x faster than a loop over
an array at 4 columns; slower from 16 on, where registers run out); a wider one
loops (``T x``) or goes to BLAS on one thread (``T^T y``).

No BLAS runs on other threads: OpenBLAS's own threads, which spin, collapse when
another process holds a core (``benchmarks/README.md``, "Threads on a busy
machine"). The row passes run over chunks of target rows on the launcher's pool
(:func:`~.._backend._launcher.chunks`: one thread below the sizes where a second
pays, measured), the sources' products over row ranges of about equal entries.

Results are those of the NumPy path up to rounding: sums run in float64 in another
order (tolerance ``"compiled"``). ``T x`` writes each row from one thread, so its
result does not depend on the thread count; ``T^T y`` sums its per-chunk tables in
chunk order (it does, by rounding, on the number of chunks, as every chunked kernel
of the package). The kernels register with :mod:`.._backend._launcher` (lazy numba
import, the package's threads, :class:`~.._backend._launcher.CompiledUnavailable` on a
compile failure, after which the operators run their NumPy code); the operators
(:mod:`._operators`) call them for NumPy data only, where
:func:`~.._backend._launcher.numba_available`. Figures: ``benchmarks/README.md``,
"Fused products".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ilargi_sklearn._backend import _launcher

_u = _launcher.U

__all__ = [
    "BASE_COO",
    "BASE_CSR",
    "BASE_NONE",
    "BASE_ONE",
    "MATMAT_COLUMNS",
    "TUPLE_COLUMNS",
    "fused_matmat",
    "fused_matvec",
    "fused_rmatmat",
    "fused_rmatvec",
    "matmat_pays",
]

#: Formats of a sparse identity source in the row passes (``kind``): none, CSR,
#: COO (CSR's arrays plus the row of each entry) and one entry per row (CSR whose
#: row pointers are ``0, 1, ..., n``: only the entries' columns and values are read).
BASE_NONE, BASE_CSR, BASE_COO, BASE_ONE = 0, 1, 2, 3

#: Most columns of ``X`` in ``T X`` and of ``Y`` in ``T^T Y`` that the compiled
#: products take (wider ones, and one column as a 2-D array, take the NumPy path).
MATMAT_COLUMNS = 16

#: Most columns for which the few-column kernels are compiled for their ``k``
#: (their loops over the columns unrolled: 1.7-2.5x faster gathers at 2 and 5
#: columns; no faster from 8 on, where the unrolled rows take the registers).
UNROLL_COLUMNS = 8

#: Widest dense identity source whose coefficients go to the row pass as a tuple.
TUPLE_COLUMNS = 8

#: Target rows per block of the row passes (their outputs stay in cache between
#: the loop over the row groups and the loop over a sparse base).
BLOCK_ROWS = 8192


def _source_chunk(indptr, indices, data, binary, x, P, off, add, c, start, stop):
    # P[off + r] (+)= S[r] . x for the CSR source rows r in [start, stop); a binary
    # source's values (all 1, a one-hot encoding) are not read. The entries are
    # walked with one running position (each row's end read once: 1.2x faster
    # than a range per row, which reads both of its ends).
    q = indptr[start]
    for r in range(start, stop):
        end = indptr[r + 1]
        acc = 0.0
        while q < end:
            v = _u(q)
            xv = x[_u(indices[v])]
            acc += xv if binary else data[v] * xv
            q += 1
        p = _u(off + r)
        if add:
            P[p] += acc
        else:
            P[p] = acc


def _dense_source_chunk(D, x, P, off, add, c, start, stop):
    # P[off + r] (+)= D[r] . x for the dense source rows r in [start, stop).
    width = D.shape[1]
    for r in range(start, stop):
        u = _u(r)
        acc = 0.0
        for j in range(width):
            acc += D[u, _u(j)] * x[_u(j)]
        p = _u(off + r)
        if add:
            P[p] += acc
        else:
            P[p] = acc


def _base_rows(kind, indptr, rows, indices, data, binary, wb, out, lo, hi):
    # out[i] += (sparse base row i) . wb for the rows [lo, hi).
    if kind == BASE_CSR:
        q = indptr[lo]
        for i in range(lo, hi):
            u = _u(i)
            end = indptr[u + 1]
            acc = out[u]
            while q < end:
                v = _u(q)
                wv = wb[_u(indices[v])]
                acc += wv if binary else data[v] * wv
                q += 1
            out[u] = acc
    elif kind == BASE_ONE:
        for i in range(lo, hi):
            u = _u(i)
            wv = wb[_u(indices[u])]
            out[u] += wv if binary else data[u] * wv
    elif kind == BASE_COO:
        # The entries of the rows in row order (no per-row loop of zero or one
        # trips).
        for q in range(indptr[lo], indptr[hi]):
            v = _u(q)
            wv = wb[_u(indices[v])]
            out[_u(rows[v])] += wv if binary else data[v] * wv


def _base_cols(kind, indptr, rows, indices, data, binary, y, A, lo, hi):
    # A[col] += value * y[i] over the sparse base's entries of the rows [lo, hi).
    if kind == BASE_CSR:
        q = indptr[lo]
        for i in range(lo, hi):
            u = _u(i)
            end = indptr[u + 1]
            yi = y[u]
            while q < end:
                v = _u(q)
                A[_u(indices[v])] += yi if binary else data[v] * yi
                q += 1
    elif kind == BASE_ONE:
        for i in range(lo, hi):
            u = _u(i)
            yi = y[u]
            A[_u(indices[u])] += yi if binary else data[u] * yi
    elif kind == BASE_COO:
        for q in range(indptr[lo], indptr[hi]):
            v = _u(q)
            yv = y[_u(rows[v])]
            A[_u(indices[v])] += yv if binary else data[v] * yv


def _gather_chunk(
    X0,
    w0,
    kind,
    indptr,
    rows,
    indices,
    data,
    binary,
    wb,
    idxs,
    P,
    offsets,
    pads,
    out,
    c,
    start,
    stop,
):
    # out[i] = X0[i] . w0 + sum_g P[offsets[g] + idx_g[i]] + (sparse base row i) . wb
    # with unmatched rows taking the group's zero entry (a select, not a branch: a
    # branch mispredicts on scattered unmatched rows). len(w0) and len(idxs) are
    # compile-time constants for tuples: the loops over them unroll. The sparse
    # base is added per block of rows (still in cache) by a kernel of its own: in
    # the row loop its branches cost 1.6x, and so did its loops inlined here, even
    # where there is no sparse base.
    d0 = len(w0)
    n_groups = len(idxs)
    for lo in range(start, stop, BLOCK_ROWS):
        hi = min(lo + BLOCK_ROWS, stop)
        for i in range(lo, hi):
            u = _u(i)
            acc = 0.0
            for j in range(d0):
                acc += X0[u, _u(j)] * w0[j]
            for g in range(n_groups):
                r = idxs[g][u]
                acc += P[_u(offsets[g] + (r if r >= 0 else pads[g]))]
            out[u] = acc
        if kind != BASE_NONE:
            _base_rows_kernel(
                kind, indptr, rows, indices, data, binary, wb, out, lo, hi
            )


def _scatter_chunk(
    y,
    idxs,
    offsets,
    pads,
    kind,
    indptr,
    rows,
    indices,
    data,
    binary,
    bins,
    accb,
    c,
    start,
    stop,
):
    # bins[c, offsets[g] + idx_g[i]] += y[i] (unmatched rows into the group's pad
    # entry, never read) and accb[c, col] += value * y[i] for the sparse base, per
    # block of rows by a kernel of its own (as in _gather_chunk).
    B = bins[c]
    A = accb[c]
    n_groups = len(idxs)
    for lo in range(start, stop, BLOCK_ROWS):
        hi = min(lo + BLOCK_ROWS, stop)
        for i in range(lo, hi):
            u = _u(i)
            yi = y[u]
            for g in range(n_groups):
                r = idxs[g][u]
                B[_u(offsets[g] + (r if r >= 0 else pads[g]))] += yi
        if kind != BASE_NONE:
            _base_cols_kernel(kind, indptr, rows, indices, data, binary, y, A, lo, hi)


def _dense_t_chunk(X0, width, y, acc, c, start, stop):
    # acc[c, j] = sum_i X0[i, j] y[i] over rows [start, stop), for the columns
    # j < len(width) <= 8: eight sums in registers, those past the width pruned at
    # compile time (len(width) is a constant of the tuple's type). In the scatter
    # pass these sums went through memory (bins may alias them): 1.5x slower.
    d0 = len(width)
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = 0.0
    for i in range(start, stop):
        u = _u(i)
        yi = y[u]
        if d0 > 0:
            a0 += X0[u, 0] * yi
        if d0 > 1:
            a1 += X0[u, 1] * yi
        if d0 > 2:
            a2 += X0[u, 2] * yi
        if d0 > 3:
            a3 += X0[u, 3] * yi
        if d0 > 4:
            a4 += X0[u, 4] * yi
        if d0 > 5:
            a5 += X0[u, 5] * yi
        if d0 > 6:
            a6 += X0[u, 6] * yi
        if d0 > 7:
            a7 += X0[u, 7] * yi
    A = acc[c]
    sums = (a0, a1, a2, a3, a4, a5, a6, a7)
    for j in range(d0):
        A[j] = sums[j]


def _dense_source_t(D, b, off, out, start, stop):
    # out[j] += D[r, j] b[off + r] over the dense source rows r in [start, stop).
    width = D.shape[1]
    for r in range(start, stop):
        u = _u(r)
        br = b[_u(off + r)]
        for j in range(width):
            out[_u(j)] += D[u, _u(j)] * br


def _source_t(indptr, indices, data, binary, b, off, out, start, stop):
    # out[col] += S[r, col] * b[off + r] over the entries of CSR rows [start, stop).
    q = indptr[start]
    for r in range(start, stop):
        end = indptr[r + 1]
        br = b[_u(off + r)]
        while q < end:
            v = _u(q)
            out[_u(indices[v])] += br if binary else data[v] * br
            q += 1


# --------------------------------------------------- few-column products (k >= 1)
def _base_rows_k(kind, indptr, rows, indices, data, binary, Wb, out, lo, hi):
    # out[i, :] += (sparse base row i) @ Wb for the rows [lo, hi): _base_rows with
    # a row of k columns per entry.
    k = out.shape[1]
    if kind == BASE_CSR:
        q = indptr[lo]
        for i in range(lo, hi):
            u = _u(i)
            end = indptr[u + 1]
            while q < end:
                v = _u(q)
                col = _u(indices[v])
                val = 1.0 if binary else data[v]
                for j in range(k):
                    out[u, _u(j)] += val * Wb[col, _u(j)]
                q += 1
    elif kind == BASE_ONE:
        for i in range(lo, hi):
            u = _u(i)
            col = _u(indices[u])
            val = 1.0 if binary else data[u]
            for j in range(k):
                out[u, _u(j)] += val * Wb[col, _u(j)]
    elif kind == BASE_COO:
        for q in range(indptr[lo], indptr[hi]):
            v = _u(q)
            u = _u(rows[v])
            col = _u(indices[v])
            val = 1.0 if binary else data[v]
            for j in range(k):
                out[u, _u(j)] += val * Wb[col, _u(j)]


def _base_cols_k(kind, indptr, rows, indices, data, binary, Y, A, lo, hi):
    # A[col, :] += value * Y[i, :] over the sparse base's entries of rows [lo, hi).
    k = Y.shape[1]
    if kind == BASE_CSR:
        q = indptr[lo]
        for i in range(lo, hi):
            u = _u(i)
            end = indptr[u + 1]
            while q < end:
                v = _u(q)
                col = _u(indices[v])
                val = 1.0 if binary else data[v]
                for j in range(k):
                    A[col, _u(j)] += val * Y[u, _u(j)]
                q += 1
    elif kind == BASE_ONE:
        for i in range(lo, hi):
            u = _u(i)
            col = _u(indices[u])
            val = 1.0 if binary else data[u]
            for j in range(k):
                A[col, _u(j)] += val * Y[u, _u(j)]
    elif kind == BASE_COO:
        for q in range(indptr[lo], indptr[hi]):
            v = _u(q)
            u = _u(rows[v])
            col = _u(indices[v])
            val = 1.0 if binary else data[v]
            for j in range(k):
                A[col, _u(j)] += val * Y[u, _u(j)]


def _gather_k_chunk(
    width,
    base_width,
    X0,
    W0t,
    kind,
    indptr,
    rows,
    indices,
    data,
    binary,
    Wb,
    idxs,
    P,
    offsets,
    pads,
    out,
    c,
    start,
    stop,
):
    # out[i, :] = X0[i] @ W0t.T + sum_g P[offsets[g] + idx_g[i], :]
    #             + (sparse base row i) @ Wb
    # _gather_chunk with a row of k columns: per column, the dense base's dot
    # product summed in a register (adding the base's values times rows of W0
    # into the output row instead: 2x slower, each add a store) plus the first
    # row group's entry, then the other groups add theirs; the row's k values
    # stay in L1. The NumPy path's order (base, then the groups in order): its
    # sums, and the fits whose paths follow them to the last digits (the
    # multinomial LogisticRegressionCV against scikit-learn's), stay the same.
    # Unmatched rows take the group's zero row (a select, not a branch). k =
    # len(width) and d0 = len(base_width): compile-time constants for tuples
    # (the loops over them unroll), run-time ones for arrays (wider products,
    # wider bases).
    d0 = len(base_width)
    k = len(width)
    n_groups = len(idxs)
    for lo in range(start, stop, BLOCK_ROWS):
        hi = min(lo + BLOCK_ROWS, stop)
        for i in range(lo, hi):
            u = _u(i)
            r = idxs[0][u]
            p = _u(offsets[0] + (r if r >= 0 else pads[0]))
            for j in range(k):
                acc = 0.0
                wj = W0t[j]
                for t in range(d0):
                    acc += X0[u, _u(t)] * wj[t]
                out[u, _u(j)] = acc + P[p, _u(j)]
            for g in range(1, n_groups):
                r = idxs[g][u]
                p = _u(offsets[g] + (r if r >= 0 else pads[g]))
                for j in range(k):
                    out[u, _u(j)] += P[p, _u(j)]
        if kind != BASE_NONE:
            _base_rows_k_kernel(
                kind, indptr, rows, indices, data, binary, Wb, out, lo, hi
            )


def _scatter_k_chunk(
    width,
    Y,
    idxs,
    offsets,
    pads,
    kind,
    indptr,
    rows,
    indices,
    data,
    binary,
    bins,
    accb,
    c,
    start,
    stop,
):
    # bins[c, offsets[g] + idx_g[i], :] += Y[i, :] (unmatched rows into the
    # group's pad row, never read) and accb[c, col, :] += value * Y[i, :] for the
    # sparse base: _scatter_chunk with a row of k columns.
    B = bins[c]
    A = accb[c]
    k = len(width)  # as in _gather_k_chunk
    n_groups = len(idxs)
    for lo in range(start, stop, BLOCK_ROWS):
        hi = min(lo + BLOCK_ROWS, stop)
        for i in range(lo, hi):
            u = _u(i)
            for g in range(n_groups):
                r = idxs[g][u]
                p = _u(offsets[g] + (r if r >= 0 else pads[g]))
                for j in range(k):
                    B[p, _u(j)] += Y[u, _u(j)]
        if kind != BASE_NONE:
            _base_cols_k_kernel(kind, indptr, rows, indices, data, binary, Y, A, lo, hi)


# The fewest rows of a chunk worth a thread, for the sources' products the fewest
# entries: a second thread from 524,288 target rows (4 chunks per thread, one for
# the scatter's per-chunk tables) and 1,048,576 entries of the sources. Measured
# (``benchmarks/README.md``, "Fused products"): two threads gained 1.4-1.7x from
# 524,288 rows on a machine with a light load, 0.8-1.1x at 131,072-262,144 rows,
# and lost on every Hamlet dataset (at most 421,570 rows) beside a neighbour.
_launcher.register("products_source", _source_chunk, min_rows=131072)
_launcher.register("products_gather", _gather_chunk, min_rows=65536)
_launcher.register("products_scatter", _scatter_chunk, min_rows=262144)
_launcher.register("products_source_t", _source_t, min_rows=131072)
_launcher.register("products_dense_source", _dense_source_chunk)
_launcher.register("products_dense_source_t", _dense_source_t)
_launcher.register("products_dense_t", _dense_t_chunk)
_launcher.register("products_base_rows", _base_rows)
_launcher.register("products_base_cols", _base_cols)
_launcher.register("products_gather_k", _gather_k_chunk, min_rows=65536)
_launcher.register("products_scatter_k", _scatter_k_chunk, min_rows=262144)
_launcher.register("products_base_rows_k", _base_rows_k)
_launcher.register("products_base_cols_k", _base_cols_k)


#: The jitted kernels that other kernels call (numba resolves these globals when
#: it compiles the caller), set by :func:`_define` before the first launch, so
#: that numba is imported only then.
_base_rows_kernel: Any = None
_base_cols_kernel: Any = None
_base_rows_k_kernel: Any = None
_base_cols_k_kernel: Any = None


def _define() -> None:
    global _base_rows_kernel, _base_cols_kernel
    global _base_rows_k_kernel, _base_cols_k_kernel
    if _base_rows_k_kernel is None:
        _base_cols_kernel = _launcher._dispatcher("products_base_cols")
        _base_rows_kernel = _launcher._dispatcher("products_base_rows")
        _base_cols_k_kernel = _launcher._dispatcher("products_base_cols_k")
        _base_rows_k_kernel = _launcher._dispatcher("products_base_rows_k")


def _coefficients(x: np.ndarray, cols: slice | np.ndarray) -> np.ndarray:
    """``x[cols]`` as a read-only, C-contiguous float64 array (a view where it can
    be): the kernels then see one array type, whatever the caller's ``x``."""
    v = x[cols]
    if v.dtype == np.float64 and v.flags.c_contiguous:
        v = v.view()
    else:
        v = np.ascontiguousarray(v, dtype=np.float64)
    v.flags.writeable = False
    return v


def _source_tasks(
    plan: Any, threads: int, name: str
) -> tuple[list[tuple[int, int, int]], int]:
    """The sources' products as ``(group, start, stop)`` tasks over source rows,
    and the threads to run them on: one task per group on one thread (below the
    size where a second thread pays, however many groups), else row ranges of
    about equal work (entries), :func:`~.._backend._launcher.chunks` of them over
    all groups."""
    work = [sum(src.work for src in g) for g in plan.groups]
    total = max(sum(work), 1)
    n_tasks = _launcher.chunks(total, _launcher.MIN_CHUNK_ROWS[name], threads)
    tasks = []
    for g, (group, w) in enumerate(zip(plan.groups, work, strict=True)):
        r = group[0].n_rows
        parts = max(1, min(r, round(n_tasks * w / total))) if n_tasks > 1 else 1
        if parts == 1:
            tasks.append((g, 0, r))
            continue
        sparse = next((src for src in group if src.dense is None), None)
        if sparse is None:
            bounds = np.linspace(0, r, parts + 1)
        else:
            # Equal entries per range (CSR rows vary in length).
            nnz = int(sparse.indptr[-1])
            bounds = np.searchsorted(sparse.indptr, np.linspace(0, nnz, parts + 1))
        bounds = np.unique(np.clip(np.round(bounds).astype(np.int64), 0, r))
        bounds[0], bounds[-1] = 0, r
        tasks.extend((g, int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]))
    return tasks, (threads if n_tasks > 1 else 1)


def _run(task: Any, n_tasks: int, threads: int) -> None:
    """``task(t)`` for each task: on the calling thread alone, or on the kernels'
    pool (the tasks call compiled kernels only, so BLAS's threads are left as
    they are: :func:`~.._backend._launcher.run_kernel_tasks`)."""
    if n_tasks == 1 or threads == 1:
        for t in range(n_tasks):
            task(t)
    else:
        _launcher.run_kernel_tasks(task, n_tasks, threads)


def _source_products(plan: Any, x: np.ndarray, threads: int) -> np.ndarray:
    """The stacked table ``P`` of the row groups' source-side products with ``x``."""
    P = np.empty(plan.total)
    P[plan.offsets + plan.pads] = 0.0
    coefs = [[_coefficients(x, src.cols) for src in group] for group in plan.groups]
    tasks, threads = _source_tasks(plan, threads, "products_source")

    def task(t: int) -> None:
        g, start, stop = tasks[t]
        for i, src in enumerate(plan.groups[g]):
            xs = coefs[g][i]
            if src.dense is not None:
                head = (src.dense, xs, P, src.offset, i > 0, 0, start, stop)
                _launcher.call("products_dense_source", *head)
            else:
                head = (src.indptr, src.indices, src.data, src.binary, xs, P)
                head += (src.offset, i > 0)
                _launcher.call("products_source", *head, 0, start, stop)

    _run(task, len(tasks), threads)
    return P


def fused_matvec(plan: Any, x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``T x`` into ``out`` (shape ``(n_rows,)``) through the operator's plan.

    Parameters
    ----------
    plan : ProductPlan
        The operator's product plan (``_operators.ProductPlan``).
    x : ndarray of shape (n_cols,)
        Real numbers of any dtype.
    out : ndarray of float32 or float64 of shape (n_rows,), C-contiguous
        Written, every entry once.

    Returns
    -------
    ndarray
        ``out``.
    """
    n = plan.n_rows
    threads = _launcher.n_threads()
    _define()
    P = _source_products(plan, x, threads)
    if plan.dense is None:
        X0, w0 = plan.no_dense, _coefficients(x, slice(0, 0))
    else:
        X0 = plan.dense
        w0 = _coefficients(x, plan.dense_cols)
        if w0.shape[0] <= TUPLE_COLUMNS:
            w0 = tuple(float(v) for v in w0)
    wb = _coefficients(x, plan.sparse_cols)
    head = (X0, w0, plan.kind, plan.indptr, plan.rows, plan.indices, plan.data)
    head += (plan.binary, wb, plan.idxs, P, plan.offsets, plan.pads, out)
    min_rows = _launcher.MIN_CHUNK_ROWS["products_gather"]
    n_chunks = _launcher.chunks(n, min_rows, threads)
    _launcher.launch("products_gather", head, n, n_chunks, threads)
    return out


def fused_rmatvec(plan: Any, y: np.ndarray) -> np.ndarray:
    """``T^T y`` as a float64 array of shape ``(n_cols,)`` through the plan.

    Parameters
    ----------
    plan : ProductPlan
        The operator's product plan (``_operators.ProductPlan``).
    y : ndarray of float32 or float64 of shape (n_rows,), C-contiguous

    Returns
    -------
    ndarray of float64 of shape (n_cols,)
    """
    n = plan.n_rows
    threads = _launcher.n_threads()
    _define()
    y = y.view()
    y.flags.writeable = False
    # Per-chunk tables of the sources' size: one chunk per thread.
    min_rows = _launcher.MIN_CHUNK_ROWS["products_scatter"]
    n_chunks = _launcher.chunks(n, min_rows, threads, per_thread=1)
    bins = np.zeros((n_chunks, plan.total))
    accb = np.zeros((n_chunks, plan.sparse_width))
    X0 = plan.dense
    acc0 = None if X0 is None else np.zeros((n_chunks, X0.shape[1]))
    head = (y, plan.idxs, plan.offsets, plan.pads, plan.kind, plan.indptr)
    head += (plan.rows, plan.indices, plan.data, plan.binary, bins, accb)
    step = -(-n // n_chunks)

    def scatter(c: int) -> None:
        start, stop = c * step, min(n, (c + 1) * step)
        _launcher.call("products_scatter", *head, c, start, stop)
        if acc0 is None:
            return
        # The dense identity source in a pass of its own (two passes over the
        # rows beat one that also scatters: 1.3x).
        if X0.shape[1] <= TUPLE_COLUMNS:
            width = (0,) * X0.shape[1]
            _launcher.call("products_dense_t", X0, width, y, acc0, c, start, stop)
        else:
            with _launcher.one_blas_thread():
                acc0[c] = y[start:stop] @ X0[start:stop]

    _run(scatter, n_chunks, threads)
    out = np.zeros(plan.n_cols)
    b = bins[0] if n_chunks == 1 else bins.sum(axis=0)
    b.flags.writeable = False
    if acc0 is not None:
        out[plan.dense_cols] += acc0[0] if n_chunks == 1 else acc0.sum(axis=0)
    if plan.kind != BASE_NONE:
        out[plan.sparse_cols] += accb[0] if n_chunks == 1 else accb.sum(axis=0)
    # The sources' transposed products, one task per source, the largest first (a
    # source split in row ranges would need a part of its width per range: as
    # costly as its entries for a one-hot source). A source adds into its columns
    # of the output directly (a view where they are contiguous) on one thread, or
    # where no other source shares them; else into a part of its own, added below
    # in source order (the result does not depend on the scheduling).
    terms = sorted(
        (src for group in plan.groups for src in group), key=lambda s: -s.work
    )
    total_work = sum(src.work for src in terms)
    min_work = _launcher.MIN_CHUNK_ROWS["products_source_t"]
    parallel = _launcher.chunks(total_work, min_work, threads) > 1
    parts: list[np.ndarray | None] = [None] * len(terms)

    def transposed(t: int) -> None:
        src = terms[t]
        if isinstance(src.cols, slice) and (src.own_cols or not parallel):
            part = out[src.cols]
        else:
            part = parts[t] = np.zeros(src.width)
        if src.dense is not None:
            args = (src.dense, b, src.offset, part, 0, src.n_rows)
            _launcher.call("products_dense_source_t", *args)
        else:
            args = (src.indptr, src.indices, src.data, src.binary, b)
            args += (src.offset, part, 0, src.n_rows)
            _launcher.call("products_source_t", *args)

    _run(transposed, len(terms), threads if parallel else 1)
    for src, part in zip(terms, parts, strict=True):
        if part is not None:
            out[src.cols] += part
    return out


def _width(k: int, unroll: int = UNROLL_COLUMNS) -> tuple | np.ndarray:
    """The kernels' ``width`` argument for ``k`` columns: a tuple of ``k`` zeros
    up to ``unroll`` (numba compiles the kernel for that ``k``, its loops over
    the columns unrolled), else an array (one compiled kernel for all)."""
    return (0,) * k if k <= unroll else np.zeros(k, dtype=np.int8)


def _stacked_products(plan: Any, X: np.ndarray) -> np.ndarray:
    """The stacked float64 table ``P`` (``plan.total x k``) of the row groups'
    source-side products ``sum_t S_t X_t`` with the columns of ``X``.

    Source-sized: BLAS for dense sources, SciPy's CSR product for sparse ones
    (on several columns both are as fast as a compiled loop), each written into
    its group's rows of the table, followed by the group's zero row."""
    k = X.shape[1]
    P = np.empty((plan.total, k))
    for group in plan.groups:
        off, r = group[0].offset, group[0].n_rows
        Z = P[off : off + r]
        for i, src in enumerate(group):
            prod = src.matrix @ X[src.cols]
            if i == 0:
                Z[...] = prod
            else:
                Z += prod
        P[off + r] = 0.0
    return P


def matmat_pays(plan: Any, k: int) -> bool:
    """Whether :func:`fused_matmat` beats the NumPy path for ``k`` columns.

    From 2 up to :data:`MATMAT_COLUMNS` columns, except with a dense identity source
    that the row pass cannot keep in registers (more than :data:`TUPLE_COLUMNS`
    columns, or more than :data:`UNROLL_COLUMNS` columns of ``X``): its dot
    products then reload the coefficients for every row and lose to the NumPy
    path's BLAS blocks (0.55x on the 4M-row star at 16 columns)."""
    if not 2 <= k <= MATMAT_COLUMNS:
        return False
    if plan.dense is None:
        return True
    return plan.dense.shape[1] <= TUPLE_COLUMNS and k <= UNROLL_COLUMNS


def fused_matmat(plan: Any, X: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``T X`` into ``out`` (shape ``(n_rows, k)``) through the operator's plan.

    Parameters
    ----------
    plan : ProductPlan
        The operator's product plan (``_operators.ProductPlan``).
    X : ndarray of shape (n_cols, k)
        Real numbers of any dtype, ``k >= 2``.
    out : ndarray of float32 or float64 of shape (n_rows, k), C-contiguous
        Written, every entry once.

    Returns
    -------
    ndarray
        ``out``.
    """
    n, k = plan.n_rows, X.shape[1]
    threads = _launcher.n_threads()
    _define()
    P = _stacked_products(plan, X)
    P.flags.writeable = False
    X0 = plan.no_dense if plan.dense is None else plan.dense
    W0t = np.ascontiguousarray(X[plan.dense_cols].T, dtype=np.float64)
    Wb = np.ascontiguousarray(X[plan.sparse_cols], dtype=np.float64)
    W0t.flags.writeable = Wb.flags.writeable = False
    base_width = _width(X0.shape[1], TUPLE_COLUMNS)
    if isinstance(base_width, tuple) and k <= UNROLL_COLUMNS:
        # Coefficients in registers (a tuple's values are constants of the row
        # loop; an array's are loaded again after each store to the output).
        # Without a dense base, rows of one unread zero (numba cannot type an
        # index into an empty tuple).
        W0t = tuple(tuple(float(v) for v in row) or (0.0,) for row in W0t)
    head = (_width(k), base_width, X0, W0t, plan.kind, plan.indptr, plan.rows)
    head += (plan.indices, plan.data, plan.binary, Wb, plan.idxs, P, plan.offsets)
    head += (plan.pads, out)
    min_rows = _launcher.MIN_CHUNK_ROWS["products_gather_k"]
    n_chunks = _launcher.chunks(n, min_rows, threads)
    _launcher.launch("products_gather_k", head, n, n_chunks, threads)
    return out


def fused_rmatmat(plan: Any, Y: np.ndarray) -> np.ndarray:
    """``T^T Y`` as a float64 array of shape ``(n_cols, k)`` through the plan.

    Parameters
    ----------
    plan : ProductPlan
        The operator's product plan (``_operators.ProductPlan``).
    Y : ndarray of float32 or float64 of shape (n_rows, k), C-contiguous

    Returns
    -------
    ndarray of float64 of shape (n_cols, k)
    """
    n, k = plan.n_rows, Y.shape[1]
    threads = _launcher.n_threads()
    _define()
    Y = Y.view()
    Y.flags.writeable = False
    # Per-chunk tables of the sources' size: one chunk per thread.
    min_rows = _launcher.MIN_CHUNK_ROWS["products_scatter_k"]
    n_chunks = _launcher.chunks(n, min_rows, threads, per_thread=1)
    bins = np.zeros((n_chunks, plan.total, k))
    accb = np.zeros((n_chunks, plan.sparse_width, k))
    head = (_width(k), Y, plan.idxs, plan.offsets, plan.pads, plan.kind)
    head += (plan.indptr, plan.rows, plan.indices, plan.data, plan.binary, bins, accb)
    _launcher.launch("products_scatter_k", head, n, n_chunks, threads)
    out = np.zeros((plan.n_cols, k))
    b = bins[0] if n_chunks == 1 else bins.sum(axis=0)
    if plan.dense is not None:
        # BLAS reads the dense base once for all k columns.
        out[plan.dense_cols] += plan.dense.T @ Y
    if plan.kind != BASE_NONE:
        out[plan.sparse_cols] += accb[0] if n_chunks == 1 else accb.sum(axis=0)
    for group in plan.groups:
        for src in group:
            out[src.cols] += src.matrix.T @ b[src.offset : src.offset + src.n_rows]
    return out
