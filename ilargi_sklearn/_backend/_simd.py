"""8-lane float64 vector intrinsics for the compiled kernels, defined on first use.

numba leaves LLVM's SLP vectorizer off (``NUMBA_SLP_VECTORIZE=0``), so a kernel that
keeps eight accumulators in eight scalars stays scalar: eight FMAs where one vector
FMA would do, a 7-compare tournament where a min tree would. These intrinsics emit
the vector operations on an 8-element float64 accumulator on the kernel's stack,
which LLVM keeps in a register (one AVX-512 register, two AVX ones). The arithmetic
is the scalar code's lane by lane (products in the sources' dtype, sums in float64,
``a + x * c`` contracted to an FMA where the CPU has one), so a kernel written with
them gives bitwise the results of its scalar form.

A kernel calls them as attributes of this module (``_simd.fma8(acc, x, row, off)``):
numba resolves them when it compiles the kernel, after its launcher has called
:func:`define`. The intrinsics:

* ``acc8()``: a new accumulator (a pointer to 8 float64 on the stack);
  ``accs24()`` and ``slot(accs, q)``: 24 of them, the ``q``-th (registers once LLVM
  unrolls the fixed-length loops over ``q``);
* ``zero8(acc)``; ``fma8(acc, x, src, off)``: ``acc += x * src.ravel()[off:off+8]``;
  ``add8(acc, src, off)``; ``addlane8(acc, lane, value)``: one lane, by a select;
  ``addto8(dst, off, acc)``: ``dst.ravel()[off:off+8] += acc``;
* ``argmin8(acc, bias, off)``: ``(min, first lane)`` of ``bias[off:off+8] - 2 acc``,
  as ``np.argmin`` (K-Means' E-step);
* ``mu2x8(num0, den0, num1, den1, W, off0, off1, eps)``: GNMF's update of one row of
  W from two possibly overlapping 8-lane blocks, NumPy's operations in NumPy's order.

Without numba nothing here is defined, and nothing calls it: the kernels are a fast
path of the NumPy code (:mod:`._launcher`).
"""

from __future__ import annotations

import logging

from ilargi_sklearn._backend import _launcher

__all__ = ["define"]

logger = logging.getLogger(__name__)

acc8 = zero8 = fma8 = add8 = argmin8 = mu2x8 = addto8 = None
accs24 = slot = addlane8 = None


def define() -> None:
    """Define the intrinsics (once; nothing without numba).

    Failing that (an llvmlite or numba without these APIs), the compiled kernels
    are disabled as on a compilation failure:
    :class:`~._launcher.CompiledUnavailable`.
    """
    if argmin8 is not None or not _launcher._import_numba():
        return
    try:
        _build()
    except Exception as exc:  # pragma: no cover - llvmlite/numba API drift
        raise _launcher.disable(
            f"numba's vector intrinsics are unavailable ({exc})"
        ) from exc


