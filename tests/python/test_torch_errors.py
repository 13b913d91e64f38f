"""khor.torch's errors: tensors that differ across ranks in shape or dtype (allreduce,
grouped_allreduce, allgather beyond dim 0, broadcast, alltoall, reducescatter) and
broadcasts with different roots raise HorovodInternalError (a khor.KhorError) on
every rank, naming the tensor, and the job carries on; a name already in flight raises at
once; Adasum raises NotImplementedError; bad arguments raise locally; the *_built() flags
are False."""

import time

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor  # noqa: E402
import khor.torch as hvd  # noqa: E402
from khortest import rank_size  # noqa: E402


def test_horovod_internal_error_is_khor_error():
    import khor.exceptions
    assert hvd.HorovodInternalError is khor.exceptions.HorovodInternalError
    assert issubclass(hvd.HorovodInternalError, khor.KhorError)
    assert issubclass(hvd.HorovodInternalError, RuntimeError)


def _raise_everywhere(fn, name):
    """Runs fn on every rank; each must raise HorovodInternalError naming `name`."""
    t0 = time.time()
    try:
        fn()
        err = None
    except hvd.HorovodInternalError as e:
        err = e
    took = time.time() - t0
    raised = hvd.allgather(torch.tensor([err is not None]))
    assert raised.all(), "raised on ranks %s only" % raised.nonzero().flatten().tolist()
    assert name in str(err), "the message does not name %r: %s" % (name, err)
    assert took < 10, "the error took %.1f s" % took
    # The job works afterwards.
    n = hvd.size()
    assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [float(n)] * 2


def _skip_single():
    if hvd.size() == 1:
        pytest.skip("a mismatch needs two ranks")


def _f32_or(r, other):
    return torch.float32 if r % 2 == 0 else other


# case -> (tensor name, call on rank r)
MISMATCHES = {
    "allreduce_shape": ("err.ar.shape", lambda r, nm: hvd.allreduce(torch.ones(3 + r), name=nm)),
    "allreduce_dtype": ("err.ar.dtype", lambda r, nm: hvd.allreduce(
        torch.ones(3, dtype=_f32_or(r, torch.float64)), name=nm)),
    "allreduce_ndim": ("err.ar.ndim", lambda r, nm: hvd.allreduce(
        torch.ones([2] * (1 + r % 2)), name=nm)),
    "allreduce_async_shape": ("err.ara.shape", lambda r, nm: hvd.synchronize(
        hvd.allreduce_async_(torch.ones(2, 1 + r), name=nm))),
    "grouped_allreduce_shape": ("err.gar", lambda r, nm: hvd.grouped_allreduce(
        [torch.ones(2), torch.ones(1 + r)], name=nm)),
    "allgather_shape": ("err.ag.shape", lambda r, nm: hvd.allgather(torch.ones(2, 1 + r),
                                                                    name=nm)),
    "allgather_dtype": ("err.ag.dtype", lambda r, nm: hvd.allgather(
        torch.ones(2, dtype=torch.int32 if r % 2 == 0 else torch.int64), name=nm)),
    "broadcast_shape": ("err.bc.shape", lambda r, nm: hvd.broadcast(torch.ones(2 + r), 0,
                                                                    name=nm)),
    "broadcast_dtype": ("err.bc.dtype", lambda r, nm: hvd.broadcast_(
        torch.ones(2, dtype=torch.uint8 if r % 2 == 0 else torch.int8), 0, name=nm)),
    "broadcast_root": ("err.bc.root", lambda r, nm: hvd.broadcast(torch.ones(2), r, name=nm)),
    "alltoall_dtype": ("err.a2a.dtype", lambda r, nm: hvd.alltoall(
        torch.ones(hvd.size(), dtype=_f32_or(r, torch.float16)), name=nm)),
    "alltoall_shape": ("err.a2a.shape", lambda r, nm: hvd.alltoall(
        torch.ones(hvd.size(), 1 + r), name=nm)),
    "reducescatter_shape": ("err.rs.shape", lambda r, nm: hvd.reducescatter(
        torch.ones(2 * hvd.size() + r), name=nm)),
    "reducescatter_dtype": ("err.rs.dtype", lambda r, nm: hvd.reducescatter(
        torch.ones(hvd.size(), dtype=_f32_or(r, torch.bfloat16)), name=nm)),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatch_raises_on_every_rank(case):
    _skip_single()
    r = hvd.rank()
    name, fn = MISMATCHES[case]
    _raise_everywhere(lambda: fn(r, name), name)


def _dup_while_in_flight(first, dup):
    """first(name) -> handle, then dup(name) at once, each while `name` certainly cannot
    complete: ranks other than 0 try it with name A before rank 0 has submitted A, rank 0 with
    name B before the others have submitted B (two barriers order the phases). Returns
    (this rank's (error, seconds the refusal took), results of A and B)."""
    r = hvd.rank()
    a, b = "dupA", "dupB"

    def attempt(name):
        h = first(name)
        t0 = time.time()
        try:
            dup(name)
            err = None
        except hvd.HorovodInternalError as e:
            err = e
        return h, (err, time.time() - t0)
    if r != 0:
        ha, got = attempt(a)
    hvd.barrier()
    if r == 0:
        hb, got = attempt(b)
    hvd.barrier()
    if r == 0:
        ha = first(a)
    else:
        hb = first(b)
    return got, (hvd.synchronize(ha), hvd.synchronize(hb))


def _check_dup(got, name_in_message):
    err, took = got
    refused = hvd.allgather(torch.tensor([err is not None]))
    assert refused.all(), "a name in flight was accepted on ranks %s" % (
        (~refused).nonzero().flatten().tolist())
    assert name_in_message in str(err) and "in flight" in str(err), str(err)
    assert took < 1.0, "the refusal took %.2f s" % took


def test_duplicate_name_in_flight_raises_at_once():
    r, n = rank_size()
    if n == 1:
        pytest.skip("on one rank an allreduce may complete before the second enqueue")
    got, (ra, rb) = _dup_while_in_flight(
        lambda nm: hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name=nm),
        lambda nm: hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name=nm))
    _check_dup(got, "dupA" if r else "dupB")
    assert ra.tolist() == rb.tolist() == [float(n)] * 3      # the first ones completed
    # Once completed, the name may be used again.
    assert hvd.allreduce(torch.ones(1), op=hvd.Sum, name="dupA").item() == n


