"""horovod.torch.elastic.sampler is khor.torch.elastic.sampler."""

from khor.torch.elastic.sampler import ElasticSampler  # noqa: F401
