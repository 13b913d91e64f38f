"""horovod.tensorflow.compression is khor.tensorflow.compression."""

from khor.tensorflow.compression import (Compression, Compressor, FP16Compressor,  # noqa: F401
                                         NoneCompressor)
