# SPDX-License-Identifier: BSD-3-Clause
"""oktopk.Handle on float64, bfloat16 and float16 gradients, at any number of ranks: numpy
arrays and torch tensors of each type through every method, results the same bits on every
rank and of the handle's type, dense within its rounding of the mean, tensors reduced as their
numpy twins, asynchronous calls equal to blocking ones, sparse results the dense ones'
entries, the residual in its own type, and arrays or dtypes that do not fit refused on every
rank.

Run: mpiexec -n P python3 -m mpi4py test_dtypes.py (PYTHONPATH: the build's python folder)."""

import numpy as np

import oktopk
from harness import (check, comm, finish, identical_on_all_ranks, import_torch, raises, rank,
                     size)

OPTIONS = {"density": 0.02, "threshold_period": 4}
# Relative rounding unit of each type (float64's: the float32 inputs sum exactly but for order).
UNIT = {"float64": 2.0**-50, "bfloat16": 2.0**-8, "float16": 2.0**-11}


def gradient(r, n, call):
    """Rank r's float32 gradient for a call: small noise over a few large entries."""
    rng = np.random.default_rng([r, call, n, 7])
    g = rng.uniform(-0.5, 0.5, n).astype(np.float32)
    big = rng.random(n) < 1.0 / 37
    g[big] = (8.0 * g[big] + np.sign(g[big]) * 4.0).astype(np.float32)
    return g


