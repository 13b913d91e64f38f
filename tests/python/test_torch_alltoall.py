"""khor.torch alltoall and alltoall_async: splits[j] rows of dim 0 go to rank j (uneven,
zeros included, as a list or a tensor, or even when None); each rank gets the rows sent to
it in rank order, and with splits given also the splits it received (an int32 tensor), as
Horovod 0.28 returns them."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import assert_tensor, int16_param, rank_size  # noqa: E402


def splits_of(src, n):
    return [(src + 2 * j) % 3 for j in range(n)]      # zeros included


def rows(src, dst, count, dtype, width=3):
    """Rows naming their sender and receiver (100 * src + 10 * dst + row + column); in a
    narrow dtype they wrap, the same way in the input and in the reference."""
    v = torch.tensor([[100 * src + 10 * dst + i + c for c in range(width)]
                      for i in range(count)], dtype=torch.int64).reshape(count, width)
    return v.to(dtype)


@pytest.mark.parametrize("dtype", [torch.uint8, int16_param(torch.int16), torch.int32,
                                   torch.float32, torch.float64, torch.bfloat16], ids=str)
@pytest.mark.parametrize("splits_as", ["list", "tensor"])
def test_alltoall_uneven(splits_as, dtype):
    r, n = rank_size()
    sp = splits_of(r, n)
    send = torch.cat([rows(r, j, sp[j], dtype) for j in range(n)])
    splits = sp if splits_as == "list" else torch.tensor(sp, dtype=torch.int32)
    out, rsplits = hvd.alltoall(send, splits=splits)
    want_splits = [splits_of(k, n)[r] for k in range(n)]
    want = torch.cat([rows(k, r, want_splits[k], dtype) for k in range(n)])
    assert rsplits.dtype == torch.int32
    assert rsplits.tolist() == want_splits
    assert_tensor(out, want)


def test_alltoall_even_and_async():
    r, n = rank_size()
    send = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    out = hvd.alltoall(send)            # without splits: the tensor alone (Horovod 0.28)
    out2, rsplits2 = hvd.synchronize(hvd.alltoall_async(send.reshape(2 * n, 1), name="a2a"))
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * k
                      for k in range(n)])
    assert rsplits2.tolist() == [2] * n
    assert_tensor(out, want)
    assert_tensor(out2, want.reshape(2 * n, 1))
