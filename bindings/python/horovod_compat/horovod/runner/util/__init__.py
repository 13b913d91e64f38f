"""horovod.runner.util: see horovod.runner."""
