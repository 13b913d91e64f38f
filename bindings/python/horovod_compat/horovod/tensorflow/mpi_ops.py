"""horovod.tensorflow.mpi_ops is khor.tensorflow.mpi_ops, with the names Horovod's module also
has (init, rank, size, the built/enabled queries), for scripts that import them from there."""

from khor.tensorflow.mpi_ops import *  # noqa: F401,F403
from khor.tensorflow.mpi_ops import (_allreduce, _grouped_allreduce,  # noqa: F401
                                     _grouped_reducescatter, _normalize_name, _reducescatter,
                                     handle_average_backwards_compatibility)
from khor.tensorflow import (add_process_set, ccl_built, cross_rank, cross_size,  # noqa: F401
                             cuda_built, ddl_built, gloo_built, gloo_enabled, init,
                             is_homogeneous, is_initialized, local_rank, local_size,
                             mpi_built, mpi_enabled, mpi_threads_supported, nccl_built, rank,
                             remove_process_set, rocm_built, shutdown, size, start_timeline,
                             stop_timeline)
