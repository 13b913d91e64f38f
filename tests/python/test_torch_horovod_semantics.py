"""khor.torch where it must do what Horovod 0.28.1 does (khor issue 27, point 3), each
checked against the values Horovod's own test_torch.py expects: reducescatter's gradient
and the grouped gradients, pre/postscale on integers, alltoall's return and argument
errors, cloudpickled objects, broadcast_parameters of plain tensors and
broadcast_optimizer_state's init step, init(comm=ranks) and "dynamic", a local
is_homogeneous, process sets added while the engine works, sparse gradients, the build
queries, the horovod.* alias modules, shutdown at exit, and a DistributedOptimizer on a
rank outside its process set."""

import os
import subprocess
import sys
import tempfile
import threading
import time

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khor import _core, _lib  # noqa: E402
from khortest import rank_size  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMPAT = os.path.join(ROOT, "bindings", "python", "horovod_compat")


def needs2():
    if hvd.size() < 2:
        pytest.skip("needs two ranks")


# ---- gradients -------------------------------------------------------------------------------

@pytest.mark.parametrize("op,pre,post", [("sum", 1.0, 1.0), ("average", 1.0, 1.0),
                                         ("sum", 0.5, 3.0), ("average", 2.0, 0.25)])
def test_reducescatter_grad_as_horovod(op, pre, post):
    """Horovod's backward: allgather of the gradient times size (Sum only), prescale and
    postscale: test_horovod_reducescatter_grad expects size * ones for Sum."""
    r, n = rank_size()
    x = torch.ones(2 * n, 3, dtype=torch.float64, requires_grad=True)
    y = hvd.reducescatter(x, op=hvd.Sum if op == "sum" else hvd.Average,
                          prescale_factor=pre, postscale_factor=post)
    y.backward(torch.ones_like(y))
    want = (n if op == "sum" else 1) * pre * post
    assert torch.equal(x.grad, torch.full_like(x, want)), x.grad


def test_grouped_reducescatter_and_allgather_grads():
    r, n = rank_size()
    xs = [torch.full((2 * n, 2), float(k + 1), requires_grad=True) for k in range(3)]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    sum(y.sum() for y in ys).backward()
    for x in xs:
        assert torch.equal(x.grad, torch.full_like(x, float(n)))
    # grouped_allgather: every rank's gradient averaged, this rank's rows of it
    gs = [torch.full((r + 1, 2), 1.0, requires_grad=True), torch.ones(2, requires_grad=True)]
    outs = hvd.grouped_allgather(gs)
    assert [o.shape[0] for o in outs] == [n * (n + 1) // 2, 2 * n]
    (outs[0] * 2).sum().backward(retain_graph=True)
    (outs[1] * 3).sum().backward()
    assert torch.equal(gs[0].grad, torch.full_like(gs[0], 2.0))
    assert torch.equal(gs[1].grad, torch.full_like(gs[1], 3.0))


# ---- integer scaling --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_integer_prescale_postscale(dtype):
    """Horovod scales integers in float64 and truncates back (test_horovod_allreduce_prescale:
    (factor * t).type(dtype) * size; _postscale: (size * t * factor).type(dtype))."""
    r, n = rank_size()
    t = (torch.arange(-8, 9, dtype=torch.float64) * 7).to(dtype)
    f = 0.37
    pre = hvd.allreduce(t, op=hvd.Sum, prescale_factor=f)
    assert pre.dtype == dtype
    assert torch.equal(pre, (t.double() * f).to(dtype) * n)
    post = hvd.allreduce(t, op=hvd.Sum, postscale_factor=f)
    assert torch.equal(post, (t.double() * n * f).to(dtype))
    avg = hvd.allreduce(t, op=hvd.Average, postscale_factor=2.0)
    assert torch.equal(avg, (t.double() * n * 2.0 / n).to(dtype))
    inplace = t.clone()
    hvd.allreduce_(inplace, op=hvd.Sum, prescale_factor=f)
    assert torch.equal(inplace, pre)
    rows = (torch.arange(4 * n * 3, dtype=torch.float64).reshape(4 * n, 3) - 5).to(dtype)
    rs = hvd.reducescatter(rows, op=hvd.Sum, prescale_factor=f)
    assert torch.equal(rs, ((rows.double() * f).to(dtype) * n)[r * 4:(r + 1) * 4])
    grs = hvd.grouped_reducescatter([rows, rows], op=hvd.Sum, postscale_factor=f)
    for g in grs:
        assert torch.equal(g, (rows.double() * n * f).to(dtype)[r * 4:(r + 1) * 4])


# ---- alltoall ---------------------------------------------------------------------------------

def test_alltoall_returns_as_horovod():
    r, n = rank_size()
    t = torch.arange(2 * n, dtype=torch.float32) + 100 * r
    out = hvd.alltoall(t)
    assert isinstance(out, torch.Tensor)
    want = torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * k
                      for k in range(n)])
    assert torch.equal(out, want)
    out2, rsplits = hvd.alltoall(t, splits=torch.full((n,), 2, dtype=torch.int32))
    assert torch.equal(out2, want) and rsplits.tolist() == [2] * n
    out3, _ = hvd.synchronize(hvd.alltoall_async(t))       # the async form: both
    assert torch.equal(out3, want)


