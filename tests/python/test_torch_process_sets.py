"""Process sets in khor.torch: add_process_set with the even and the odd ranks (lists and
ProcessSet objects), the collectives on them (allreduce, grouped_allreduce, allgather,
alltoall, reducescatter, barrier, broadcast, broadcast_object, DistributedOptimizer), their
ProcessSet attributes, remove_process_set, and the errors for duplicates, bad ranks,
non-members and removed sets. init(process_sets=...) is in test_torch_init.py."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import (assert_tensor, contrib, even_odd_ranks, rank_size,  # noqa: E402
                      split_rows)

@pytest.fixture
def sets():
    """(even set, odd set, this rank's set, its world ranks); removed afterwards."""
    r, n = rank_size()
    if n < 2:
        pytest.skip("process sets of even and odd ranks need two ranks")
    even, odd = even_odd_ranks(n)
    es = hvd.add_process_set(even)
    os_ = hvd.add_process_set(hvd.ProcessSet(odd))
    mine = es if r % 2 == 0 else os_
    yield es, os_, mine, (even if r % 2 == 0 else odd)
    hvd.remove_process_set(os_)
    hvd.remove_process_set(es)


def test_process_set_objects(sets):
    r, n = rank_size()
    es, os_, mine, members = sets
    assert isinstance(es, hvd.ProcessSet) and isinstance(os_, hvd.ProcessSet)
    assert es.process_set_id is not None and os_.process_set_id is not None
    assert len({0, es.process_set_id, os_.process_set_id}) == 3
    assert hvd.global_process_set.process_set_id == 0
    assert es.ranks == even_odd_ranks(n)[0] and os_.ranks == even_odd_ranks(n)[1]
    assert mine.size() == len(members) and mine.rank() == members.index(r)
    assert mine.included() and not (os_ if mine is es else es).included()
    assert hvd.global_process_set.size() == n and hvd.global_process_set.rank() == r
    ids = hvd.allgather(torch.tensor([es.process_set_id, os_.process_set_id]))
    assert ids.reshape(n, 2).unique(dim=0).shape[0] == 1, "set ids differ between ranks"


def test_collectives_on_sets(sets):
    r, n = rank_size()
    es, os_, mine, members = sets
    m = len(members)
    me = members.index(r)
    s = hvd.allreduce(contrib(r, (3,), torch.int32), op=hvd.Sum, process_set=mine)
    a = hvd.allreduce(contrib(r, (3,), torch.float64), process_set=mine)
    g = hvd.grouped_allreduce([contrib(r, (2,), torch.float32), contrib(r, (1,), torch.int64)],
                              op=hvd.Max, process_set=mine)
    ag = hvd.allgather(contrib(r, (r + 1, 2), torch.int32), process_set=mine)
    sp = [me + j + 1 for j in range(m)]
    send = torch.cat([torch.full((sp[j], 1), 100 * r + j) for j in range(m)])
    a2a, rsp = hvd.alltoall(send, splits=sp, process_set=mine)
    d0 = 2 * m + 1
    rs = hvd.reducescatter(contrib(r, (d0,), torch.float32), op=hvd.Sum, process_set=mine)
    hvd.barrier(process_set=mine)
    world = hvd.allreduce(torch.ones(1), op=hvd.Sum)     # the global set still works

    assert_tensor(s, sum(contrib(k, (3,), torch.int32) for k in members))
    assert_tensor(a, sum(contrib(k, (3,), torch.float64) for k in members) / m)
    assert_tensor(g[0], torch.stack([contrib(k, (2,), torch.float32) for k in members]).max(0)
                  .values)
    assert_tensor(g[1], torch.stack([contrib(k, (1,), torch.int64) for k in members]).max(0)
                  .values)
    assert_tensor(ag, torch.cat([contrib(k, (k + 1, 2), torch.int32) for k in members]))
    want_sp = [i + me + 1 for i in range(m)]
    assert rsp.tolist() == want_sp
    assert_tensor(a2a, torch.cat([torch.full((want_sp[i], 1), 100 * k + me)
                                  for i, k in enumerate(members)]))
    off, cnt = split_rows(d0, m, me)
    assert_tensor(rs, sum(contrib(k, (d0,), torch.float32) for k in members)[off:off + cnt])
    assert world.item() == n


def test_broadcast_on_sets_root_is_global_rank(sets):
    r, n = rank_size()
    es, os_, mine, members = sets
    got = []
    for root in members:              # Horovod: root_rank is a world rank in the set
        try:
            got.append((root, hvd.broadcast(contrib(r, (4,), torch.float32), root,
                                            process_set=mine), None))
        except hvd.HorovodInternalError as e:
            got.append((root, None, str(e)))
    bad = ["rank %d root %d: %s" % (r, root, err if err else "got %s" % out.tolist())
           for root, out, err in got
           if err is not None or not torch.equal(out, contrib(root, (4,), torch.float32))]
    bad = sum(hvd.allgather_object(bad), [])       # every rank passes or fails alike
    assert not bad, "\n".join(bad)


def test_broadcast_object_on_sets_root_is_global_rank(sets):
    r, n = rank_size()
    es, os_, mine, members = sets
    got = []
    for root in members:
        try:
            got.append((root, hvd.broadcast_object({"from": r}, root, process_set=mine),
                        None))
        except hvd.HorovodInternalError as e:
            got.append((root, None, str(e)))
    bad = ["rank %d root %d: %s" % (r, root, err if err else "got %r" % obj)
           for root, obj, err in got if err is not None or obj != {"from": root}]
    bad = sum(hvd.allgather_object(bad), [])
    assert not bad, "\n".join(bad)


def test_distributed_optimizer_on_set(sets):
    r, n = rank_size()
    es, os_, mine, members = sets
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    opt = hvd.DistributedOptimizer(torch.optim.SGD([p], lr=1.0), named_parameters=[("p", p)],
                                   process_set=mine)
    (p * contrib(r, (3,), torch.float64)).sum().backward()
    opt.step()
    want = -sum(contrib(k, (3,), torch.float64) for k in members) / len(members)
    assert_tensor(p.detach(), want)


def test_set_errors(sets):
    r, n = rank_size()
    es, os_, mine, members = sets
    other = os_ if mine is es else es
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(2), process_set=other)        # not a member
    with pytest.raises(ValueError):
        hvd.add_process_set(list(members))                      # registered already
    with pytest.raises(ValueError):
        hvd.add_process_set([0, n])                             # no such rank
    with pytest.raises(ValueError):
        hvd.add_process_set([0, 0])