def _build() -> None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    f64 = ir.DoubleType()
    v8 = ir.VectorType(f64, 8)
    i32, i64 = ir.IntType(32), ir.IntType(64)
    contract = ("contract",)

    def lanes(context, builder, arrty, arr, offty, off):
        # The 8 elements ``arr.ravel()[off:off + 8]`` (C-contiguous ``arr``) as a
        # vector of its dtype, unaligned.
        ary = context.make_array(arrty)(context, builder, arr)
        off = context.cast(builder, off, offty, types.intp)
        ptr = builder.gep(ary.data, [off])
        ety = context.get_data_type(arrty.dtype)
        vptr = builder.bitcast(ptr, ir.VectorType(ety, 8).as_pointer())
        return builder.load(vptr, align=arrty.dtype.bitwidth // 8), ety

    def acc_ptr(context, builder, accty, acc):
        # The accumulator: the pointer from acc8.
        return builder.bitcast(acc, v8.as_pointer())

    def splat(builder, value, vty):
        vec = builder.insert_element(ir.Constant(vty, ir.Undefined), value, i32(0))
        mask = ir.Constant(ir.VectorType(i32, 8), [0] * 8)
        return builder.shuffle_vector(vec, ir.Constant(vty, ir.Undefined), mask)

    def to_f64(builder, vec, ety):
        return vec if ety == f64 else builder.fpext(vec, v8)

    @intrinsic
    def acc8(typingctx):
        # An 8-lane accumulator on the kernel's stack (an alloca in its entry
        # block), which LLVM keeps in a register: an array from np.empty stayed in
        # memory, stored after every operation (LLVM cannot tell that nothing
        # else reads it).
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, v8)
            return builder.bitcast(slot, f64.as_pointer())

        return types.CPointer(types.float64)(), codegen

    @intrinsic
    def zero8(typingctx, acc):
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, sig.args[0], args[0])
            builder.store(ir.Constant(v8, [0.0] * 8), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc), codegen

    @intrinsic
    def fma8(typingctx, acc, x, src, off):
        # acc[:8] += x * src.ravel()[off:off + 8]; the product in the wider dtype
        # of x and src (numba's promotion), the sum in float64.
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, sig.args[0], args[0])
            c, ety = lanes(context, builder, sig.args[2], args[2], sig.args[3], args[3])
            if sig.args[1] == types.float64 or ety == f64:
                xv = context.cast(builder, args[1], sig.args[1], types.float64)
                c, ety = to_f64(builder, c, ety), f64
            else:
                xv = context.cast(builder, args[1], sig.args[1], types.float32)
            xv = splat(builder, xv, ir.VectorType(ety, 8))
            prod = to_f64(builder, builder.fmul(xv, c, flags=contract), ety)
            acc = builder.load(ptr, align=8)
            builder.store(builder.fadd(acc, prod, flags=contract), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc, x, src, off), codegen

    @intrinsic
    def add8(typingctx, acc, src, off):
        # acc[:8] += src.ravel()[off:off + 8] (in float64).
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, sig.args[0], args[0])
            p, ety = lanes(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            acc = builder.load(ptr, align=8)
            builder.store(builder.fadd(acc, to_f64(builder, p, ety)), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc, src, off), codegen

    @intrinsic
    def argmin8(typingctx, acc, bias, off):
        # (min_l e_l, first l attaining it) for e = bias.ravel()[off:off + 8] - 2 acc,
        # in float64: the first minimum, as np.argmin (the values are never NaN).
        def codegen(context, builder, sig, args):
            acc = builder.load(acc_ptr(context, builder, sig.args[0], args[0]), align=8)
            b, ety = lanes(context, builder, sig.args[1], args[1], sig.args[2], args[2])
            two = ir.Constant(v8, [2.0] * 8)
            e = builder.fsub(
                to_f64(builder, b, ety),
                builder.fmul(two, acc, flags=contract),
                flags=contract,
            )
            m = e
            undef = ir.Constant(v8, ir.Undefined)
            for perm in (
                [4, 5, 6, 7, 0, 1, 2, 3],
                [2, 3, 0, 1, 6, 7, 4, 5],
                [1, 0, 3, 2, 5, 4, 7, 6],
            ):
                s = builder.shuffle_vector(
                    m, undef, ir.Constant(ir.VectorType(i32, 8), perm)
                )
                m = builder.select(builder.fcmp_ordered("<", s, m), s, m)
            low = builder.extract_element(m, i32(0))
            hit = builder.bitcast(
                builder.fcmp_ordered("==", e, splat(builder, low, v8)), ir.IntType(8)
            )
            cttz = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.IntType(8), [ir.IntType(8), ir.IntType(1)]),
                "llvm.cttz.i8",
            )
            lane = builder.zext(builder.call(cttz, [hit, ir.IntType(1)(0)]), i64)
            return context.make_tuple(builder, sig.return_type, [low, lane])

        return types.Tuple((types.float64, types.int64))(acc, bias, off), codegen

    @intrinsic
    def mu2x8(typingctx, num0, den0, num1, den1, W, off0, off1, eps):
        # GNMF's update of one row of W from two 8-lane blocks: lanes
        # W.ravel()[off:off + 8] *= num / den (eps where den is 0) for (num0, den0,
        # off0) and (num1, den1, off1). Both blocks are loaded before either is
        # stored, so they may overlap (rows of 9 to 15 columns): the shared lanes
        # get the same value twice. NumPy's operations in NumPy's order: the
        # quotient first, then the product.
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[4])(context, builder, args[4])

            def ptr(i):
                off = context.cast(builder, args[i], sig.args[i], types.intp)
                return builder.bitcast(builder.gep(ary.data, [off]), v8.as_pointer())

            ptrs = (ptr(5), ptr(6))
            old = [builder.load(q, align=8) for q in ptrs]
            e = context.cast(builder, args[7], sig.args[7], types.float64)
            e = splat(builder, e, v8)
            zero = ir.Constant(v8, [0.0] * 8)
            for (n, d), w, q in zip(
                ((args[0], args[1]), (args[2], args[3])), old, ptrs
            ):
                num = builder.load(acc_ptr(context, builder, None, n), align=8)
                den = builder.load(acc_ptr(context, builder, None, d), align=8)
                den = builder.select(builder.fcmp_ordered("==", den, zero), e, den)
                builder.store(builder.fmul(w, builder.fdiv(num, den)), q, align=8)
            return context.get_dummy_value()

        return (
            types.void(num0, den0, num1, den1, W, off0, off1, eps),
            codegen,
        )

    @intrinsic
    def addto8(typingctx, dst, off, acc):
        # dst.ravel()[off:off + 8] += acc (a C-contiguous float64 dst).
        def codegen(context, builder, sig, args):
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            o = context.cast(builder, args[1], sig.args[1], types.intp)
            ptr = builder.bitcast(builder.gep(ary.data, [o]), v8.as_pointer())
            a = builder.load(acc_ptr(context, builder, None, args[2]), align=8)
            builder.store(builder.fadd(builder.load(ptr, align=8), a), ptr, align=8)
            return context.get_dummy_value()

        return types.void(dst, off, acc), codegen

    @intrinsic
    def accs24(typingctx):
        # 24 8-lane accumulators on the kernel's stack, the q-th at slot(accs, q).
        # Indexed by constants once LLVM unrolls the fixed-length loops over them,
        # they live in registers (as acc8's).
        def codegen(context, builder, sig, args):
            slot = cgutils.alloca_once(builder, ir.ArrayType(v8, 24))
            return builder.bitcast(slot, f64.as_pointer())

        return types.CPointer(types.float64)(), codegen

    @intrinsic
    def slot(typingctx, accs, q):
        def codegen(context, builder, sig, args):
            q = context.cast(builder, args[1], sig.args[1], types.intp)
            return builder.gep(args[0], [builder.mul(q, ir.Constant(q.type, 8))])

        return types.CPointer(types.float64)(accs, q), codegen

    @intrinsic
    def addlane8(typingctx, acc, lane, value):
        # acc[lane] += value, the other lanes unchanged (a select, no branch).
        def codegen(context, builder, sig, args):
            ptr = acc_ptr(context, builder, None, args[0])
            acc = builder.load(ptr, align=8)
            lane = context.cast(builder, args[1], sig.args[1], types.int64)
            value = context.cast(builder, args[2], sig.args[2], types.float64)
            hit = builder.icmp_signed(
                "==",
                ir.Constant(ir.VectorType(i64, 8), list(range(8))),
                splat(builder, lane, ir.VectorType(i64, 8)),
            )
            new = builder.fadd(acc, splat(builder, value, v8))
            builder.store(builder.select(hit, new, acc), ptr, align=8)
            return context.get_dummy_value()

        return types.void(acc, lane, value), codegen

    globals().update(
        acc8=acc8,
        zero8=zero8,
        fma8=fma8,
        add8=add8,
        argmin8=argmin8,
        mu2x8=mu2x8,
        addto8=addto8,
        accs24=accs24,
        slot=slot,
        addlane8=addlane8,
    )
