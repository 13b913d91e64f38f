"""examples/python/train_cnn.py end to end: its own `khorrun -np 2`, one epoch on
scikit-learn's digits (or MNIST where present), a test accuracy of at least 70 % and a
checkpoint. It launches a job of its own, so it runs only when KHOR_TEST_EXAMPLE=1 (set it
for one session), and only rank 0 of the session launches it while the others wait at a
barrier. KHOR_KHORRUN names the launcher (default build/khorrun)."""

import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

import khor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "python", "train_cnn.py")


def _wait_barrier(deadline_s):
    """A barrier that may wait longer than KHOR_TIMEOUT (rank 0 is busy training)."""
    from khor import _core
    h = _core.enqueue_barrier(khor.global_process_set)
    end = time.time() + deadline_s
    while not khor.poll(h):
        if time.time() > end:
            break
        time.sleep(0.05)
    khor.synchronize(h)


@pytest.mark.skipif(os.environ.get("KHOR_TEST_EXAMPLE") != "1",
                    reason="launches its own khorrun job: set KHOR_TEST_EXAMPLE=1 to run it")
def test_train_cnn_example():
    pytest.importorskip("torch", reason="the example needs torch")
    if not os.path.exists(EXAMPLE):
        pytest.skip("examples/python/train_cnn.py is not there yet")
    khorrun = os.environ.get("KHOR_KHORRUN", os.path.join(ROOT, "build", "khorrun"))
    result = None
    if khor.rank() == 0:
        tmp = tempfile.mkdtemp(prefix="khor-train-cnn-")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("KHOR_") or k in ("KHOR_LIBRARY_PATH", "KHOR_TIMEOUT")}
        env["KHOR_LIBRARY_PATH"] = os.path.abspath(khor.library_path)   # cwd changes
        env["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(ROOT, "bindings", "python")] + [p for p in sys.path if p])
        ckpt = os.path.join(tmp, "checkpoint.pt")
        try:
            p = subprocess.run([khorrun, "-np", "2", sys.executable, EXAMPLE, "--epochs", "1",
                                "--expect-accuracy", "70", "--checkpoint", ckpt],
                               cwd=tmp, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=240, text=True)
            result = (p.returncode, os.path.exists(ckpt), p.stdout[-3000:])
        except subprocess.TimeoutExpired as e:
            result = (-1, False, "timed out: %s" % (e.stdout or "")[-3000:])
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    _wait_barrier(300)
    rc, saved, out = _from_rank0(result)
    assert rc == 0, "train_cnn.py exited with %d:\n%s" % (rc, out)
    assert saved, "no checkpoint written:\n" + out
    assert "final test accuracy" in out


def _from_rank0(result):
    import khor.torch as hvd
    return hvd.broadcast_object(result, root_rank=0, name="example.result")
