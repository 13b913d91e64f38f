"""Gradients through khor.torch's collectives, against Horovod's backward semantics with a
different upstream gradient w_k on each rank k (so every rank can compute the expected
gradient from all of them): allreduce -> allreduce of the gradient with the same op and
scale factors; allgather -> average-allreduce of the gradient, then this rank's rows;
broadcast -> average-allreduce on the root, zero elsewhere; alltoall -> alltoall of the
gradient with the splits received; reducescatter -> allgather of the gradient times the
size for Sum, as is for Average (Horovod 0.28.1's backward, which test_torch.py's
test_horovod_reducescatter_grad expects; not the exact derivative). Plus torch.autograd.gradcheck (float64) of allreduce, where Horovod's backward is the
exact derivative under gradcheck's lock-step perturbation of every rank."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import rand, rank_size, split_rows  # noqa: E402

F64 = torch.float64


def close(a, b, what=""):
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m: "%s: %s" % (what, m))


def upstream(k, shape, salt=9):
    return rand(k, shape, salt=salt)


@pytest.mark.parametrize("op,pre,post", [(hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0),
                                         (hvd.Sum, 0.5, 3.0), (hvd.Average, 2.0, 0.25)])
def test_allreduce_grad(op, pre, post):
    r, n = rank_size()
    x = rand(r, (3, 2)).requires_grad_(True)
    y = hvd.allreduce(x, op=op, prescale_factor=pre, postscale_factor=post)
    (y * upstream(r, (3, 2))).sum().backward()
    ws = torch.stack([upstream(k, (3, 2)) for k in range(n)]) * pre
    want = (ws.sum(0) if op == hvd.Sum else ws.mean(0)) * post
    close(x.grad, want, "allreduce grad")


def test_allreduce_grad_fp16_compression():
    r, n = rank_size()
    x = torch.ones(4, dtype=torch.float32, requires_grad=True)
    y = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    assert y.dtype == torch.float32
    w = torch.full((4,), float(r + 1))
    (y * w).sum().backward()
    assert x.grad.dtype == torch.float32
    assert torch.equal(x.grad, torch.full((4,), float(sum(k + 1 for k in range(n)))))


def test_grouped_allreduce_grad():
    r, n = rank_size()
    xs = [rand(r, (2,), salt=1).requires_grad_(True), rand(r, (3, 1), salt=2).requires_grad_()]
    ys = hvd.grouped_allreduce(xs, op=hvd.Average)
    sum((y * upstream(r, y.shape, salt=i)).sum() for i, y in enumerate(ys)).backward()
    for i, x in enumerate(xs):
        close(x.grad, torch.stack([upstream(k, x.shape, salt=i) for k in range(n)]).mean(0),
              "tensor %d" % i)


def test_allgather_grad():
    r, n = rank_size()
    x = rand(r, (r + 1, 2)).requires_grad_(True)
    y = hvd.allgather(x)
    total = sum(k + 1 for k in range(n))
    assert y.shape == (total, 2)
    (y * upstream(r, (total, 2))).sum().backward()
    off = sum(k + 1 for k in range(r))
    want = torch.stack([upstream(k, (total, 2)) for k in range(n)]).mean(0)[off:off + r + 1]
    close(x.grad, want, "allgather grad")


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_grad(root):
    r, n = rank_size()
    root_rank = 0 if root == "first" else n - 1
    x = rand(r, (4,)).requires_grad_(True)
    y = hvd.broadcast(x, root_rank)
    (y * upstream(r, (4,))).sum().backward()
    want = torch.stack([upstream(k, (4,)) for k in range(n)]).mean(0)
    if r != root_rank:
        want = torch.zeros(4, dtype=F64)
    close(x.grad, want, "broadcast grad")


def a2a_splits(src, n):
    return [(src + j) % 2 + 1 for j in range(n)]


def test_alltoall_grad():
    r, n = rank_size()
    sp = a2a_splits(r, n)
    x = rand(r, (sum(sp), 2)).requires_grad_(True)
    y, rsp = hvd.alltoall(x, splits=sp)
    assert rsp.tolist() == [a2a_splits(k, n)[r] for k in range(n)]
    (y * upstream(r, tuple(y.shape))).sum().backward()
    # Rows r sent to j sit in j's output after those from ranks before r.
    pieces = []
    for j in range(n):
        recv_j = [a2a_splits(k, n)[j] for k in range(n)]
        w_j = upstream(j, (sum(recv_j), 2))
        off = sum(recv_j[:r])
        pieces.append(w_j[off:off + sp[j]])
    close(x.grad, torch.cat(pieces), "alltoall grad")


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_reducescatter_grad(op):
    r, n = rank_size()
    d0 = 2 * n + 1
    x = rand(r, (d0, 2)).requires_grad_(True)
    y = hvd.reducescatter(x, op=op)
    off, cnt = split_rows(d0, n, r)
    assert y.shape == (cnt, 2)
    (y * upstream(r, (cnt, 2))).sum().backward()
    want = torch.cat([upstream(k, (split_rows(d0, n, k)[1], 2)) for k in range(n)])
    if op == hvd.Sum:
        want = want * n              # Horovod's scaling, not the exact derivative
    close(x.grad, want, "reducescatter grad")


@pytest.mark.parametrize("op", [hvd.Sum, hvd.Average], ids=["sum", "average"])
def test_allreduce_gradcheck(op):
    """Every rank perturbs the same element at the same time, so the numerical Jacobian is
    n * I for Sum and I for Average, which is what allreduce's backward gives with the same
    upstream gradient everywhere."""
    r, n = rank_size()
    x = rand(r, (3,)).requires_grad_(True)

    def f(t):
        return hvd.allreduce(t, op=op)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6)