def to_bfloat16_bits(x):
    """float32 values rounded to bfloat16 (nearest, ties to even), as uint16 bit patterns."""
    u = x.view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16_bits(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def as_type(x, dtype):
    """float32 values x as a numpy array a handle of `dtype` takes."""
    if dtype == "bfloat16":
        return to_bfloat16_bits(x)
    return x.astype(dtype)


def as_float64(a, dtype):
    """The values of such an array, as float64."""
    if dtype == "bfloat16":
        return from_bfloat16_bits(a).astype(np.float64)
    return a.astype(np.float64)


def test_method(method, dtype, n):
    a = oktopk.Handle(comm, method, n, dtype=dtype, **OPTIONS)
    b = oktopk.Handle(comm, method, n, dtype=dtype, **OPTIONS)
    check(a.dtype == dtype and a.residual_dtype == ("float64" if dtype == "float64"
                                                     else "float32")
          and f" {dtype} " in repr(a), f"{method} {dtype}: dtype, residual_dtype, repr")
    kinds_ok = identical = twin_ok = values_ok = True
    for call in range(4):
        grad = as_type(gradient(rank, n, call), dtype)
        # Every other call through the progress thread: the same result as the twin's blocking
        # call.
        out = a.reduce(grad) if call % 2 == 0 else a.reduce_async(grad, np.empty_like(grad)).wait()
        kinds_ok &= out.dtype == grad.dtype and out.shape == (n,)
        inplace = grad.copy()
        b.reduce_(inplace)
        twin_ok &= np.array_equal(out, inplace)
        identical &= identical_on_all_ranks(out)
        values = as_float64(out, dtype)
        if method == "dense":
            grads = [as_float64(as_type(gradient(r, n, call), dtype), dtype) for r in range(size)]
            mean = np.mean(grads, 0)
            magnitude = np.mean(np.abs(grads), 0)
            # P roundings of each term and one of the average (docs/reference.md, "Gradient types").
            values_ok &= bool(np.all(np.abs(values - mean) <= (size + 2) * UNIT[dtype] *
                                     magnitude))
        elif method != "s2":
            nonzero = np.count_nonzero(values)
            values_ok &= 0 < nonzero <= 2 * size * a.k
    residual = a.residual()
    check(kinds_ok and residual.dtype == np.dtype(a.residual_dtype) and residual.shape == (n,),
          f"{method} {dtype}: outputs of the handle's type, the residual of its own")
    check(identical and twin_ok,
          f"{method} {dtype}: the same bits on every rank, in place as out of place")
    check(values_ok, f"{method} {dtype}: dense is the mean, sparse keeps at most 2 P k entries")
    grad = as_type(gradient(rank, n, 9), dtype)
    indices, sparse_values = a.reduce_sparse(grad)
    dense = b.reduce(grad)
    scattered = np.zeros_like(dense)
    scattered[indices] = sparse_values
    check(sparse_values.dtype == dense.dtype and np.array_equal(scattered, dense),
          f"{method} {dtype}: reduce_sparse returns reduce's entries, of the handle's type")
    a.close()
    b.close()


def test_torch():
    torch = import_torch()
    if torch is None:
        return
    n = 2500
    for dtype in ("float64", "bfloat16", "float16"):
        a = oktopk.Handle(comm, "oktopk", n, dtype=getattr(torch, dtype), **OPTIONS)
        b = oktopk.Handle(comm, "oktopk", n, dtype=dtype, **OPTIONS)
        ok = a.dtype == dtype
        for call in range(3):
            grad = gradient(rank, n, call)
            t = torch.from_numpy(grad.copy()).to(getattr(torch, dtype))
            twin = as_type(grad, dtype)
            if dtype != "bfloat16":
                ok &= np.array_equal(t.numpy(), twin)  # torch rounds as numpy does
            returned = a.reduce_(t)
            expected = b.reduce(as_type(grad, dtype))
            seen = t.view(torch.int16).numpy().view(np.uint16) if dtype == "bfloat16" else \
                t.numpy()
            ok &= returned is t and np.array_equal(seen, expected)
        check(ok, f"torch.{dtype} tensors are reduced in place, as their numpy twins")
        t = torch.from_numpy(gradient(rank, n, 5)).to(getattr(torch, dtype))
        indices, values = a.reduce_sparse(t)
        out = a.reduce(t)
        check(isinstance(values, torch.Tensor) and values.dtype == getattr(torch, dtype) and
              indices.dtype == torch.int32 and out.dtype == getattr(torch, dtype),
              f"torch.{dtype}: reduce_sparse and reduce return tensors of the handle's type")
        # A float32 tensor on rank 0 only: TypeError there, ValueError on the others.
        wrong = torch.zeros(n) if rank == 0 else torch.zeros(n, dtype=getattr(torch, dtype))
        e = raises(TypeError if rank == 0 else ValueError, a.reduce_, wrong)
        check(e is not None and (rank != 0 or f"torch.{dtype}, the handle's" in str(e)),
              f"torch.{dtype} handle, a float32 tensor on rank 0: an error on every rank ({e})")
        a.close()
        b.close()


def test_arguments():
    n = 300
    h = oktopk.Handle(comm, "topka", n, dtype=np.float64, density=0.1)
    check(h.dtype == "float64", "dtype=np.float64")
    e = raises(TypeError, h.reduce, np.zeros(n, np.float32))
    check(e is not None and "must have dtype float64" in str(e),
          f"a float32 array for a float64 handle: TypeError ({e})")
    h.close()
    bits = oktopk.Handle(comm, "dense", n, dtype="bfloat16")
    grad = to_bfloat16_bits(gradient(rank, n, 0))
    out_unsigned = bits.reduce(grad)
    out_signed = bits.reduce(grad.view(np.int16), np.empty(n, np.int16))
    check(out_unsigned.dtype == np.uint16 and
          np.array_equal(out_unsigned, out_signed.view(np.uint16)),
          "bfloat16: uint16 and int16 bit patterns alike")
    bits.close()
    e = raises(ValueError, oktopk.Handle, comm, "dense", n, dtype="int8")
    check(e is not None and "dtype must be one of" in str(e), f"dtype='int8': ValueError ({e})")
    e = raises(ValueError, oktopk.Handle, comm, "dense", n, dtype=np.int32)
    check(e is not None and "not one OkTopk reduces" in str(e), f"dtype=np.int32: ValueError ({e})")
    # A bad dtype on the last rank only: every rank raises, none waits.
    e = raises(ValueError, oktopk.Handle, comm, "dense", n,
               dtype="float128" if rank == size - 1 else "float32")
    check(e is not None, f"a bad dtype on one rank: ValueError on every rank ({e})")
    if size > 1:
        e = raises(ValueError, oktopk.Handle, comm, "oktopk", n,
                   dtype="float16" if rank == 0 else "bfloat16")
        check(e is not None and "gradient type" in str(e),
              f"dtypes that differ across ranks: ValueError on every rank ({e})")
    e = raises(ValueError, oktopk.Handle, comm, "topka", n, dtype="float64", wire="bf16")
    check(e is not None and "wire=bf16" in str(e), f"wire=bf16 with float64: ValueError ({e})")


def main():
    oktopk.initialize("--kokkos-disable-warnings")
    for dtype in ("float64", "bfloat16", "float16"):
        for method in oktopk.ALGORITHMS:
            test_method(method, dtype, 2001)
    test_torch()
    test_arguments()
    finish()


if __name__ == "__main__":
    main()