def test_alltoall_argument_errors_are_value_errors():
    r, n = rank_size()
    needs2()
    with pytest.raises(ValueError, match="divide"):
        hvd.alltoall(torch.empty(n + 1))
    with pytest.raises(ValueError, match="rows"):
        hvd.alltoall(torch.empty(n - 1), torch.ones(n, dtype=torch.int32))
    with pytest.raises(ValueError, match="32-bit"):
        hvd.alltoall(torch.empty(n), torch.empty(n, dtype=torch.float32))
    # nothing was enqueued: the next alltoall of the set runs
    assert hvd.alltoall(torch.ones(n)).tolist() == [1.0] * n


# ---- objects and broadcasts ---------------------------------------------------------------------

def test_objects_through_cloudpickle():
    r, n = rank_size()

    class Local:                           # a class defined in a function: pickle cannot
        def __init__(self, v):
            self.v = v

    obj = (lambda x: x * 10 + 1, Local(5)) if r == 0 else None
    fn, loc = hvd.broadcast_object(obj, root_rank=0)
    assert fn(4) == 41 and loc.v == 5 and type(loc).__name__ == "Local"
    got = hvd.allgather_object(lambda k=r: k + 1000)
    assert [g() for g in got] == [k + 1000 for k in range(n)]


def test_broadcast_parameters_plain_tensors_and_pairs():
    r, n = rank_size()
    ts = [torch.full((3,), float(r)), torch.full((2, 2), float(r + 10))]
    hvd.broadcast_parameters(ts, root_rank=0)
    assert torch.equal(ts[0], torch.zeros(3)) and torch.equal(ts[1], torch.full((2, 2), 10.0))
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(r)
    hvd.broadcast_parameters(list(model.parameters()), root_rank=n - 1)
    assert torch.equal(model.weight, torch.full_like(model.weight, n - 1))
    with torch.no_grad():
        model.weight.fill_(r)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    assert torch.equal(model.weight, torch.zeros_like(model.weight))
    with pytest.raises(ValueError):
        hvd.broadcast_parameters(torch.ones(2), root_rank=0)


def test_broadcast_optimizer_state_no_grad_and_init_step():
    """Horovod's test_horovod_broadcast_state_no_grad, plus: the init step leaves the
    gradients as zeros and makes the state, but does not move the parameters."""
    r, n = rank_size()

    class ModelNoGrad(torch.nn.Module):
        def __init__(self, a, b):
            super().__init__()
            self.a = torch.nn.Parameter(a.int(), requires_grad=False)
            self.b = torch.nn.Parameter(b)

        def forward(self, x):
            return torch.index_select(self.b, 0, self.a.long()) * x

    model = ModelNoGrad(torch.Tensor([1, 3]), torch.rand(4))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, weight_decay=1e-6, momentum=0.9,
                          nesterov=True)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    before = model.b.detach().clone()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    grad = opt.param_groups[0]["params"][1].grad
    assert opt.param_groups[0]["params"][0].grad is None
    assert torch.equal(grad, torch.zeros(4))
    assert torch.equal(hvd.broadcast(grad, root_rank=0), grad)
    assert torch.equal(model.b.detach(), before)
    assert len(opt.state_dict()["state"]) == 1        # the momentum buffer of b
    # options come from the root, with the model= argument of Horovod's signature
    for g in opt.param_groups:
        g["lr"] = 0.5 + r
    hvd.broadcast_optimizer_state(opt, 0, model)
    assert opt.param_groups[0]["lr"] == 0.5


# ---- init ---------------------------------------------------------------------------------------

def test_init_comm_list_of_ranks_and_dynamic():
    r, n = rank_size()
    needs2()
    hvd.shutdown()
    if r == 0:
        hvd.init(comm=[0])
        assert (hvd.rank(), hvd.size()) == (0, 1)
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [1.0, 1.0]
        hvd.shutdown()
    else:
        with pytest.raises(ValueError, match="not in the list"):
            hvd.init(comm=[0])
        assert not hvd.is_initialized()
    with pytest.raises(ValueError, match="communicator"):
        hvd.init(comm=object())
    # the last ranks first: renumbered in list order
    hvd.init(comm=list(range(n - 1, -1, -1)))
    assert hvd.rank() == n - 1 - r and hvd.size() == n
    got = hvd.allgather(torch.tensor([r]))
    assert got.tolist() == list(range(n - 1, -1, -1))
    hvd.shutdown()
    hvd.init(process_sets="dynamic")
    ps = hvd.add_process_set([0])
    if r == 0:
        assert hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item() == 1.0
    hvd.remove_process_set(ps)


