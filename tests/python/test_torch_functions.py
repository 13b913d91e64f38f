"""khor.torch's helpers: broadcast_parameters (a state_dict and named_parameters, from each
root), broadcast_optimizer_state (state and hyper-parameters, onto ranks with empty state),
broadcast_object and allgather_object."""

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import assert_tensor, rank_size  # noqa: E402


def make_model(k):
    torch.manual_seed(100 + k)
    m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5),
                            torch.nn.Linear(5, 2))
    with torch.no_grad():
        m[1].running_mean.fill_(k)
        m[1].num_batches_tracked.fill_(k)
    return m


@pytest.mark.parametrize("what", ["state_dict", "named_parameters"])
def test_broadcast_parameters_each_root(what):
    r, n = rank_size()
    results = []
    for root in range(n):
        m = make_model(r)
        if what == "state_dict":
            hvd.broadcast_parameters(m.state_dict(), root_rank=root)
        else:
            hvd.broadcast_parameters(m.named_parameters(), root_rank=root)
        results.append((root, m))
    for root, m in results:
        want = make_model(root)
        mine = make_model(r)
        for (name, t), (_, w), (_, own) in zip(m.state_dict().items(),
                                               want.state_dict().items(),
                                               mine.state_dict().items()):
            is_param = not name.startswith("1.running") and "num_batches" not in name
            expect = w if (what == "state_dict" or is_param) else own
            assert_tensor(t, expect, "root %d %s %s" % (root, what, name))


def test_broadcast_parameters_rejects_what_is_no_tensor():
    """Plain tensors are taken, as Horovod's (test_torch_horovod_semantics); a list entry
    that is no tensor, or one tensor alone, is refused before anything is enqueued."""
    with pytest.raises(ValueError):
        hvd.broadcast_parameters([("w", [1.0, 2.0])], root_rank=0)
    with pytest.raises(ValueError):
        hvd.broadcast_parameters(torch.ones(2), root_rank=0)


def make_optimizer(k, kind):
    m = make_model(0)
    if kind == "sgd":
        opt = torch.optim.SGD(m.parameters(), lr=0.1 * (k + 1), momentum=0.9)
    else:
        opt = torch.optim.Adam(m.parameters(), lr=0.01 * (k + 1), betas=(0.8, 0.99))
    if k == 0:                       # only the root has stepped: the others' state is empty
        torch.manual_seed(7)
        for _ in range(2):
            opt.zero_grad()
            m(torch.randn(3, 4)).sum().backward()
            opt.step()
    return m, opt


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_broadcast_optimizer_state(kind):
    r, n = rank_size()
    _, opt = make_optimizer(r, kind)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    _, ref = make_optimizer(0, kind)
    got, want = opt.state_dict(), ref.state_dict()
    assert [{k: v for k, v in g.items() if k != "params"} for g in got["param_groups"]] == \
        [{k: v for k, v in g.items() if k != "params"} for g in want["param_groups"]]
    assert sorted(got["state"]) == sorted(want["state"]) and len(want["state"]) > 0
    for pid in want["state"]:
        for key, v in want["state"][pid].items():
            g = got["state"][pid][key]
            if isinstance(v, torch.Tensor):
                assert_tensor(g, v, "state %s %s" % (pid, key))
            else:
                assert g == v


@pytest.mark.parametrize("root", ["first", "last"])
def test_broadcast_object(root):
    r, n = rank_size()
    root_rank = 0 if root == "first" else n - 1

    def obj(k):
        return {"rank": k, "list": list(range(k + 3)), "text": "x" * (10 * k),
                "tensor": torch.arange(k + 2), ("t", k): None}
    got = hvd.broadcast_object(obj(r), root_rank=root_rank)
    want = obj(root_rank)
    assert got.keys() == want.keys()
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert torch.equal(got[key], want[key])
        else:
            assert got[key] == want[key]
    assert hvd.broadcast_object(None if r else 42) == 42       # root 0 by default


def test_allgather_object():
    r, n = rank_size()

    def obj(k):
        d = {"metric": k * 1.5, "name": "rank%d" % k}
        if k == 1:
            d["extra"] = list(range(100))
        return d
    assert hvd.allgather_object(obj(r)) == [obj(k) for k in range(n)]
    assert hvd.allgather_object(r, name="ints") == list(range(n))
