"""horovod.keras.callbacks is khor.keras.callbacks."""

from khor.keras.callbacks import *  # noqa: F401,F403
