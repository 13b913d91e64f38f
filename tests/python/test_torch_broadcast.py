"""khor.torch broadcast, broadcast_, broadcast_async and broadcast_async_ from every root, in
every dtype (bool too): the root's tensor everywhere; the plain forms leave their input
alone, the in-place forms return their input."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import assert_tensor, contrib, rank_size, torch_dtypes  # noqa: E402

FORMS = ["broadcast", "broadcast_", "broadcast_async", "broadcast_async_"]


def _run(form, t, root, name):
    fn = getattr(hvd, form)
    if "async" in form:
        return hvd.synchronize(fn(t, root, name=name))
    return fn(t, root, name=name)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("dtype", torch_dtypes(with_bool=True), ids=str)
def test_broadcast_each_root(dtype, form):
    r, n = rank_size()
    got = []
    for root in range(n):
        t = contrib(r, (3, 4), dtype)
        got.append((root, t, _run(form, t, root, "bc.%s.%d" % (form, root))))
    for root, t, out in got:
        assert_tensor(out, contrib(root, (3, 4), dtype), "%s root %d" % (form, root))
        if form.endswith("_"):
            assert out is t
        else:
            assert_tensor(t, contrib(r, (3, 4), dtype), "%s leaves its input" % form)


@pytest.mark.parametrize("form", FORMS)
def test_broadcast_noncontiguous(form):
    r, n = rank_size()
    base = contrib(r, (4, 6), torch.float32)
    view = base[:, 1::2]
    out = _run(form, view, n - 1, "bc.view")
    want = contrib(n - 1, (4, 6), torch.float32)[:, 1::2]
    assert torch.equal(out, want)
    if form.endswith("_"):
        expect_base = contrib(r, (4, 6), torch.float32)
        expect_base[:, 1::2] = want
        assert out is view
        assert_tensor(base, expect_base, "in-place broadcast of a view writes into its base")


def test_broadcast_scalar():
    r, n = rank_size()
    out = hvd.broadcast(torch.tensor(r + 10, dtype=torch.int64), n - 1)
    assert out.shape == () and out.item() == n - 1 + 10
