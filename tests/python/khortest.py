"""Helpers shared by the Python tests: rank-dependent inputs that every rank can rebuild for
every other rank (so each computes the exact expected result locally), and comparisons.

Nothing here imports torch at import time: the numpy tests run without it.
"""

import khor


def int16_param(value):
    """value as a parametrize entry, xfail while the C core lacks KHOR_INT16 (= 9)."""
    import pytest
    from khor import _lib
    if _lib.khor_dtype_size(_lib.INT16) == 2:
        return value
    return pytest.param(value, marks=pytest.mark.xfail(
        strict=True, reason="int16 pending in the C core"))


def rank_size():
    return khor.rank(), khor.size()


def split_rows(d0, n, r):
    """reducescatter's rows for rank r of n: (offset, count); the first d0 % n get one more."""
    base, extra = divmod(d0, n)
    return r * base + min(r, extra), base + (1 if r < extra else 0)


def even_odd_ranks(n):
    return [k for k in range(n) if k % 2 == 0], [k for k in range(n) if k % 2 == 1]


# ---- torch ---------------------------------------------------------------------------------

def torch_dtypes(with_bool=False, with_int16=True):
    import torch
    out = [torch.uint8, torch.int8]
    if with_int16:
        out.append(int16_param(torch.int16))
    out += [torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
            torch.float64]
    if with_bool:
        out.append(torch.bool)
    return out


def contrib(k, shape, dtype, salt=0, lo=1, hi=7):
    """Rank k's input: small integers in [lo, hi) laid out by position, rank and salt, exact
    in every dtype (bool: their parity)."""
    import torch
    n = 1
    for d in shape:
        n *= d
    span = hi - lo
    v = (torch.arange(n, dtype=torch.int64) * 3 + k * 5 + salt * 7) % span + lo
    v = v.reshape(shape)
    if dtype == torch.bool:
        return (v % 2).to(torch.bool)
    return v.to(dtype)


def rand(k, shape, dtype=None, salt=0):
    """Rank k's random float64 (or dtype) tensor, the same on every rank that builds it."""
    import torch
    g = torch.Generator().manual_seed(1000 * salt + k + 1)
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return t if dtype is None else t.to(dtype)


def assert_tensor(actual, expected, what=""):
    """Same dtype, shape and values: exact for integers and bool, within a couple of ulps of
    the dtype for floating point."""
    import torch
    assert isinstance(actual, torch.Tensor), "%s: got %r" % (what, type(actual))
    assert actual.dtype == expected.dtype, "%s: dtype %s, want %s" % (what, actual.dtype,
                                                                     expected.dtype)
    assert tuple(actual.shape) == tuple(expected.shape), \
        "%s: shape %s, want %s" % (what, tuple(actual.shape), tuple(expected.shape))
    if actual.dtype.is_floating_point:
        tol = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5,
               torch.float64: 1e-12}[actual.dtype]
        torch.testing.assert_close(actual.double(), expected.double(), rtol=tol, atol=tol,
                                   msg=lambda m: "%s: %s" % (what, m))
    else:
        assert torch.equal(actual, expected), "%s:\n got %s\nwant %s" % (what, actual,
                                                                          expected)
