"""khor.torch.elastic in a fixed job: TorchState saves, restores and syncs models (their
parameters and buffers), optimizers (moments and step counts, learning rates), samplers and
plain attributes, and its handler registry; ElasticSampler shards an epoch over the ranks,
records what was processed (record_batch, record_indices), keeps that record through
commit, restore and sync, and shards what is left; a DistributedOptimizer built before a
reset still averages gradients after it, also when the reset came with gradients in flight;
hvd.elastic and the horovod alias. Resharding on a new size is in test_elastic_run.py."""

import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor  # noqa: E402
import khor.torch as hvd  # noqa: E402
from khortest import rank_size  # noqa: E402


def _same_everywhere(t):
    g = hvd.allgather(t.detach().reshape(1, -1))
    return bool((g == g[0]).all())


def _model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                               torch.nn.Linear(4, 1))


def _flat(model):
    return torch.cat([v.detach().reshape(-1).double() for v in model.state_dict().values()
                      if v.dtype.is_floating_point])


def _local_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 3, generator=g, dtype=torch.float32)
    opt.zero_grad()
    model(x).pow(2).sum().backward()
    opt.step()


def _moments(opt):
    return torch.cat([s["exp_avg"].reshape(-1) for s in opt.state.values()])


def test_torch_state_sync_makes_rank0s():
    r, n = rank_size()
    model = _model(10 + r)
    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (r + 1))
    _local_step(model, opt, r)                  # rank-dependent weights, moments, buffers
    st = hvd.elastic.TorchState(model, opt, epoch=r, note="rank%d" % r)
    assert st.model is model and st.optimizer is opt
    st.sync()
    assert _same_everywhere(_flat(model)), "model differs after sync"
    assert _same_everywhere(_moments(opt)), "optimizer moments differ after sync"
    assert opt.param_groups[0]["lr"] == pytest.approx(0.01)
    assert (st.epoch, st.note) == (0, "rank0")


