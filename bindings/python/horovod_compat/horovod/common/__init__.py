"""horovod.common: the framework-free parts of Horovod's API that scripts import, khor's."""
