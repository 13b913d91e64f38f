"""The elastic recovery benchmark's training script (bench/elastic/recovery.py runs it).

Plain Horovod: `import horovod.torch as hvd`, so the same file runs under real Horovod's
horovodrun and under khorrun with khor's `horovod` alias. A small MLP under hvd.elastic.run,
committing every step. One worker hurts itself once at step BENCH_FAULT_STEP: BENCH_FAULT
"kill" (SIGKILL) or "stop" (SIGSTOP), the worker of start rank BENCH_FAULT_RANK; it writes
the wall-clock time of the fault first. Rank 0 appends "step <n> <size> <time>" after each
completed step to BENCH_LOG, from which the bench reads the time to the first step of the
next generation. Every process is on this one machine, so wall clocks agree.
"""
import os
import signal
import time

import torch

import horovod.torch as hvd

LOG = os.environ["BENCH_LOG"]
FAULT = os.environ.get("BENCH_FAULT", "kill")
FAULT_STEP = int(os.environ.get("BENCH_FAULT_STEP", "20"))
FAULT_RANK = int(os.environ.get("BENCH_FAULT_RANK", "1"))
STEPS = int(os.environ.get("BENCH_STEPS", "60"))
START_RANK = int(os.environ.get("HOROVOD_RANK", "0"))

hvd.init()
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
data, target = torch.randn(32, 64), torch.randint(0, 10, (32,))


def fire_once():
    """True the first time in the run: a worker started in the failed one's place, with its
    start rank, must not hurt itself again."""
    try:
        os.close(os.open(LOG + ".fired", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def note(line):
    with open(LOG, "a") as f:
        f.write(line + "\n")


@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        if state.step == FAULT_STEP and START_RANK == FAULT_RANK and fire_once():
            note("fault %s %.6f" % (FAULT, time.time()))
            os.kill(os.getpid(), signal.SIGKILL if FAULT == "kill" else signal.SIGSTOP)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(data), target).backward()
        opt.step()
        state.step += 1
        if hvd.rank() == 0:
            note("step %d %d %.6f" % (state.step, hvd.size(), time.time()))
        state.commit()


state = hvd.elastic.TorchState(model, opt, step=0)
train(state)
