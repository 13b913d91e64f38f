"""horovod.common.basics: the reduction op values and HorovodBasics, over khor's core (no
per-framework C library to load: every method is khor's)."""

from khor import _core
from khor._core import Adasum, Average, Max, Min, Product, Sum  # noqa: F401


class HorovodBasics:
    """Horovod's per-framework wrapper of the C library; here every framework shares
    khor's job, so pkg_path and extension are ignored."""

    def __init__(self, pkg_path=None, *args):
        pass

    def init(self, comm=None, process_sets=None):
        _core.init(comm, process_sets)

    def shutdown(self):
        _core.shutdown()

    def is_initialized(self):
        return _core.is_initialized()

    def size(self):
        return _core.size()

    def local_size(self):
        return _core.local_size()

    def cross_size(self):
        return _core.cross_size()

    def rank(self):
        return _core.rank()

    def local_rank(self):
        return _core.local_rank()

    def cross_rank(self):
        return _core.cross_rank()

    def is_homogeneous(self):
        return _core.is_homogeneous()

    def start_timeline(self, file_path, mark_cycles=False):
        _core.start_timeline(file_path, mark_cycles)

    def stop_timeline(self):
        _core.stop_timeline()

    def mpi_threads_supported(self):
        return False

    def mpi_enabled(self):
        return False

    def mpi_built(self):
        return False

    def gloo_enabled(self):
        return False

    def gloo_built(self):
        return False

    def nccl_built(self):
        import khor.torch
        return khor.torch.nccl_built()

    def ddl_built(self):
        return False

    def ccl_built(self):
        return False

    def cuda_built(self):
        import khor.torch
        return khor.torch.cuda_built()

    def rocm_built(self):
        return False