def test_is_homogeneous_is_local():
    """One rank alone asks: no collective, so it answers at once (the old allreduce on the
    world comm waited for a peer that never came)."""
    r, n = rank_size()
    t0 = time.monotonic()
    if r == 0:
        answers = {hvd.is_homogeneous() for _ in range(5)}
        assert answers == {True}         # khorrun -np N on one host
    assert time.monotonic() - t0 < 5.0


def test_add_process_set_while_engine_busy():
    """add_process_set with allreduces in flight on the global set and a second thread
    enqueueing more: nothing of it runs on the world comm from the caller's thread, so
    the engine's negotiation there is not raced; every result is right."""
    r, n = rank_size()
    errors, results = [], []

    def pump():
        k = 0
        try:
            while k < 200:
                h = hvd.allreduce_async(torch.full((64,), float(r)), name="busy.%d" % k,
                                        op=hvd.Sum)
                results.append(hvd.synchronize(h)[0].item())
                k += 1
        except Exception as e:  # reported below, on this rank
            errors.append(e)
    # the same number of allreduces on every rank: stop by count, not by time
    th = threading.Thread(target=pump)
    th.start()
    sets = [hvd.add_process_set([k]) for k in range(n)]
    mine = sets[r]
    out = hvd.allreduce(torch.ones(3), op=hvd.Sum, process_set=mine)
    th.join(60)
    ids = {ps.process_set_id for ps in sets}
    for ps in sets:
        hvd.remove_process_set(ps)
    assert not errors, errors
    assert len(ids) == n and None not in ids and 0 not in ids
    assert out.tolist() == [1.0] * 3
    assert results == [float(sum(range(n)))] * 200


# ---- sparse -------------------------------------------------------------------------------------

def test_sparse_allreduce_async_matches_dense():
    r, n = rank_size()
    g = torch.Generator().manual_seed(7 + r)
    dense = torch.rand(13, 4, generator=g)
    dense[dense < 0.7] = 0
    want = hvd.allreduce(dense, op=hvd.Average)
    got = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp.avg", op=hvd.Average)()
    assert got.is_sparse
    torch.testing.assert_close(got.to_dense(), want)
    gsum = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp.sum", op=hvd.Sum)()
    torch.testing.assert_close(gsum.to_dense(), want * n)


@pytest.mark.parametrize("sparse_as_dense", [False, True])
def test_sparse_embedding_gradients(sparse_as_dense):
    """Horovod's test_sparse_embeddings, checked: every rank ends with the average of the
    ranks' sparse gradients, still sparse (SparseAdam takes no other)."""
    r, n = rank_size()
    torch.manual_seed(0)
    emb = torch.nn.Embedding(10, 3, sparse=True)
    inp = torch.LongTensor([[1, 2, 4, 5], [4, 3, 2, 9]]) if r == 0 else \
        torch.LongTensor([[1, 3, 4], [4, 7, 9]])
    opt = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                   named_parameters=emb.named_parameters(),
                                   sparse_as_dense=sparse_as_dense)
    opt.zero_grad()
    emb(inp).sum().backward()
    local = emb.weight.grad.to_dense().clone()
    opt.synchronize()
    assert emb.weight.grad.is_sparse
    want = hvd.allreduce(local, op=hvd.Average, name="sp.emb.check.%d" % sparse_as_dense)
    torch.testing.assert_close(emb.weight.grad.to_dense(), want)
    with opt.skip_synchronize():
        opt.step()


# ---- the optimizer outside its set --------------------------------------------------------------

def test_optimizer_outside_its_process_set():
    """A rank outside the optimizer's set registers no hooks and allreduces nothing: its
    step applies its own gradient (Horovod's test_horovod_optimizer_process_sets)."""
    r, n = rank_size()
    needs2()
    first = hvd.add_process_set([0])
    try:
        w = torch.nn.Parameter(torch.zeros(2))
        opt = hvd.DistributedOptimizer(torch.optim.SGD([w], lr=1.0),
                                       named_parameters=[("w", w)], process_set=first)
        (w * float(r + 1)).sum().backward()
        opt.step()
        # rank 0 alone in the set: its own gradient either way; the others never enqueued
        assert torch.equal(w.detach(), torch.full((2,), -float(r + 1)))
        if r != 0:
            assert not opt._handles and not opt._grad_accs
    finally:
        hvd.remove_process_set(first)


