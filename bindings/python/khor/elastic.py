"""khor.elastic: Horovod's elastic API without a framework (``horovod.common.elastic``).

A script keeps its training state in a State, commits it every few batches and runs its
training function under ``run``:

    state = khor.elastic.ObjectState(epoch=0, batch=0)

    @khor.elastic.run
    def train(state):
        while state.epoch < 10:
            ...                      # collectives
            state.batch += 1
            state.commit()           # saves, then asks whether hosts changed

    train(state)

``run`` syncs the state from rank 0, then calls the function. When a collective fails
because the job lost a rank (HorovodInternalError) it restores the last commit; when the
driver added or removed hosts (HostsUpdatedInterrupt, raised by commit) it keeps the state
as it is. Either way it resets (shutdown, init: the worker joins the job's next generation,
with its new rank and size; the process sets registered before are registered again), runs
the reset callbacks and loops. A worker that init finds out of the job leaves with exit
status 0 (WorkerRemoved). The driver side is khorrun's elastic mode (docs/ELASTIC.md).
"""

import functools
import pickle

from . import _core
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt, WorkerRemoved

# khor_hosts_updated's bits.
HOSTS_ADDED = 1
HOSTS_REMOVED = 2

_ROOT_NAME = "khor.elastic.sync_root"

# The rank whose state the next sync hands to the others (sync_root()).
_sync_root = 0


def sync_root():
    """The rank a State's sync broadcasts from: rank 0 of the first generation, and after a
    reset the lowest rank that held the state before it. A worker started in a lost one's
    place may be rank 0 of the new generation (its slot's local rank stays), and must then
    receive the state, not hand out its fresh one."""
    return _sync_root


def _choose_root(state):
    """Sets sync_root(); True when some rank of this generation has no state (a worker that
    joined fresh). Every rank of a generation calls it before anything else, so a fresh
    worker's first collective always has its match."""
    global _sync_root
    size = _core.size()
    mine = _core.rank() if state._has_state else size
    seen = state._seen_state
    if not seen and not state._has_state and _core.is_elastic() and _core.generation() > 1:
        # A worker that never saw the state asks the job's record whether some worker held
        # it: a generation of only such workers (every holder lost before the first
        # collective of the generation that would have shown them one) must not start over.
        seen = _core.elastic_state(False) > 0
    root, has, unseen = _core.allreduce_ints(
        [mine, 1 if state._has_state else 0, 0 if seen else 1], _core.Min, _ROOT_NAME)
    if root >= size and unseen == 0:
        # Some rank took part in a generation that had the state, and every rank that held
        # it is gone (the last one killed inside a newcomer's sync, say): going on would
        # start the training over from its first step, silently.
        raise RuntimeError("khor.elastic: no rank of generation %d holds the training state "
                           "any more (every rank that held it was lost); the job cannot go "
                           "on from its last commit" % _core.generation())
    state._seen_state = state._seen_state or root < size
    _sync_root = 0 if root >= size else root
    return has == 0


def broadcast_object(obj, root_rank=0, name=None):
    """obj of root_rank, pickled, on every rank (the framework-free State's default)."""
    name = name or "khor.elastic.broadcast_object"
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if _core.rank() == root_rank else b""
    data = _core.broadcast_bytes(data, root_rank, name)
    return obj if _core.rank() == root_rank else pickle.loads(data)


class _HostMessages:
    """State._host_messages. In Horovod a queue that the driver's notifications fill; here
    the driver's word is this generation's khor_hosts_updated, read locally, so empty() is
    False from the moment this rank's heartbeat has seen an update that check_host_updates
    has not yet acted on."""

    def __init__(self, state):
        self._state = state

    def empty(self):
        return self.qsize() == 0

    def qsize(self):
        return 1 if self._state._local_update() else 0


