"""khor.torch join, barrier, poll and synchronize: join returns the rank that joined last
on every rank, and while a rank has joined the others' allreduces (plain, in place, async,
grouped) get zeros from it (Average still divides by the job's size); barrier waits for the
slowest rank; poll reports completion without blocking and synchronize returns the result
once (an unknown or used handle is a ValueError)."""

import time

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import assert_tensor, contrib, rank_size  # noqa: E402


@pytest.mark.parametrize("worker", ["rank0", "last_rank"])
def test_join_allreduce_gets_zeros_from_joined(worker):
    """Every rank but `worker` joins at once; `worker` runs allreduces (which can complete
    only once the others have joined) and joins last."""
    r, n = rank_size()
    w = 0 if worker == "rank0" else n - 1
    res = {}
    if r == w:
        x = contrib(r, (3, 2), torch.float32)
        res["sum"] = hvd.allreduce(x, op=hvd.Sum, name="join.sum")
        res["avg"] = hvd.allreduce(x, op=hvd.Average, name="join.avg")
        res["max"] = hvd.allreduce(x - 10, op=hvd.Max, name="join.max")
        y = x.clone()
        res["inplace"] = hvd.synchronize(hvd.allreduce_async_(y, op=hvd.Sum, name="join.ip"))
        res["grouped"] = hvd.grouped_allreduce([x, x.double()], op=hvd.Sum, name="join.g")
    last = hvd.join()
    lasts = hvd.allgather(torch.tensor([last]))
    assert lasts.tolist() == [w] * n, "join's result differs between ranks"
    if r == w:
        x = contrib(r, (3, 2), torch.float32)
        assert_tensor(res["sum"], x, "Sum with the others joined")
        assert_tensor(res["avg"], x / n, "Average divides by the job's size")
        zero = torch.zeros_like(x) if n > 1 else x - 10
        assert_tensor(res["max"], torch.maximum(x - 10, zero), "joined ranks count as zeros")
        assert_tensor(res["inplace"], x)
        assert_tensor(res["grouped"][0], x)
        assert_tensor(res["grouped"][1], x.double())


def test_join_everyone_at_once():
    r, n = rank_size()
    last = hvd.join()
    lasts = hvd.allgather(torch.tensor([last]))
    assert 0 <= last < n and lasts.tolist() == [last] * n
    # The job goes on normally afterwards.
    assert_tensor(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n)))


def test_barrier_waits_for_the_slowest():
    r, n = rank_size()
    if r == n - 1:
        time.sleep(0.3)
    t0 = time.time()
    hvd.barrier()
    waited = time.time() - t0
    waits = hvd.allgather(torch.tensor([waited]))
    if n > 1:
        assert waits[:-1].min() > 0.2, waits


def test_poll_and_synchronize():
    r, n = rank_size()
    if r == 0:
        time.sleep(0.2)        # the others' handles cannot complete before this
    h = hvd.allreduce_async(contrib(r, (4,), torch.float64), op=hvd.Sum, name="poll")
    early = hvd.poll(h)
    deadline = time.time() + 30
    while not hvd.poll(h) and time.time() < deadline:
        time.sleep(0.001)
    assert hvd.poll(h)
    out = hvd.synchronize(h)
    early_all = hvd.allgather(torch.tensor([early]))
    assert_tensor(out, sum(contrib(k, (4,), torch.float64) for k in range(n)))
    if n > 1:
        assert not early_all[1:].any(), "poll said done before rank 0 enqueued"
    with pytest.raises(ValueError):
        hvd.synchronize(h)
    with pytest.raises(ValueError):
        hvd.poll(h)
    with pytest.raises(ValueError):
        hvd.synchronize(987654321)
