"""khor.torch.init / shutdown: 100 cycles in one process, each with a working allreduce,
leaking neither file descriptors nor threads; what calls do while shut down; init again is
a no-op; init(process_sets=[...]) registers the sets at once."""

import os

import pytest

torch = pytest.importorskip("torch", reason="khor.torch needs torch")

import khor.torch as hvd  # noqa: E402
from khortest import even_odd_ranks  # noqa: E402


def _fds():
    return len(os.listdir("/proc/self/fd"))


def _threads():
    return len(os.listdir("/proc/self/task"))


def test_100_init_shutdown_cycles():
    r, n = hvd.rank(), hvd.size()
    bad, fds, threads = [], [], []
    for i in range(100):
        hvd.shutdown()
        if hvd.is_initialized():
            bad.append((i, "initialized after shutdown"))
        hvd.init()
        if (hvd.rank(), hvd.size()) != (r, n):
            bad.append((i, "rank/size", hvd.rank(), hvd.size()))
        out = hvd.allreduce(torch.full((2,), float(i + r)), op=hvd.Sum, name="cycle")
        want = float(n * i + n * (n - 1) // 2)
        if out.tolist() != [want, want]:
            bad.append((i, out.tolist(), want))
        fds.append(_fds())
        threads.append(_threads())
    # Resources held must not grow with the cycles (a lone descriptor may come and go; the
    # engine's thread may already have ended when a peer's shutdown reached it first).
    if max(fds[50:]) > min(fds[:10]) + 2 or max(threads[50:]) > max(threads[:10]):
        bad.append(("fds", fds[:3], fds[-3:], "threads", threads[:3], threads[-3:]))
    everyone = hvd.allgather_object((r, bad))            # all ranks pass or fail alike
    assert hvd.is_initialized()
    assert all(not b for _, b in everyone), [e for e in everyone if e[1]]


def test_calls_while_shut_down():
    hvd.shutdown()
    hvd.shutdown()                              # twice is fine
    with pytest.raises(ValueError, match="init"):
        hvd.rank()
    with pytest.raises(ValueError, match="init"):
        hvd.allreduce(torch.ones(1))
    with pytest.raises(ValueError, match="init"):
        hvd.barrier()
    hvd.init()
    hvd.init()                                  # a no-op when joined
    assert hvd.is_initialized()


def test_init_with_process_sets():
    r, n = hvd.rank(), hvd.size()
    if n < 2:
        pytest.skip("needs two ranks")
    even, odd = even_odd_ranks(n)
    es, os_ = hvd.ProcessSet(even), hvd.ProcessSet(odd)
    hvd.shutdown()
    hvd.init(process_sets=[es, os_])
    mine = es if r % 2 == 0 else os_
    out = hvd.allreduce(torch.full((1,), float(r)), op=hvd.Sum, process_set=mine)
    ids = (es.process_set_id, os_.process_set_id)
    hvd.shutdown()
    assert es.process_set_id is None and os_.process_set_id is None    # gone with the job
    hvd.init()
    with pytest.raises(ValueError):
        hvd.allreduce(torch.ones(1), process_set=mine)
    assert None not in ids and len(set(ids)) == 2
    assert out.item() == float(sum(even if r % 2 == 0 else odd))
