"""khor.torch allgather, allgather_async, grouped_allgather and grouped_allgather_async:
every rank's tensor concatenated along dim 0, which differs per rank (zero rows included),
in every dtype (bool too)."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import assert_tensor, contrib, rank_size, torch_dtypes  # noqa: E402


@pytest.mark.parametrize("dtype", torch_dtypes(with_bool=True), ids=str)
def test_allgather_uneven_dim0(dtype):
    r, n = rank_size()
    out = hvd.allgather(contrib(r, (r + 1, 2, 3), dtype))
    assert_tensor(out, torch.cat([contrib(k, (k + 1, 2, 3), dtype) for k in range(n)]))


def test_allgather_async():
    r, n = rank_size()
    h = hvd.allgather_async(contrib(r, (2, 2), torch.int64),
                            name="ag.async")
    out = hvd.synchronize(h)
    assert_tensor(out, torch.cat([contrib(k, (2, 2), torch.int64) for k in range(n)]))


def test_allgather_scalar_and_zero_rows():
    r, n = rank_size()
    s = hvd.allgather(torch.tensor(float(r)))
    z = hvd.allgather(contrib(r, (r % 2, 3), torch.float32))     # even ranks send 0 rows
    assert_tensor(s, torch.arange(n, dtype=torch.float32), "0-dim tensors gather to (n,)")
    assert_tensor(z, torch.cat([contrib(k, (k % 2, 3), torch.float32) for k in range(n)]),
                  "ranks with zero rows")


def test_allgather_noncontiguous():
    r, n = rank_size()
    base = contrib(r, (3, 4), torch.float64)
    out = hvd.allgather(base.t())
    assert_tensor(out, torch.cat([contrib(k, (3, 4), torch.float64).t() for k in range(n)]))


def _group(k):
    return [contrib(k, (k + 1, 2), torch.float32), contrib(k, (2 * k + 1,), torch.int64, 1),
            contrib(k, (k + 2, 1, 2), torch.bool, 2), contrib(k, (1,), torch.bfloat16, 3)]


@pytest.mark.parametrize("form", ["grouped_allgather", "grouped_allgather_async"])
def test_grouped_allgather(form):
    r, n = rank_size()
    if form == "grouped_allgather":
        outs = hvd.grouped_allgather(_group(r), name="gag")
    else:
        outs = hvd.synchronize(hvd.grouped_allgather_async(_group(r), name="gag"))
    assert isinstance(outs, list) and len(outs) == 4
    for i, o in enumerate(outs):
        assert_tensor(o, torch.cat([_group(k)[i] for k in range(n)]), "tensor %d" % i)
