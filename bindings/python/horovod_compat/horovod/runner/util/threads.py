"""horovod.runner.util.threads: the thread helpers Horovod's own test utilities import
(test/utils/common.py's `delay` uses in_thread), so that Horovod's test files run unchanged
against the alias."""

import threading

__all__ = ["in_thread", "on_event"]


def _check_args(args):
    if not isinstance(args, tuple):
        raise ValueError("args must be a tuple (for one argument: (arg,)), not %s" % type(args))


def in_thread(target, args=(), name=None, daemon=True, silent=False):
    """Starts target(*args) in a new thread and returns the thread. silent: an exception of
    target's is swallowed (otherwise threading reports it)."""
    _check_args(args)
    body = target
    if silent:
        def body(*a):
            try:
                target(*a)
            except BaseException:
                pass
    t = threading.Thread(target=body, args=args, name=name, daemon=daemon)
    t.start()
    return t


def on_event(event, func, args=(), stop=None, check_stop_interval_s=1.0, daemon=True,
             silent=False):
    """Calls func(*args) in a new thread once event is set, unless the stop event is set
    first (looked at every check_stop_interval_s). Returns the thread."""
    if event is None:
        raise ValueError("on_event: event must not be None")
    _check_args(args)
    if stop is None:
        if not daemon:
            raise ValueError("on_event: a thread that is not a daemon needs a stop event")

        def wait():
            event.wait()
            func(*args)
    else:
        def wait():
            while not event.is_set() and not stop.is_set():
                event.wait(check_stop_interval_s)
            if not stop.is_set():
                func(*args)
    return in_thread(wait, daemon=daemon, silent=silent)
