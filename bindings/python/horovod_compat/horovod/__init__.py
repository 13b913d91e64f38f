"""horovod: khor under Horovod's name, for scripts that `import horovod.torch as hvd`.

Installed only on request (cmake -DKHOR_INSTALL_HOROVOD_COMPAT=ON), never over a real
Horovod. Everything here is khor's; `horovod.__khor__` tells the two apart.
"""

import khor as _khor

__khor__ = True
__version__ = _khor.__version__
