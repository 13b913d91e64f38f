"""khor.elastic in a fixed job: ObjectState's save, restore and sync; run's loop (sync, then
the function; a HostsUpdatedInterrupt resets the job for real, shutdown and init, and runs
the reset callbacks; a HorovodInternalError in a fixed job is raised, not reset into);
check_host_updates with no update; process sets registered again by a reset; the
framework-free broadcast_object; the alias modules. Runs in a new generation of an elastic
job are in test_elastic_run.py."""

import os
import sys

import pytest

import khor  # noqa: E402
import khor.elastic as el  # noqa: E402
from khor import _lib  # noqa: E402
from khortest import even_odd_ranks, rank_size  # noqa: E402


def _agree(value):
    """Every rank's value, as a list in rank order (pickled over the engine)."""
    return [el.broadcast_object(value, root_rank=k) for k in range(khor.size())]


def test_broadcast_object():
    r, n = rank_size()
    for root in range(n):
        got = el.broadcast_object({"from": root, "pad": b"x" * (root * 1000)} if r == root
                                  else None, root_rank=root, name="t.bo")
        assert got == {"from": root, "pad": b"x" * (root * 1000)}
    assert el.broadcast_object(b"" if r == 0 else b"junk") == b""


def test_object_state_save_restore_sync():
    r, n = rank_size()
    st = el.ObjectState(epoch=10 + r, name="r%d" % r)
    assert (st.epoch, st.name) == (10 + r, "r%d" % r)
    st.sync()                                   # rank 0's everywhere
    assert (st.epoch, st.name) == (10, "r0")
    st.epoch = 20 + r
    st.restore()                                # back to the last save (the sync's)
    assert st.epoch == 10
    st.epoch, st.name = 30 + r, "s%d" % r
    st.save()
    st.epoch = -1
    st.restore()
    assert (st.epoch, st.name) == (30 + r, "s%d" % r)
    st.epoch = 40 + r                           # not saved: sync sends rank 0's saved state
    st.sync()
    assert (st.epoch, st.name) == (30, "s0")


def test_state_base_is_abstract():
    st = el.State()
    for f in (st.save, st.restore, st.sync):
        with pytest.raises(NotImplementedError):
            f()
    st.reset()                                  # nothing to adjust by default


def test_check_host_updates_without_update():
    r, n = rank_size()
    st = el.ObjectState(step=r)
    assert st._host_messages.empty()
    for _ in range(3):
        st.check_host_updates()                 # raises nothing: no host changed
    st._last_updated_timestamp = 0              # what Horovod's test script does
    st.check_host_updates()
    assert st._host_messages.empty()
    st.step = 5 + r
    st.commit()                                 # save + check
    st.step = 0
    st.restore()
    assert st.step == 5 + r
    assert khor.is_initialized() and (khor.rank(), khor.size()) == (r, n)


def test_run_syncs_then_calls_and_returns():
    r, n = rank_size()
    st = el.ObjectState(value=100 + r)
    seen = []

    @el.run
    def train(state, k, extra=None):
        seen.append(state.value)
        return state.value, k, extra

    assert train(st, 5, extra="x") == (100, 5, "x")
    assert seen == [100]
    assert train.__name__ == "train"


def test_run_resets_on_hosts_updated():
    """HostsUpdatedInterrupt on every rank at the same step: run resets the job (a real
    shutdown and init, here of the same fixed job), calls the reset callbacks, and calls the
    function again, syncing first unless skip_sync."""
    r, n = rank_size()
    for skip in (False, True):
        st = el.ObjectState(count=0, tag=r)
        log = []
        st.register_reset_callbacks([lambda: log.append(("reset", khor.is_initialized()))])

        @el.run
        def train(state):
            log.append(("call", state.tag))
            state.count += 1
            state.tag = 50 + r
            state.save()
            if state.count == 1:
                raise el.HostsUpdatedInterrupt(skip_sync=skip)
            return state.count

        assert train(st) == 2
        # Without skip_sync the second call starts from rank 0's saved state (tag 50).
        want = [("call", 0), ("reset", True), ("call", (50 + r) if skip else 50)]
        assert log == want
        assert khor.is_initialized() and (khor.rank(), khor.size()) == (r, n)
        assert _agree(r) == list(range(n))     # the new job works


def test_run_in_fixed_job_raises_internal_error():
    """A fixed job has no next generation: run raises HorovodInternalError as it is, without
    restoring or resetting."""
    st = el.ObjectState(x=1)
    resets = []
    st.register_reset_callbacks([lambda: resets.append(1)])

    @el.run
    def train(state):
        state.x = 2
        raise el.HorovodInternalError("rank 1 was lost", _lib.ERR_MEMBERSHIP)

    with pytest.raises(el.HorovodInternalError, match="rank 1 was lost"):
        train(st)
    assert st.x == 2 and resets == []
    assert not khor._core.is_elastic()


def test_reset_registers_process_sets_again():
    r, n = rank_size()
    if n < 2:
        pytest.skip("process sets of even and odd ranks need two ranks")
    np = pytest.importorskip("numpy")
    even, odd = even_odd_ranks(n)
    gone = khor.add_process_set(list(range(n)))
    es = khor.add_process_set(even)
    os_ = khor.add_process_set(khor.ProcessSet(odd))
    khor.remove_process_set(gone)
    el.reset()
    try:
        mine, members = (es, even) if r % 2 == 0 else (os_, odd)
        assert es.process_set_id is not None and os_.process_set_id is not None
        assert gone.process_set_id is None      # removed before the reset: stays removed
        got = khor.allreduce(np.full(2, float(r)), op=khor.Sum, process_set=mine)
        assert got.tolist() == [float(sum(members))] * 2
        ids = _agree((es.process_set_id, os_.process_set_id))
        assert len(set(ids)) == 1, ids
    finally:
        khor.remove_process_set(os_)
        khor.remove_process_set(es)


def test_init_with_dynamic_process_sets():
    khor.shutdown()
    with pytest.raises(ValueError, match="dynamic"):
        khor.init(process_sets="static")
    khor.init(process_sets="dynamic")           # Horovod's word; khor's sets always are
    assert khor.is_initialized()


def test_alias_modules():
    compat = os.path.join(os.path.dirname(os.path.dirname(khor.__file__)), "horovod_compat")
    if compat not in sys.path:
        sys.path.insert(0, compat)
    import horovod
    if not getattr(horovod, "__khor__", False):
        pytest.skip("a real Horovod is installed")
    import horovod.common.elastic as hce
    import horovod.common.exceptions as hex_
    assert hex_.HorovodInternalError is el.HorovodInternalError
    assert hex_.HostsUpdatedInterrupt is el.HostsUpdatedInterrupt
    assert hce.ObjectState is el.ObjectState and hce.run_fn is el.run_fn
