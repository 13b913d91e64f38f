"""horovod.tensorflow.util is khor.tensorflow.util."""

from khor.tensorflow.util import (_cache, _executing_eagerly, _make_subgraph,  # noqa: F401
                                  refs_to_vars, vars_to_refs)