def test_remove_process_set():
    r, n = rank_size()
    if n < 2:
        pytest.skip("needs two ranks")
    even, odd = even_odd_ranks(n)
    es = hvd.add_process_set(even)
    os_ = hvd.add_process_set(odd)
    mine = es if r % 2 == 0 else os_
    before = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=mine)
    assert hvd.remove_process_set(os_) is True
    assert hvd.remove_process_set(es) is True
    assert hvd.remove_process_set(es) is False
    assert hvd.remove_process_set(hvd.global_process_set) is False
    assert es.process_set_id is None
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(1), process_set=mine)
    again = hvd.add_process_set(even)                        # the same ranks, once more
    ok = (hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=again, name="ps.again")
          if r % 2 == 0 else None)   # named: an unnamed one would shift the auto names
    hvd.remove_process_set(again)
    assert before.item() == len(even if r % 2 == 0 else odd)
    if ok is not None:
        assert ok.item() == len(even)


def test_broadcast_grad_on_sets_root_is_global_rank(sets):
    """Backward of a set broadcast: the set's average of the gradients on the root (a world
    rank), zero on the set's other members."""
    r, n = rank_size()
    es, os_, mine, members = sets
    root = members[-1]
    x = torch.ones(2, dtype=torch.float64, requires_grad=True)
    try:
        y = hvd.broadcast(x, root, process_set=mine)
        (y * (r + 1)).sum().backward()
        err = None
    except hvd.HorovodInternalError as e:
        err = str(e)
    want = sum(k + 1 for k in members) / len(members) if r == root else 0.0
    bad = [] if err is None and x.grad.tolist() == [want] * 2 else \
        ["rank %d: %s" % (r, err or "grad %s, want %s" % (x.grad.tolist(), want))]
    bad = sum(hvd.allgather_object(bad), [])
    assert not bad, "\n".join(bad)