def test_torch_state_save_restore():
    r, n = rank_size()
    model = _model(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _local_step(model, opt, 1)
    st = hvd.elastic.TorchState(model=model, optimizer=opt, batch=7)
    saved_w, saved_m = _flat(model).clone(), _moments_sgd(opt).clone()
    _local_step(model, opt, 2)                  # uncommitted progress
    st.batch = 8
    assert not torch.equal(_flat(model), saved_w)
    st.restore()
    assert torch.equal(_flat(model), saved_w) and torch.equal(_moments_sgd(opt), saved_m)
    assert st.batch == 7
    _local_step(model, opt, 3)
    st.batch = 9
    st.save()
    w3, m3 = _flat(model).clone(), _moments_sgd(opt).clone()
    _local_step(model, opt, 4)
    st.restore()
    assert torch.equal(_flat(model), w3) and torch.equal(_moments_sgd(opt), m3)
    assert st.batch == 9
    # Assigning a handled attribute saves the new value.
    other = _model(4)
    st.model = other
    _local_step(other, torch.optim.SGD(other.parameters(), lr=1.0), 5)
    w_other = _flat(other).clone()
    st.restore()
    assert st.model is other and not torch.equal(_flat(other), w_other)


def _moments_sgd(opt):
    return torch.cat([s["momentum_buffer"].reshape(-1) for s in opt.state.values()])


def test_handler_registry():
    from khor.torch.elastic import state as es

    class Counter:
        def __init__(self):
            self.n = 0

    class CounterHandler(es.StateHandler):
        def __init__(self, value):
            super().__init__(value)
            self.saved = value.n

        def save(self):
            self.saved = self.value.n

        def restore(self):
            self.value.n = self.saved

        def sync(self):
            self.value.n = hvd.broadcast_object(self.value.n, 0)

    old = hvd.elastic.get_handler_registry()
    hvd.elastic.set_handler_registry(old + [(Counter, CounterHandler)])
    try:
        c = Counter()
        c.n = 5 + hvd.rank()
        st = hvd.elastic.TorchState(counter=c)
        assert isinstance(st._handlers["counter"], CounterHandler)
        st.sync()
        assert c.n == 5
        c.n = 9
        st.restore()
        assert c.n == 5
    finally:
        hvd.elastic.set_handler_registry(old)
    assert hvd.elastic.get_handler_registry() is old


class _Data(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i


def _shards(sampler):
    """Every rank's indices of the sampler's next iteration, in rank order."""
    mine = list(iter(sampler))
    return hvd.allgather_object(mine)


def test_sampler_shards_an_epoch():
    r, n = rank_size()
    size = 4 * n + 3                             # not a multiple of the ranks
    s = hvd.elastic.ElasticSampler(_Data(size), shuffle=True, seed=7)
    shards = _shards(s)
    per = -(-size // n)
    assert all(len(x) == per == len(s) for x in shards)
    assert set().union(*map(set, shards)) == set(range(size))
    flat = [i for x in shards for i in x]
    assert len(flat) - len(set(flat)) == per * n - size       # only the padding repeats
    again = _shards(s)
    assert again == shards                       # the same order until set_epoch
    s.set_epoch(1)
    assert _shards(s) != shards                  # reshuffled, the same on every rank
    plain = hvd.elastic.ElasticSampler(_Data(size), shuffle=False)
    assert _shards(plain)[r][:2] == [r, r + n]


def test_sampler_record_commit_restore_sync():
    r, n = rank_size()
    bs = 2
    size = 6 * n * bs
    s = hvd.elastic.ElasticSampler(_Data(size), seed=3)
    st = hvd.elastic.TorchState(sampler=s)
    st.sync()
    order = [i for shard in zip(*_shards(s)) for i in shard]  # the epoch's order
    loader = torch.utils.data.DataLoader(_Data(size), batch_size=bs, sampler=s)
    it = iter(loader)
    for b in range(2):
        batch = next(it)
        assert batch.tolist() == s.get_indices(b, bs)
        s.record_batch(b, bs)
    assert s.processed_num == 2 * bs * n
    st.save()
    s.record_batch(2, bs)
    st.restore()
    assert s.processed_num == 2 * bs * n
    st.sync()
    left = [i for shard in zip(*_shards(s)) for i in shard]
    assert left == order[2 * bs * n:], "what is left is not the rest of the epoch's order"
    # record_indices: each rank's own, joined by the sync.
    mine = s.get_indices(0, 1)
    s.record_indices(mine)
    st.sync()
    done = set(order[:2 * bs * n]) | set().union(*map(set, hvd.allgather_object(mine)))
    rest = _shards(s)
    assert not done & set().union(*map(set, rest))
    assert set().union(*map(set, rest)) == set(range(size)) - done
    assert len(s) == -(-(size - len(done)) // n)
    s.set_epoch(1)
    assert s.processed_num == 0 and not s.processed_indices and len(s) == size // n


def test_distributed_optimizer_across_a_reset():
    """The optimizer is built once, before the reset (as Horovod's elastic scripts do); the
    reset comes with its gradients in flight (backward done, no step); afterwards zero_grad
    and step work and average in the new job."""
    r, n = rank_size()
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1.0),
                                   named_parameters=model.named_parameters())
    model(torch.ones(1, 2)).sum().backward()    # the hook enqueues; nobody waits
    # Every rank's hook has enqueued before any rank resets: a rank whose peer's engine has
    # already stopped is refused at enqueue instead (a peer's stop is news at once).
    hvd.barrier()
    khor.elastic.reset()
    opt.zero_grad()
    x = torch.full((1, 2), float(r + 1))
    model(x).sum().backward()
    opt.step()
    mean = sum(k + 1 for k in range(n)) / n
    assert model.weight.detach().tolist() == [[1.0 - mean, 1.0 - mean]]


def test_elastic_attribute_and_alias():
    assert hvd.elastic.run is khor.elastic.run
    assert hvd.HostsUpdatedInterrupt is khor.elastic.HostsUpdatedInterrupt
    compat = os.path.join(os.path.dirname(os.path.dirname(khor.__file__)), "horovod_compat")
    if compat not in sys.path:
        sys.path.insert(0, compat)
    import horovod
    if not getattr(horovod, "__khor__", False):
        pytest.skip("a real Horovod is installed")
    import horovod.torch as ahvd
    import horovod.torch.elastic as ael
    from horovod.torch.elastic.sampler import ElasticSampler
    from horovod.torch.elastic.state import TorchState
    assert ahvd.elastic.run is ael.run is khor.elastic.run
    assert ael.TorchState is TorchState is hvd.elastic.TorchState
    assert ElasticSampler is hvd.elastic.ElasticSampler
    assert ahvd.HorovodInternalError is khor.HorovodInternalError
