"""The exceptions of Horovod's elastic API (``horovod.common.exceptions``), as khor raises them.

HorovodInternalError: a collective failed. In a fixed job every failed collective raises it
(Horovod's rule). In an elastic job only the failures that a new generation can cure raise
it: the membership changed, a peer failed or went silent, a link or system call broke
(KHOR_ERR_MEMBERSHIP, REMOTE, TIMEOUT, SYSTEM, PROTOCOL); ``hvd.elastic.run`` then restores
the last commit and resets. A mistake of the script (tensors that differ between ranks, a
name already in flight) raises the plain KhorError there, since running it again in a new
generation would fail the same way.

HostsUpdatedInterrupt: ``state.commit()`` / ``check_host_updates()`` found that the driver
added or removed hosts; ``hvd.elastic.run`` resets without restoring.

WorkerRemoved: ``init`` was told that this worker is out of the job (its host was removed or
blacklisted, or the job is over). It is a SystemExit with status 0: left uncaught, the
worker exits cleanly, which is what the driver expects of it.
"""

from ._lib import KhorError


class HorovodInternalError(KhorError):
    """A collective failed; in an elastic job, one that a reset recovers from."""


class KhorValueError(KhorError, ValueError):
    """The engine refused an enqueue's arguments at once (a name already in flight, a bad
    shape or root): also a ValueError, which is what Horovod raises for these."""


class InvalidArgumentError(HorovodInternalError, KhorValueError):
    """KhorValueError in a fixed job, where every failed collective is also a
    HorovodInternalError (an elastic job raises the plain KhorValueError: running it again in
    a new generation would fail the same way)."""


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed. skip_sync: True when hosts were only removed, so that every
    remaining worker already holds the same state and the reset needs no sync."""

    def __init__(self, skip_sync):
        super().__init__("the job's hosts changed (%s)"
                         % ("removed only" if skip_sync else "added"))
        self.skip_sync = skip_sync


class WorkerRemoved(SystemExit):
    """This worker is no longer part of the elastic job: exit with status 0."""

    def __init__(self, reason):
        super().__init__(0)
        self.reason = reason

    def __str__(self):
        return self.reason


__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt", "WorkerRemoved", "KhorError",
           "KhorValueError", "InvalidArgumentError"]
