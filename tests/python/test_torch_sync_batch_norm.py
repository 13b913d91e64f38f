"""khor.torch.SyncBatchNorm (CPU) against torch.nn.BatchNorm on the batch of every rank
concatenated (ranks hold different batch sizes): forward output, running statistics over two
steps (momentum 0.1 and None, the cumulative average), the input gradient, the weight and
bias gradients summed over ranks, and evaluation mode."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import rand, rank_size  # noqa: E402

SHAPES = {"1d": (3,), "1d_len": (3, 5), "2d": (3, 2, 3)}
REF = {"1d": torch.nn.BatchNorm1d, "1d_len": torch.nn.BatchNorm1d, "2d": torch.nn.BatchNorm2d}


def inputs(k, shape, step, dtype):
    x = rand(k, (k + 2,) + shape, salt=2 * step) * 2 + 1
    w = rand(k, (k + 2,) + shape, salt=2 * step + 1)
    return x.to(dtype), w.to(dtype)


def _affine(bn):
    with torch.no_grad():
        c = bn.num_features
        bn.weight.copy_(torch.linspace(0.5, 1.5, c))
        bn.bias.copy_(torch.linspace(-0.2, 0.3, c))


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)],
                         ids=["float64", "float32"])
@pytest.mark.parametrize("momentum", [0.1, None], ids=["momentum0.1", "cumulative"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_sync_batch_norm_matches_full_batch(kind, momentum, dtype, tol):
    r, n = rank_size()
    shape = SHAPES[kind]
    c = shape[0]
    sbn = hvd.SyncBatchNorm(c, momentum=momentum).to(dtype)
    ref = REF[kind](c, momentum=momentum).to(dtype)
    _affine(sbn)
    _affine(ref)
    got, want = [], []
    for step in range(2):
        x, w = inputs(r, shape, step, dtype)
        x.requires_grad_(True)
        y = sbn(x)
        (y * w).sum().backward()
        dw = hvd.allreduce(sbn.weight.grad, op=hvd.Sum)
        db = hvd.allreduce(sbn.bias.grad, op=hvd.Sum)
        got.append(dict(y=y.detach(), dx=x.grad, mean=sbn.running_mean.clone(),
                        var=sbn.running_var.clone(), dw=dw, db=db))
        sbn.zero_grad()

        xs, ws = zip(*[inputs(k, shape, step, dtype) for k in range(n)])
        xf = torch.cat(xs).requires_grad_(True)
        yf = ref(xf)
        (yf * torch.cat(ws)).sum().backward()
        off = sum(k + 2 for k in range(r))
        want.append(dict(y=yf.detach()[off:off + r + 2], dx=xf.grad[off:off + r + 2],
                         mean=ref.running_mean.clone(), var=ref.running_var.clone(),
                         dw=ref.weight.grad.clone(), db=ref.bias.grad.clone()))
        ref.zero_grad()
    sbn.eval()
    ref.eval()
    xe, _ = inputs(r, shape, 5, dtype)
    got_eval, want_eval = sbn(xe), ref(xe)
    for step in range(2):
        for key in want[step]:
            torch.testing.assert_close(got[step][key], want[step][key], rtol=tol, atol=tol,
                                       msg=lambda m: "step %d %s: %s" % (step, key, m))
    assert sbn.num_batches_tracked.item() == 2
    torch.testing.assert_close(got_eval, want_eval, rtol=tol, atol=tol)


def test_sync_batch_norm_without_affine_or_running_stats():
    r, n = rank_size()
    sbn = hvd.SyncBatchNorm(3, affine=False, track_running_stats=False).double()
    ref = torch.nn.BatchNorm1d(3, affine=False, track_running_stats=False).double()
    x, w = inputs(r, (3,), 0, torch.float64)
    x.requires_grad_(True)
    y = sbn(x)
    (y * w).sum().backward()
    xs, ws = zip(*[inputs(k, (3,), 0, torch.float64) for k in range(n)])
    xf = torch.cat(xs).requires_grad_(True)
    yf = ref(xf)
    (yf * torch.cat(ws)).sum().backward()
    off = sum(k + 2 for k in range(r))
    torch.testing.assert_close(y.detach(), yf.detach()[off:off + r + 2])
    torch.testing.assert_close(x.grad, xf.grad[off:off + r + 2])


def test_sync_batch_norm_rejects_1d_input():
    with pytest.raises(ValueError):
        hvd.SyncBatchNorm(3)(torch.ones(3))
