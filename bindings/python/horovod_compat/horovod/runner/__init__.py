"""horovod.runner: khorrun is khor's launcher; only the helpers scripts and tests import from
Horovod's runner package are here (horovod.runner.util.threads)."""