def test_duplicate_name_across_kinds():
    r, n = rank_size()
    if n == 1:
        pytest.skip("on one rank an allgather may complete before the second enqueue")
    got, (ga, gb) = _dup_while_in_flight(
        lambda nm: hvd.allgather_async(torch.ones(1), name=nm),
        lambda nm: hvd.broadcast_async(torch.ones(1), 0, name=nm))
    _check_dup(got, "dupA" if r else "dupB")
    assert ga.shape == gb.shape == (n,)


def test_duplicate_name_of_a_group_member():
    r, n = rank_size()
    if n == 1:
        pytest.skip("on one rank a group may complete before the second enqueue")
    got, (ga, gb) = _dup_while_in_flight(
        lambda nm: hvd.grouped_allreduce_async([torch.ones(1), torch.ones(2)], name=nm,
                                               op=hvd.Sum),
        lambda nm: hvd.allreduce_async(torch.ones(2), name=nm + ".1"))
    _check_dup(got, ("dupA" if r else "dupB") + ".1")
    assert [t.tolist() for t in ga] == [[float(n)], [float(n)] * 2]


def test_adasum_is_not_implemented():
    p = torch.nn.Parameter(torch.ones(2))
    for call in (lambda: hvd.allreduce(torch.ones(2), op=hvd.Adasum),
                 lambda: hvd.allreduce_(torch.ones(2), op=hvd.Adasum),
                 lambda: hvd.allreduce_async(torch.ones(2), op=hvd.Adasum),
                 lambda: hvd.allreduce_async_(torch.ones(2), op=hvd.Adasum),
                 lambda: hvd.grouped_allreduce([torch.ones(2)], op=hvd.Adasum),
                 lambda: hvd.reducescatter(torch.ones(2), op=hvd.Adasum),
                 lambda: hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0),
                                                  op=hvd.Adasum)):
        with pytest.raises(NotImplementedError):
            call()


def test_local_argument_errors():
    with pytest.raises(TypeError):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError):
        hvd.allreduce_async([1.0, 2.0])
    with pytest.raises(NotImplementedError):
        hvd.allreduce_async(torch.ones(2).to_sparse())
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), op=42)
    with pytest.raises(ValueError):
        hvd.reducescatter(torch.tensor(1.0))
    with pytest.raises(ValueError):
        hvd.init(comm=object())


def test_built_flags():
    # nccl_built and cuda_built follow the library (test_torch_horovod_semantics)
    for f in (hvd.mpi_built, hvd.gloo_built, hvd.ddl_built, hvd.ccl_built, hvd.rocm_built,
              hvd.mpi_enabled, hvd.gloo_enabled, hvd.mpi_threads_supported):
        assert f() is False, f.__name__
