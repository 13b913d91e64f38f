"""khor.torch: Horovod's torch API over khor (``import khor.torch as hvd``).

Same names, arguments, defaults and exceptions as ``horovod.torch``: init, size, rank, the
collectives (plain, in place, async, grouped), DistributedOptimizer, the broadcast helpers,
SyncBatchNorm, process sets, the timeline and the elastic API (hvd.elastic). Nothing is
compiled: the engine is libkhor's, reached through ctypes. CPU and CUDA tensors (CUDA when
libkhor was built with it: cuda_built()), no Adasum; where khor differs from Horovod on
purpose, README.md's table says so. HOROVOD_* settings (fusion threshold, cycle time, cache capacity, timeline, stall
check, autotune) are read by the engine as aliases of its KHOR_* ones.
"""

from .. import _core
from .._core import (Average, Sum, Adasum, Min, Max, Product, ProcessSet, global_process_set,
                     add_process_set, remove_process_set, is_initialized, rank, size,
                     local_rank, local_size, cross_rank, cross_size, is_homogeneous, poll,
                     start_timeline, stop_timeline)
from .._lib import KhorError
from ..exceptions import HorovodInternalError, HostsUpdatedInterrupt
from . import elastic
from .compression import Compression
from .functions import (allgather_object, broadcast_object, broadcast_optimizer_state,
                        broadcast_parameters)
from .mpi_ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                      allreduce_async_, alltoall, alltoall_async, barrier, broadcast,
                      broadcast_, broadcast_async, broadcast_async_, grouped_allgather,
                      grouped_allgather_async, grouped_allreduce, grouped_allreduce_,
                      grouped_allreduce_async, grouped_allreduce_async_,
                      grouped_reducescatter, grouped_reducescatter_async, join, reducescatter,
                      reducescatter_async, sparse_allreduce_async, synchronize)
from .optimizer import DistributedOptimizer
from .sync_batch_norm import SyncBatchNorm

__version__ = _core._lib.text(_core._lib.khor_version())

def init(comm=None, process_sets=None):
    """Joins the job and starts the engine (Horovod: hvd.init). Safe to call again after
    shutdown(). comm: None, or a list of ranks (the job is those ranks, renumbered in list
    order; a rank outside the list gets ValueError). process_sets: ProcessSets to register
    at once, or "dynamic" (khor's sets always are). shutdown() runs at exit if the script
    does not call it, as Horovod's."""
    _core.init(comm, process_sets)


def shutdown():
    _core.shutdown()


# What this build has, truthfully: no MPI, no Gloo, no DDL, no oneCCL, no ROCm; NCCL and
# CUDA as libkhor was built (khor_build_info; False from a library that cannot say).
def mpi_built(verbose=False):
    return False


def mpi_enabled():
    return False


def mpi_threads_supported():
    return False


def gloo_built(verbose=False):
    return False


def gloo_enabled():
    return False


def nccl_built(verbose=False):
    """Horovod's answer: 0 without NCCL, else a true int (Horovod gives NCCL_VERSION_CODE;
    khor's the nccl_version word of khor_build_info when it has one, else 1)."""
    if not _core._lib.built_with("nccl"):
        return 0
    v = _core._lib.build_info().get("nccl_version", "")
    return int(v) if v.isdigit() else 1


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def cuda_built(verbose=False):
    """True when libkhor was built with CUDA (whether or not this machine has a GPU)."""
    return _core._lib.built_with("cuda")


def rocm_built(verbose=False):
    return False


__all__ = [n for n in dir() if not n.startswith("_")]
