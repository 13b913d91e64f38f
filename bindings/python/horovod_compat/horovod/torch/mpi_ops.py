"""horovod.torch.mpi_ops is khor.torch.mpi_ops, with the names Horovod's module also has
(rank, size, init, the ops and the built/enabled queries), for scripts that import them
from there."""

from khor.torch.mpi_ops import *  # noqa: F401,F403
from khor.torch.mpi_ops import (HorovodAllgather, HorovodAllreduce, HorovodAlltoall,  # noqa: F401
                                HorovodBroadcast, HorovodGroupedAllgather,
                                HorovodGroupedAllreduce, HorovodGroupedReducescatter,
                                HorovodReducescatter, handle_average_backwards_compatibility,
                                sparse_allreduce_async)
from khor.torch import (Adasum, Average, Max, Min, Product, ProcessSet, Sum,  # noqa: F401
                        add_process_set, ccl_built, cross_rank, cross_size, cuda_built,
                        ddl_built, global_process_set, gloo_built, gloo_enabled, init,
                        is_homogeneous, is_initialized, local_rank, local_size, mpi_built,
                        mpi_enabled, mpi_threads_supported, nccl_built, poll, rank,
                        remove_process_set, rocm_built, shutdown, size, start_timeline,
                        stop_timeline)