# ---- what the library was built with ----------------------------------------------------------

def test_built_queries_tell_the_library():
    info = _lib.build_info()
    if _lib.khor_build_info is None:
        assert info == {}
        assert hvd.nccl_built() == 0 and hvd.cuda_built() is False
    else:
        assert "version" in info
        assert hvd.cuda_built() == (info.get("cuda") == "1")
        assert bool(hvd.nccl_built()) == (info.get("nccl") == "1")
    assert hvd.mpi_built() is False and hvd.gloo_built() is False


def test_horovod_alias_modules_import():
    code = ("import horovod.torch as hvd, horovod.torch.mpi_ops as m, "
            "horovod.common.exceptions as e, horovod.common.util as u, "
            "horovod.common.basics as b\n"
            "assert m.allreduce is hvd.allreduce and m.rank is hvd.rank\n"
            "assert e.HorovodInternalError is hvd.HorovodInternalError\n"
            "assert u.split_list(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]\n"
            "assert b.Sum == hvd.Sum and b.HorovodBasics().mpi_built() is False\n"
            "print('ok')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KHOR_")}
    env["KHOR_LIBRARY_PATH"] = os.path.abspath(_lib.path)
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(COMPAT), COMPAT])
    p = subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    assert p.returncode == 0 and "ok" in p.stdout, p.stdout


# ---- shutdown at exit ---------------------------------------------------------------------------

SCRIPT = """
import sys, torch
import khor.torch as hvd
hvd.init()
hvd.start_timeline(sys.argv[1] + '.%d' % hvd.rank())
hvd.allreduce(torch.ones(4), name='atexit.t')
if hvd.rank() == 1:
    import time; time.sleep(1)       # rank 0 leaves first
print('rank', hvd.rank(), 'done')
"""


def _wait_barrier(deadline_s):
    h = _core.enqueue_barrier(hvd.global_process_set)
    end = time.time() + deadline_s
    while not hvd.poll(h) and time.time() < end:
        time.sleep(0.05)
    hvd.synchronize(h)


def test_script_without_shutdown_leaves_cleanly():
    """A script that never calls shutdown(): atexit does, so the peer logs no error about
    rank 0 dying and rank 0's timeline file is complete JSON."""
    import json
    result = None
    if hvd.rank() == 0:
        khorrun = os.environ.get("KHOR_KHORRUN", os.path.join(ROOT, "build", "khorrun"))
        tmp = tempfile.mkdtemp(prefix="khor-atexit-")
        path = os.path.join(tmp, "script.py")
        with open(path, "w") as f:
            f.write(SCRIPT)
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KHOR_") or k in ("KHOR_LIBRARY_PATH", "KHOR_TIMEOUT")}
        env["KHOR_LIBRARY_PATH"] = os.path.abspath(_lib.path)
        env["PYTHONPATH"] = os.path.join(ROOT, "bindings", "python")
        tl = os.path.join(tmp, "timeline.json")
        try:
            p = subprocess.run([khorrun, "-np", "2", sys.executable, path, tl], cwd=tmp,
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, timeout=120)
            timelines = []                 # rank 0 writes it (the coordinator, as Horovod)
            try:
                with open(tl + ".0") as f:
                    timelines.append(f.read())
            except OSError as e:
                timelines.append("missing: %s" % e)
            result = (p.returncode, p.stdout[-3000:], timelines)
        except subprocess.TimeoutExpired as e:
            result = (-1, "timed out: %s" % (e.stdout or "")[-3000:], [])
    _wait_barrier(150)
    rc, out, timelines = hvd.broadcast_object(result, root_rank=0, name="atexit.result")
    assert rc == 0, out
    assert "rank 0 done" in out and "rank 1 done" in out, out
    assert "ERROR" not in out and "died" not in out, out
    for t in timelines:
        json.loads(t)                      # closed: the file is whole JSON
        assert "atexit.t" in t, t[:500]


def test_timeline_restarted_into_the_same_path_is_valid_json():
    """start_timeline twice into one path: the first file is closed before the second one
    opens, so the file holds the second timeline alone and stays strict JSON (the old
    stream's closing bracket used to land past the new events)."""
    import json
    path = os.path.join(tempfile.mkdtemp(prefix="khor-tl-"), "timeline.json")
    hvd.start_timeline(path)
    for i in range(30):                 # a first file longer than the second
        hvd.allreduce(torch.ones(2), name="tl.first.%d" % i)
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(2), name="tl.second")
    hvd.stop_timeline()
    if hvd.rank() == 0:                 # without %r only rank 0 writes
        with open(path) as f:
            events = json.load(f)
        assert isinstance(events, list) and events
        assert "tl.second" in json.dumps(events) and "tl.first" not in json.dumps(events)
