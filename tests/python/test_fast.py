"""The hot path of khor.torch's allreduce (khor._khorfast, bindings/python/ext/khorfast.c)
against the ctypes path it replaces: the extension is loaded where the build made it
(KHOR_EXPECT_FAST=1, set by CTest when it is built; KHOR_FAST=0 runs the same tests over
ctypes), the tensors that take it and those that do not give the references' results, and
its refusals raise as the ctypes path's do (a name in flight, a shape the ranks disagree
on, a process set this rank is not in)."""

import os

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khor import _core, _lib  # noqa: E402
from khortest import rank_size  # noqa: E402


def test_the_extension_is_loaded_where_it_was_built():
    if os.environ.get("KHOR_FAST") == "0":
        assert _lib.fast is None, "KHOR_FAST=0 must leave the extension unloaded"
    elif os.environ.get("KHOR_EXPECT_FAST") == "1":
        assert _lib.fast is not None, "the build made _khorfast.abi3.so but it did not load"
    else:
        pytest.skip("not told whether _khorfast was built (KHOR_EXPECT_FAST)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64,
                                   torch.float16, torch.uint8])
def test_many_small_async_allreduces_in_place(dtype):
    r, n = rank_size()
    ts = [torch.full((3, 5), r + i % 50, dtype=dtype) for i in range(200)]
    hs = [hvd.allreduce_async_(t, name="fast.%s.%d" % (dtype, i), op=hvd.Sum)
          for i, t in enumerate(ts)]
    for i, h in enumerate(hs):
        out = hvd.synchronize(h)
        assert out is ts[i]
        want = sum(k + i % 50 for k in range(n))
        assert torch.equal(out, torch.full((3, 5), want, dtype=dtype)), (i, out)


def test_out_of_place_average_and_scaling():
    r, n = rank_size()
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4) + r
    h = hvd.allreduce_async(t, name="fast.avg", op=hvd.Average, prescale_factor=2.0,
                            postscale_factor=0.5)
    out = hvd.synchronize(h)
    assert out is not t and out.shape == t.shape
    want = (torch.arange(12, dtype=torch.float32).reshape(3, 4) * n + sum(range(n))) / n
    assert torch.allclose(out, want)
    assert torch.equal(t, torch.arange(12, dtype=torch.float32).reshape(3, 4) + r)


def test_the_other_tensors_take_the_slow_path_and_agree():
    r, n = rank_size()
    # Non-contiguous, integer with scale factors (scaled in Python), empty, a scalar.
    nc = (torch.arange(20, dtype=torch.float32).reshape(4, 5) + r).t()
    assert not nc.is_contiguous()
    out = hvd.synchronize(hvd.allreduce_async_(nc, name="fast.nc", op=hvd.Sum))
    assert torch.equal(out, (torch.arange(20, dtype=torch.float32).reshape(4, 5) * n
                             + sum(range(n))).t())
    it = torch.full((4,), 10 + r, dtype=torch.int32)
    out = hvd.synchronize(hvd.allreduce_async(it, name="fast.int", op=hvd.Sum,
                                              prescale_factor=2.0))
    assert torch.equal(out, torch.full((4,), 2 * sum(10 + k for k in range(n)),
                                       dtype=torch.int32))
    e = hvd.synchronize(hvd.allreduce_async(torch.empty(0, 3), name="fast.empty"))
    assert e.shape == (0, 3)
    s = hvd.synchronize(hvd.allreduce_async(torch.tensor(float(r)), name="fast.scalar",
                                            op=hvd.Sum))
    assert s.shape == () and s.item() == sum(range(n))


def test_a_name_in_flight_is_refused_and_the_first_still_completes():
    r, n = rank_size()
    t = torch.ones(8)
    h = hvd.allreduce_async_(t, name="fast.dup", op=hvd.Sum)
    with pytest.raises(ValueError, match="already in flight"):
        hvd.allreduce_async_(torch.ones(8), name="fast.dup", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(h), torch.full((8,), float(n)))


def test_a_shape_the_ranks_disagree_on_fails_on_every_rank():
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    t = torch.ones(4 + r)
    with pytest.raises(Exception, match="fast.mismatch"):
        hvd.synchronize(hvd.allreduce_async_(t, name="fast.mismatch"))


