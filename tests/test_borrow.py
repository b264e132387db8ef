"""Views without an owner inside kernels (darkpy/kernels/borrow.py): the same memory, no reference
counted, and an array the kernel made kept alive until `keep`."""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from darkpy.kernels.borrow import borrowed, keep


@intrinsic
def _owner(typingctx, a):
    """The address of a's meminfo (0: no owner)."""
    if not isinstance(a, types.Array):
        return None

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        return builder.ptrtoint(arr.meminfo, context.get_value_type(types.intp))
    return types.intp(a), codegen


@njit
def _owners(a):
    """(a's owner, its borrowed view's, a row of that view's) and the view's row sums written into
    a's last column through a slice of the view."""
    v = borrowed(a)
    for r in range(v.shape[0]):
        row = v[r]
        row[-1] = row[:-1].sum()
    return _owner(a), _owner(v), _owner(v[0])


def test_a_borrowed_view_has_no_owner_and_writes_the_same_memory():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    own, view, row = _owners(a)
    assert own != 0 and view == 0 and row == 0
    np.testing.assert_array_equal(a[:, -1], [0 + 1 + 2, 4 + 5 + 6, 8 + 9 + 10])


@njit
def _scratch_sum(n):
    """The sum of 0..n-1 through a borrowed view of an array the kernel made, kept to the end."""
    made = np.empty(n, np.float64)
    v = borrowed(made)
    for i in range(n):
        v[i] = i
    other = np.zeros(n)             # would take `made`'s memory (and zero it) were that freed
    total = 0.0
    for i in range(n):
        total += v[i]
    keep(made)
    return total + other[0]


def test_keep_holds_an_array_the_kernel_made_until_its_view_is_done():
    assert _scratch_sum(1000) == sum(range(1000))


def test_borrowed_keeps_shape_strides_and_dtype():
    a = np.arange(60, dtype=np.float64).reshape(3, 4, 5)[:, ::2, 1:]

    @njit
    def through(x):
        v = borrowed(x)
        return v.shape, v.strides, v[2, 1, 3]
    shape, strides, value = through(a)
    assert shape == a.shape and strides == a.strides and value == a[2, 1, 3]


@njit(parallel=True)
def _written_in_parallel(a):
    """a[i] := i + 1 through a view borrowed in each parallel iteration and never read after (the
    shape of Winograd's filter transform, `winograd._filter`)."""
    for i in prange(a.shape[0]):
        v = borrowed(a)
        v[i] = i + 1.0


def test_writes_through_a_borrowed_view_are_kept():
    """numba's dead-code pass keeps a write into a view only when it knows the view aliases an
    array that outlives it: `borrowed` is registered as such (without it, nothing was written)."""
    a = np.zeros(64)
    _written_in_parallel(a)
    np.testing.assert_array_equal(a, np.arange(1, 65))
