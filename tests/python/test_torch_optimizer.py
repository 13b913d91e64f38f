"""khor.torch.DistributedOptimizer: after backward on each rank's own batch, the gradients
the wrapped optimizer applies must be those of one process running the concatenated batch
(every rank computes that reference locally with a copy of the model), for named and unnamed
parameters, fp16 compression, op=Sum, gradient_predivide_factor, groups / num_groups,
backward_passes_per_step=2, synchronize() + skip_synchronize(), over two steps; plus its
argument checks and guards."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import rand, rank_size  # noqa: E402

BATCH = 4


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = torch.nn.Linear(4, 6)
        self.fc2 = torch.nn.Linear(6, 3)
        self.unused = torch.nn.Linear(2, 2) if unused else None
        self.double()

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


class RecordingSGD(torch.optim.SGD):
    """SGD that records the gradients its step() applies (by parameter id)."""

    def __init__(self, params, lr=0.1):   # DistributedOptimizer re-runs it with params only
        super().__init__(params, lr=lr)
        self.seen = {}

    def step(self, closure=None):
        for g in self.param_groups:
            for p in g["params"]:
                self.seen[id(p)] = p.grad.clone()
        return super().step(closure)


def batch(k, step, micro=0):
    salt = 10 * step + micro
    return rand(k, (BATCH, 4), salt=salt), rand(k, (BATCH, 3), salt=salt + 5)


def loss_fn(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def reference_grads(ref, n, step, micros):
    """The gradients of one process on every rank's batch at once (summed over micros)."""
    ref.zero_grad()
    for m in range(micros):
        xs, ys = zip(*[batch(k, step, m) for k in range(n)])
        loss_fn(ref, torch.cat(xs), torch.cat(ys)).backward()
    return {name: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for name, p in ref.named_parameters()}


CASES = {
    "named": dict(),
    "unnamed": dict(named=False),
    "fp16": dict(compression=hvd.Compression.fp16, tol=2e-3),
    "sum": dict(op=hvd.Sum, scale="n"),
    "predivide": dict(gradient_predivide_factor=2.0),
    "groups_int": dict(groups=2),
    "num_groups": dict(num_groups=2),
    "groups_list": dict(groups="list"),
    "bpps2": dict(backward_passes_per_step=2),
    "unused_param": dict(unused=True),
    "skip_synchronize": dict(skip=True),
}


@pytest.mark.parametrize("case", CASES)
def test_gradients_equal_full_batch(case):
    r, n = rank_size()
    c = dict(CASES[case])
    model = Net(unused=c.pop("unused", False))
    ref = Net(unused=model.unused is not None)
    tol = c.pop("tol", 1e-12)
    scale = float(n) if c.pop("scale", None) == "n" else 1.0
    micros = c.get("backward_passes_per_step", 1)
    skip = c.pop("skip", False)
    if c.pop("named", True):
        c["named_parameters"] = model.named_parameters()
    if c.get("groups") == "list":
        c["groups"] = [[model.fc1.weight, model.fc2.bias], [model.fc1.bias]]  # fc2.weight alone
    base = RecordingSGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        opt = hvd.DistributedOptimizer(base, **c)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1 * scale)
    assert isinstance(opt, torch.optim.SGD)
    got_grads, want_grads, got_params, want_params = [], [], [], []
    for step in range(2):
        opt.zero_grad()
        for m in range(micros):
            x, y = batch(r, step, m)
            loss_fn(model, x, y).backward()
        if skip:
            opt.synchronize()
            got_grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
            with warnings.catch_warnings():
                warnings.simplefilter("error")       # no "step() after synchronize()" warning
                with opt.skip_synchronize():
                    opt.step()
        else:
            opt.step()
            got_grads.append({k: opt.seen[id(p)] for k, p in model.named_parameters()})
        want_grads.append(reference_grads(ref, n, step, micros))
        ref_opt.step()
        got_params.append({k: p.detach().clone() for k, p in model.named_parameters()})
        want_params.append({k: p.detach().clone() for k, p in ref.named_parameters()})
    for step in range(2):
        for name, want in want_grads[step].items():
            got = got_grads[step][name]
            torch.testing.assert_close(got, want * scale, rtol=tol, atol=tol,
                                       msg=lambda m: "step %d grad %s: %s" % (step, name, m))
        for name, want in want_params[step].items():
            torch.testing.assert_close(got_params[step][name], want, rtol=tol, atol=tol,
                                       msg=lambda m: "step %d param %s: %s" % (step, name, m))


def test_step_after_synchronize_warns():
    r, n = rank_size()
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_fn(model, *batch(r, 0)).backward()
    opt.synchronize()
    with pytest.warns(UserWarning, match="skip_synchronize"):
        opt.step()


def test_zero_grad_before_step_is_refused():
    r, n = rank_size()
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_fn(model, *batch(r, 0)).backward()
    with pytest.raises(AssertionError, match="zero_grad"):
        opt.zero_grad()
    opt.synchronize()                        # drains the allreduces backward started
    opt.zero_grad()


def test_too_many_backward_passes_are_refused():
    r, n = rank_size()
    model = Net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_fn(model, *batch(r, 0)).backward()
    with pytest.raises(AssertionError, match="backward_passes_per_step"):
        loss_fn(model, *batch(r, 0)).backward()
    opt.synchronize()


def test_argument_checks():
    model = Net()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(NotImplementedError):
        hvd.DistributedOptimizer(sgd, op=hvd.Adasum)
    with pytest.raises(ValueError):
        hvd.DistributedOptimizer(sgd, op=hvd.Sum, gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="unique"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("a", model.fc1.weight),
                                                        ("a", model.fc1.bias)])
    with pytest.raises(ValueError, match="not named"):
        hvd.DistributedOptimizer(sgd, named_parameters=[("a", model.fc1.weight)])
    with pytest.raises(ValueError, match="once"):
        hvd.DistributedOptimizer(sgd, groups=[[model.fc1.weight], [model.fc1.weight]])


def test_unnamed_parameters_in_several_param_groups():
    """Without named_parameters the automatic names must be unique over all param groups
    (Horovod names them allreduce.noname.<group>.<index>)."""
    r, n = rank_size()
    model, ref = Net(), Net()
    base = torch.optim.SGD([{"params": model.fc1.parameters()},
                            {"params": model.fc2.parameters(), "lr": 0.05}], lr=0.1)
    try:
        opt = hvd.DistributedOptimizer(base)
        err = None
    except ValueError as e:
        opt, err = None, e
    errs = hvd.allgather_object(str(err) if err else None)
    assert errs == [None] * n, errs[0]
    loss_fn(model, *batch(r, 0)).backward()
    opt.synchronize()
    want = reference_grads(ref, n, 0, 1)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want[name], rtol=1e-12, atol=1e-12)


def test_sparse_as_dense():
    r, n = rank_size()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(6, 2, sparse=True).double()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(emb.parameters(), lr=1.0),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=True)
    idx = torch.tensor([r % 6, (r + 2) % 6])
    emb(idx).sum().backward()           # the hook allreduces it densified
    opt.synchronize()
    want = torch.zeros(6, 2, dtype=torch.float64)
    for k in range(n):
        for i in (k % 6, (k + 2) % 6):
            want[i] += 1.0 / n
    assert emb.weight.grad.is_sparse    # put back sparse, as Horovod does
    torch.testing.assert_close(emb.weight.grad.to_dense(), want)
    with opt.skip_synchronize():
        opt.step()
