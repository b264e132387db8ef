"""Arrays inside a kernel without numba's reference counting.

Every array view numba makes inside a kernel (a slice `pf[a:b]`, a row `y[b, f, r]`, an argument
taken by a helper that is not inlined) holds a reference to its parent's memory: an atomic
increment when made and an atomic decrement when dropped (`NRT_incref` / `NRT_decref`, a `lock`
instruction each, ~20 cycles). In a small layer's kernel at batch 1 those were half its time:
digits' first layer (1 -> 16 on 16x16 with its 2x2 maxpool, 74 kFLOP) took 3.7 µs, of which perf
put 50 % on the two functions' atomic instructions (its row loops slice the planes, the input and
the output rows). Both functions skip a view without an owner (its `meminfo` pointer NULL), and
every view made from such a view has none either.

`borrowed(a)`: the array `a` as a view without an owner. Only for memory that outlives every use
of the view: an argument of the kernel (its caller holds it for the whole call), or an array the
kernel made and names again with `keep(a)` after the view's last use (numba frees an array right
after the last statement that names it; a view without an owner does not hold it). A borrowed
view must never leave the kernel: returned to Python it would point to memory nobody holds.
With every array of the direct paths' forwards borrowed (kernels/direct.py, direct_fv.py), that
layer's kernel took 2.1 µs instead of 3.7, and digits' forward at batch 1 ~21 µs instead of ~24.
Training's row passes pay it per (item, channel) row: the bias / batch-norm passes (kernels/bn.py),
the weight gradients' delta rows (direct_wgrad.py, direct_fv_grad.py). Within digits' training
step at b32 (2 threads, 2-core Zen 5), borrowed: its 64 -> 10 layer's bias backward (rows of 16)
22 -> 6 µs, the direct_fv weight gradients of its 16 -> 32 and 32 -> 64 layers 94 -> 58 and
116 -> 68 µs, its first layer's direct weight gradient 45 -> 32 µs; alone, on one thread, the BN
backward of 32 x 10 rows of 16 values 25.8 -> 6.2 µs.

numba is told that `borrowed(a)` is `a` (its alias analysis, `_same_array`): without that, a
parallel kernel that wrote into a borrowed view and read nothing back after had those writes
dropped as dead stores (a first version of Winograd's vector filter transform, which borrowed
its output inside the parallel loop, wrote nothing).
"""
from __future__ import annotations

from numba import types
from numba.core import cgutils, ir_utils
from numba.extending import intrinsic


@intrinsic
def borrowed(typingctx, a):
    """`a`'s values, shape and strides as an array without an owner (see the module docstring)."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        dst = context.make_array(sig.return_type)(context, builder, value=src._getvalue())
        dst.meminfo = cgutils.get_null_value(dst.meminfo.type)
        dst.parent = cgutils.get_null_value(dst.parent.type)
        return dst._getvalue()
    return a(a), codegen


@intrinsic
def keep(typingctx, a):
    """Nothing, but names `a` (an array the kernel made): numba frees it after this, not before."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, sig, args):
        return context.get_dummy_value()
    return types.none(a), codegen


def _same_array(lhs, args, alias_map, arg_aliases):
    """numba's alias analysis for `lhs = borrowed(a)`: lhs aliases a (as for `a.reshape(...)`), so
    numba keeps the writes into lhs as writes into a."""
    ir_utils._add_alias(lhs, args[0].name, alias_map, arg_aliases)


ir_utils.alias_func_extensions[("borrowed", __name__)] = _same_array