class State:
    """Training state that survives a reset: save() keeps a copy in host memory, restore()
    goes back to it, sync() makes every rank's equal rank 0's. bcast_object(obj) and
    get_rank() default to khor's; Horovod's frameworks pass their own."""

    def __init__(self, bcast_object=None, get_rank=None):
        self._bcast_object = bcast_object or broadcast_object
        self._rank = get_rank or _core.rank
        self._host_messages = _HostMessages(self)
        # The generation whose host update this state last raised for (Horovod: the time
        # of the driver's last notification); 0 raises for the current one again.
        self._last_updated_timestamp = 0
        self._reset_callbacks = []
        # Whether this process holds the job's state: it synced or committed before; and
        # whether it has been in a generation where some rank held it.
        self._has_state = False
        self._seen_state = False

    def register_reset_callbacks(self, callbacks):
        """Functions to call after each reset, once init has joined the new generation
        and before the state is synced (e.g. to scale the learning rate to the new size)."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = _HostMessages(self)
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self):
        """Saves the state, then raises HostsUpdatedInterrupt if the hosts changed. A
        commit copies the state, so committing every few batches trades the steps lost to
        a failure against the time the copies take."""
        self.save()
        self._has_state = True
        self.check_host_updates()

    def _local_update(self):
        """This rank's news of hosts not yet acted on: khor_hosts_updated's bits."""
        if _core.generation() <= self._last_updated_timestamp:
            return 0
        return _core.hosts_updated()

    def check_host_updates(self):
        """Raises HostsUpdatedInterrupt on every rank at the same step when the driver has
        added or removed hosts (one 3-int allreduce: every rank's news, taken together,
        straight on the world comm: every rank commits at the same step of its program)."""
        bits = self._local_update()
        mine = [1 if bits & HOSTS_ADDED else 0, 1 if bits & HOSTS_REMOVED else 0,
                _core.generation() if bits else 0]
        added, removed, gen = _core.world_allreduce_ints(mine, _core.Max)
        if added or removed:
            self._last_updated_timestamp = gen
            raise HostsUpdatedInterrupt(skip_sync=not added)

    def save(self):
        """Saves the state to host memory."""
        raise NotImplementedError()

    def restore(self):
        """Goes back to the last saved state, undoing what changed since."""
        raise NotImplementedError()

    def sync(self):
        """Makes every rank's state sync_root()'s (rank 0's, unless a reset made a worker
        without the state rank 0)."""
        raise NotImplementedError()

    def reset(self):
        """Adjusts what depends on the job's ranks after a reset (before the sync)."""


class ObjectState(State):
    """State of plain Python objects, given as keyword arguments and kept as attributes."""

    def __init__(self, bcast_object=None, get_rank=None, **kwargs):
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self):
        self._saved_state = {k: getattr(self, k) for k in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            root = sync_root()
            self._saved_state = (self._bcast_object(self._saved_state) if root == 0 else
                                 self._bcast_object(self._saved_state, root))
            self._set_attrs()

    def _set_attrs(self):
        for k, v in self._saved_state.items():
            setattr(self, k, v)


def run_fn(func, reset):
    """func(state, ...) under Horovod's elastic loop, reset() being the framework's."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        skip_sync = False
        while True:
            try:
                # A removal-only update skips the sync, unless the generation joined has a
                # worker without the state after all: hosts added while the survivors
                # waited (below --min-np, say) brought fresh workers, which sync.
                if _choose_root(state) or not skip_sync:
                    state.sync()
                    if not state._has_state and _core.is_elastic():
                        _core.elastic_state(True)  # the job's record (el/held)
                    state._has_state = True
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                if not _core.is_elastic():
                    raise       # a fixed job has no next generation to join
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as e:
                skip_sync = e.skip_sync
            if not _reset_until_joined(reset):
                skip_sync = False   # that generation failed too: who is in the next is new
            state.on_reset()
    return wrapper


def _reset_until_joined(reset):
    """reset() until a generation forms around this worker: one that fails while the
    survivors register their process sets again (another loss) is left for the next one.
    False when it took more than one."""
    first = True
    while True:
        try:
            reset()
            return first
        except HorovodInternalError:
            if not _core.is_elastic():
                raise
            first = False


def reset():
    """Leaves the generation and joins the next one: shutdown, init (WorkerRemoved, a
    SystemExit(0), when this worker is out of the job), then the process sets again."""
    _core.shutdown()
    _core.init()
    _core.restore_process_sets()


def run(func):
    """Runs func(state, ...) until it returns, through failures and host changes (see the
    module's text). The function must start with no collective of its own before the
    state's sync: a worker that joins runs only that sync to catch up."""
    return run_fn(func, reset)


__all__ = ["State", "ObjectState", "run", "run_fn", "reset", "broadcast_object", "sync_root",
           "HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved"]
