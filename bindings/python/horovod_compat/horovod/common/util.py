"""horovod.common.util: the framework-free helpers of Horovod's that scripts and its test
suite import (same behaviour), over khor."""

import os
from contextlib import contextmanager


def split_list(lst, n):
    """lst in n nearly equal consecutive pieces (Horovod's)."""
    d, r = divmod(len(lst), n)
    return [lst[i * d + min(i, r):(i + 1) * d + min(i + 1, r)] for i in range(n)]


def is_iterable(x):
    try:
        iter(x)
    except TypeError:
        return False
    return True


def num_rank_is_power_2(num_rank):
    return num_rank != 0 and (num_rank & (num_rank - 1)) == 0


@contextmanager
def env(**kwargs):
    """Sets environment variables for the with-block, restoring them after."""
    saved = {k: os.environ.get(k) for k in kwargs}
    os.environ.update({k: str(v) for k, v in kwargs.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def get_average_backwards_compatibility_fun(reduce_ops):
    def impl(op, average):
        if op is not None:
            if average is not None:
                raise ValueError("The op parameter supersedes average. Please provide only "
                                 "one of them.")
            return op
        if average is not None:
            return reduce_ops.Average if average else reduce_ops.Sum
        return reduce_ops.Average
    return impl


def is_version_greater_equal_than(ver, target):
    from packaging import version
    return version.parse(ver) >= version.parse(target)


def _torch():
    import khor.torch
    return khor.torch


def mpi_built(verbose=False):
    return False


def gloo_built(verbose=False):
    return False


def ddl_built(verbose=False):
    return False


def ccl_built(verbose=False):
    return False


def nccl_built(verbose=False):
    return _torch().nccl_built(verbose)


def gpu_available(ext_base_name, verbose=False):
    return _torch().cuda_built(verbose)


def extension_available(ext_base_name, verbose=False):
    """khor has one extension, torch's (the numpy front end needs none)."""
    return ext_base_name.endswith("torch")