def test_an_uninitialized_job_refuses_as_before():
    hvd.shutdown()
    try:
        with pytest.raises(ValueError, match="not been initialized"):
            hvd.allreduce_async_(torch.ones(2), name="fast.noinit")
    finally:
        hvd.init()


def test_poll_and_handles_are_ints_on_both_paths():
    h = hvd.allreduce_async_(torch.ones(16), name="fast.poll")
    p = _core._state.pending[h]
    assert isinstance(p.h, int) and p.h > 0
    while not hvd.poll(h):
        pass
    hvd.synchronize(h)
    g = hvd.allreduce_async(torch.ones(2, dtype=torch.int8), name="fast.poll.slow",
                            prescale_factor=3.0)
    assert isinstance(_core._state.pending[g].h, int)
    hvd.synchronize(g)


@pytest.mark.parametrize("in_place", [True, False])
def test_a_grouped_allreduce_goes_over_in_one_call(in_place, monkeypatch):
    r, n = rank_size()
    calls = []
    if _lib.fast is not None:
        real = _lib.fast.grouped_allreduce

        def counted(*a):
            calls.append(len(a[2]))
            return real(*a)
        monkeypatch.setattr(_core, "_fast", _CountingFast(_lib.fast, counted))
    # Mixed dtypes and shapes, one empty and one scalar: one handle, one hand-over.
    ts = [torch.full((7,), r + 1.0), torch.full((2, 3), r, dtype=torch.int64),
          torch.empty(0), torch.tensor(r + 0.5, dtype=torch.float64)] + \
         [torch.full((64,), float(r + i)) for i in range(300)]
    fn = hvd.grouped_allreduce_async_ if in_place else hvd.grouped_allreduce_async
    h = fn(ts, name="fast.group.%s" % in_place, op=hvd.Sum)
    outs = hvd.synchronize(h)
    assert isinstance(outs, list) and len(outs) == len(ts)
    if in_place:
        assert all(o is t for o, t in zip(outs, ts))
    else:
        assert not any(o is t for o, t in zip(outs, ts))
        assert torch.equal(ts[0], torch.full((7,), r + 1.0))
    assert torch.equal(outs[0], torch.full((7,), float(sum(k + 1 for k in range(n)))))
    assert outs[1].dtype == torch.int64 and \
        torch.equal(outs[1], torch.full((2, 3), sum(range(n)), dtype=torch.int64))
    assert outs[2].shape == (0,)
    assert outs[3].shape == () and outs[3].item() == sum(k + 0.5 for k in range(n))
    for i in range(300):
        assert torch.equal(outs[4 + i], torch.full((64,), float(sum(k + i for k in range(n)))))
    if _lib.fast is not None:
        assert calls == [len(ts)], "the group took %s hot-path calls" % calls


def test_a_grouped_average_with_scaling_and_a_slow_member():
    r, n = rank_size()
    # A non-contiguous member sends the whole group down the ctypes path; same answer.
    nc = (torch.arange(6, dtype=torch.float32).reshape(2, 3) + r).t()
    for extra in ([], [nc]):
        ts = [torch.full((5,), 2.0 * (r + 1)), torch.full((3,), float(r))] + extra
        outs = hvd.grouped_allreduce(ts, name="fast.gavg.%d" % len(extra), op=hvd.Average,
                                     prescale_factor=2.0, postscale_factor=0.25)
        mean1 = sum(2.0 * (k + 1) for k in range(n)) / n
        assert torch.allclose(outs[0], torch.full((5,), mean1 * 0.5))
        assert torch.allclose(outs[1], torch.full((3,), sum(range(n)) / n * 0.5))
        if extra:
            want = (torch.arange(6, dtype=torch.float32).reshape(2, 3)
                    + sum(range(n)) / n).t() * 0.5
            assert torch.allclose(outs[2], want)


def test_a_grouped_shape_mismatch_fails_on_every_rank():
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs 2 ranks")
    ts = [torch.ones(4), torch.ones(3 + r)]
    with pytest.raises(Exception, match="fast.gmis"):
        hvd.synchronize(hvd.grouped_allreduce_async_(ts, name="fast.gmis"))


class _CountingFast:
    """_khorfast with grouped_allreduce counted (the module's own attributes are fixed)."""

    def __init__(self, mod, grouped):
        self._mod, self.grouped_allreduce = mod, grouped

    def __getattr__(self, k):
        return getattr(self._mod, k)
