"""khor.torch allreduce in all its forms (allreduce, allreduce_, allreduce_async,
allreduce_async_, grouped_allreduce and its _/async/async_ forms) against references every
rank computes from what every rank contributed: each op and dtype, average=, the scale
factors, fp16 compression, names, non-contiguous tensors."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import assert_tensor, contrib, rank_size, torch_dtypes  # noqa: E402

OPS = {"sum": hvd.Sum, "average": hvd.Average, "min": hvd.Min, "max": hvd.Max,
       "product": hvd.Product}


def reference(op, inputs, pre=1.0, post=1.0):
    """op over the ranks' inputs, computed wide (float64 / int64) and cast back; Average on
    integers truncates toward zero (khor.h); scale factors apply to floating point only."""
    dtype = inputs[0].dtype
    n = len(inputs)
    fp = dtype.is_floating_point
    stack = torch.stack([t.to(torch.float64 if fp else torch.int64) for t in inputs])
    if fp:
        stack = stack * pre
    if op == "sum":
        out = stack.sum(0)
    elif op == "average":
        out = stack.sum(0) / n if fp else torch.div(stack.sum(0), n, rounding_mode="trunc")
    elif op == "min":
        out = stack.min(0).values
    elif op == "max":
        out = stack.max(0).values
    else:
        out = stack.prod(0)
    if fp:
        out = out * post
    return out.to(dtype)


def _hi(op):
    return 4 if op == "product" else 7     # 3**4 = 81 fits int8


@pytest.mark.parametrize("dtype", torch_dtypes(), ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce_op_dtype(op, dtype):
    r, n = rank_size()
    shape = (2, 3, 4)
    out = hvd.allreduce(contrib(r, shape, dtype, hi=_hi(op)), op=OPS[op])
    want = reference(op, [contrib(k, shape, dtype, hi=_hi(op)) for k in range(n)])
    assert_tensor(out, want, "allreduce %s %s" % (op, dtype))


@pytest.mark.parametrize("form", ["allreduce_", "allreduce_async", "allreduce_async_"])
@pytest.mark.parametrize("op", list(OPS))
def test_allreduce_forms(form, op):
    r, n = rank_size()
    t = contrib(r, (5, 3), torch.float32, hi=_hi(op))
    before = t.clone()
    if form == "allreduce_":
        out = hvd.allreduce_(t, op=OPS[op], name="ar.form")
    elif form == "allreduce_async":
        out = hvd.synchronize(hvd.allreduce_async(t, op=OPS[op], name="ar.form"))
    else:
        out = hvd.synchronize(hvd.allreduce_async_(t, op=OPS[op], name="ar.form"))
    want = reference(op, [contrib(k, (5, 3), torch.float32, hi=_hi(op)) for k in range(n)])
    assert_tensor(out, want, form)
    if form.endswith("_"):
        assert out is t, "%s must return its input" % form
    else:
        assert out is not t
        assert_tensor(t, before, "allreduce_async leaves its input alone")


@pytest.mark.parametrize("average,want_op", [(True, "average"), (False, "sum"),
                                             (None, "average")])
def test_allreduce_average_argument(average, want_op):
    r, n = rank_size()
    out = hvd.allreduce(contrib(r, (4,), torch.float64), average=average)
    assert_tensor(out, reference(want_op, [contrib(k, (4,), torch.float64) for k in range(n)]))


def test_allreduce_op_and_average_conflict():
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32,
                                   torch.float64], ids=str)
@pytest.mark.parametrize("op", ["sum", "average", "min", "max"])
def test_allreduce_scale_factors(op, dtype):
    r, n = rank_size()
    x = contrib(r, (6,), dtype)
    out = hvd.allreduce(x, op=OPS[op], prescale_factor=0.5, postscale_factor=3.0)
    out_ = hvd.allreduce_(x.clone(), op=OPS[op], prescale_factor=0.5, postscale_factor=3.0)
    want = reference(op, [contrib(k, (6,), dtype) for k in range(n)], 0.5, 3.0)
    assert_tensor(out, want, "allreduce scaled")
    assert_tensor(out_, want, "allreduce_ scaled")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_allreduce_fp16_compression(dtype):
    r, n = rank_size()
    x = contrib(r, (3, 4), dtype) + 0.25       # exact in float16
    out = hvd.allreduce(x, op=hvd.Sum, compression=hvd.Compression.fp16)
    want = reference("sum", [contrib(k, (3, 4), dtype) + 0.25 for k in range(n)])
    assert_tensor(out, want, "fp16-compressed allreduce comes back in its dtype")
    ints = hvd.allreduce(contrib(r, (3,), torch.int32), op=hvd.Sum,
                         compression=hvd.Compression.fp16)
    assert_tensor(ints, reference("sum", [contrib(k, (3,), torch.int32) for k in range(n)]),
                  "fp16 compression leaves integers alone")
    c, ctx = hvd.Compression.fp16.compress(x)
    assert c.dtype == torch.float16 and hvd.Compression.fp16.decompress(c, ctx).dtype == dtype
    c, ctx = hvd.Compression.none.compress(x)
    assert c is x and hvd.Compression.none.decompress(c, ctx) is x


def test_allreduce_names_several_in_flight():
    r, n = rank_size()
    xs = [contrib(r, (4,), torch.float32, salt=i) for i in range(6)]
    handles = [hvd.allreduce_async(x, name="ar.named.%d" % i, op=hvd.Sum)
               for i, x in enumerate(xs[:3])]
    handles += [hvd.allreduce_async(x, op=hvd.Sum) for x in xs[3:]]   # automatic names
    outs = [hvd.synchronize(h) for h in reversed(handles)][::-1]
    for i, out in enumerate(outs):
        want = reference("sum", [contrib(k, (4,), torch.float32, salt=i) for k in range(n)])
        assert_tensor(out, want, "tensor %d" % i)


def test_allreduce_noncontiguous():
    r, n = rank_size()
    base = contrib(r, (4, 6), torch.float64)
    view = base.t()[::2]                                 # not contiguous
    assert not view.is_contiguous()
    out = hvd.allreduce(view, op=hvd.Sum)
    want_full = reference("sum", [contrib(k, (4, 6), torch.float64) for k in range(n)])
    assert_tensor(out, want_full.t()[::2].contiguous(), "allreduce of a view")
    res = hvd.allreduce_(view, op=hvd.Sum)
    assert res is view
    want = contrib(r, (4, 6), torch.float64)
    want.t()[::2] = want_full.t()[::2]
    assert_tensor(base, want, "allreduce_ writes a view's result back into its base")


def test_allreduce_scalar_and_empty():
    r, n = rank_size()
    s = hvd.allreduce(torch.tensor(float(r + 1)), op=hvd.Sum)
    e = hvd.allreduce(torch.zeros(0, 3), op=hvd.Sum)
    assert s.shape == () and s.item() == n * (n + 1) / 2
    assert e.shape == (0, 3)


# ---- grouped ------------------------------------------------------------------------------

def _group(k):
    return [contrib(k, (3, 2), torch.float32, salt=0), contrib(k, (5,), torch.float64, salt=1),
            contrib(k, (2, 2, 2), torch.int32, salt=2), contrib(k, (1,), torch.float16, salt=3)]


@pytest.mark.parametrize("form", ["grouped_allreduce", "grouped_allreduce_",
                                  "grouped_allreduce_async", "grouped_allreduce_async_"])
@pytest.mark.parametrize("op", ["sum", "average", "max"])
def test_grouped_allreduce(form, op):
    r, n = rank_size()
    ts = _group(r)
    before = [t.clone() for t in ts]
    fn = getattr(hvd, form)
    if form.endswith("async") or form.endswith("async_"):
        outs = hvd.synchronize(fn(ts, op=OPS[op], name="gar." + form))
    else:
        outs = fn(ts, op=OPS[op], name="gar." + form)
    assert isinstance(outs, list) and len(outs) == len(ts)
    wants = [reference(op, list(col)) for col in zip(*[_group(k) for k in range(n)])]
    for i, (o, w) in enumerate(zip(outs, wants)):
        assert_tensor(o, w, "%s tensor %d" % (form, i))
        if form.endswith("_"):
            assert o is ts[i]
        else:
            assert_tensor(ts[i], before[i], "%s leaves its input alone" % form)


def test_grouped_allreduce_scale_and_compression():
    r, n = rank_size()
    ts = [contrib(r, (4,), torch.float32), contrib(r, (2, 3), torch.float64, salt=1)]
    outs = hvd.grouped_allreduce(ts, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0,
                                 compression=hvd.Compression.fp16)
    for i, o in enumerate(outs):
        want = reference("sum", [(contrib(k, (4,), torch.float32), contrib(
            k, (2, 3), torch.float64, salt=1))[i] for k in range(n)], 0.5, 4.0)
        assert_tensor(o, want, "grouped tensor %d" % i)
