"""khor.torch on CUDA tensors: every op, the DistributedOptimizer and SyncBatchNorm on a GPU,
each against the same computation on CPU tensors in the same job, and the ordering on the
caller's stream (an input a side stream is still writing is read only after that stream's
kernels, with no synchronize by the caller). Skips, saying why, where torch has no CUDA
device; bench/gpu/device_check.sh runs it on the device machine. Several ranks may share
one GPU (rank r uses device r % count)."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import rank_size  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="no CUDA device (torch.cuda.is_available() is False)")


def _dev():
    return torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())


def _contrib(r, shape, dtype=torch.float32):
    g = torch.Generator().manual_seed(1000 + r)
    return (torch.rand(shape, generator=g) * 10).to(dtype)


def test_built_flags():
    assert hvd.cuda_built()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.int32])
def test_allreduce_matches_cpu(dtype):
    r, n = rank_size()
    x = _contrib(r, (3, 1000), dtype)
    want = hvd.allreduce(x, op=hvd.Sum, name="cpu.%s" % dtype)
    got = hvd.allreduce(x.to(_dev()), op=hvd.Sum, name="gpu.%s" % dtype)
    assert got.device == _dev()
    assert torch.allclose(got.cpu().double(), want.double(), rtol=1e-2)


def test_inplace_grouped_and_async():
    r, n = rank_size()
    xs = [_contrib(r, (17, k)).to(_dev()) for k in (1, 5, 300)]
    want = [hvd.allreduce(x.cpu(), op=hvd.Average) for x in xs]
    got = hvd.grouped_allreduce(xs, op=hvd.Average)
    for g, w in zip(got, want):
        assert torch.allclose(g.cpu(), w, rtol=1e-5)
    y = xs[2].clone()
    hvd.allreduce_(y, op=hvd.Average)
    assert torch.allclose(y.cpu(), want[2], rtol=1e-5)
    h = hvd.allreduce_async(xs[1], op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    assert torch.allclose(hvd.synchronize(h).cpu(), want[1] * n * 1.5, rtol=1e-5)


def test_allgather_broadcast_alltoall_reducescatter():
    r, n = rank_size()
    x = _contrib(r, (r + 1, 4))
    got = hvd.allgather(x.to(_dev()))
    assert got.device == _dev()
    assert torch.equal(got.cpu(), hvd.allgather(x))
    b = hvd.broadcast(x[:1].to(_dev()), root_rank=0)
    assert torch.equal(b.cpu(), hvd.broadcast(x[:1], root_rank=0))
    t = torch.arange(n * 2, dtype=torch.float32).view(n * 2, 1) + 100 * r
    a = hvd.alltoall(t.to(_dev()))
    a = a[0] if isinstance(a, tuple) else a
    ac = hvd.alltoall(t)
    ac = ac[0] if isinstance(ac, tuple) else ac
    assert a.device == _dev() and torch.equal(a.cpu(), ac)
    rs = hvd.reducescatter(t.to(_dev()), op=hvd.Sum)
    assert torch.equal(rs.cpu(), hvd.reducescatter(t, op=hvd.Sum))
    grouped = hvd.grouped_allgather([x.to(_dev()), x[:, :1].to(_dev())])
    assert [g.device for g in grouped] == [_dev(), _dev()]
    assert torch.equal(grouped[1].cpu(), hvd.allgather(x[:, :1]))


def test_ordered_on_the_callers_stream():
    """The input is written by a kernel queued on a side stream just before the call; the
    collective must read it after that kernel, with no synchronize in between."""
    r, n = rank_size()
    side = torch.cuda.Stream(_dev())
    with torch.cuda.stream(side):
        big = torch.rand(4096, 4096, device=_dev())
        for _ in range(8):
            big = big @ big / 4096.0      # some milliseconds of work on `side`
        x = torch.full((1 << 20,), float(r + 1), device=_dev()) + big[0, 0] * 0
        out = hvd.allreduce(x, op=hvd.Sum, name="ordered")
        side.synchronize()
    assert torch.all(out == float(n * (n + 1) // 2)).item()


def test_distributed_optimizer_and_sync_batch_norm():
    """Two steps of the same model on CPU and on the GPU (each its own optimizer and
    hooks) end with the same weights and running statistics."""
    r, n = rank_size()
    data = _contrib(r, (4, 3, 8, 8))
    results = []
    for dev in ("cpu", _dev()):
        torch.manual_seed(7)
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), hvd.SyncBatchNorm(4),
                                torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(4 * 6 * 6, 2)).to(dev)
        opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                       named_parameters=[("%s.%s" % (dev, k), p) for k, p in
                                                         m.named_parameters()])
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        for _ in range(2):
            opt.zero_grad()
            m(data.to(dev)).pow(2).mean().backward()
            opt.step()
        results.append([t.detach().cpu() for t in list(m.parameters()) +
                        [m[1].running_mean, m[1].running_var]])
    for c, g in zip(*results):
        assert torch.allclose(c, g, rtol=1e-4, atol=1e-5)
