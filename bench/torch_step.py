#!/usr/bin/python3
"""torch_step.py -- a real model's training step: khor's DistributedOptimizer against
PyTorch's DistributedDataParallel on gloo, in the same job.

  khorrun -np 2 /usr/bin/python3 bench/torch_step.py
  khorrun -np 4 /usr/bin/python3 bench/torch_step.py --model cnn --steps 20 --json step.json

Every rank builds the model twice from the same seed (ResNet-18, 11.7 M parameters in 62
tensors, defined here so that torchvision is not needed; and/or the CNN of
examples/python/train_cnn.py) and trains both on the same synthetic batch with SGD: one copy
under khor.torch's DistributedOptimizer (gradients averaged by khor while backward runs),
the other under DistributedDataParallel on torch.distributed's gloo backend (its buckets'
allreduces overlapped with backward the same way; broadcast_buffers=False, since Horovod
does not sync buffers either). gloo joins the job khorrun started: MASTER_ADDR is
127.0.0.1, MASTER_PORT is $KHOR_BENCH_GLOO_PORT or a port rank 0 finds free and sends to
the others (hvd.broadcast_object), RANK and WORLD_SIZE are hvd.rank() and hvd.size().

The modes run interleaved, in blocks of --block steps, round after round, so that a noisy
neighbour or a clock change hits them alike:
  khor      hvd.DistributedOptimizer step
  ddp       DistributedDataParallel step
  no-sync   the DDP step under ddp.no_sync(): the same compute with no communication
  khor-ar   the step's gradient bytes as one flat tensor through hvd.allreduce, alone
  gloo-ar   the same bytes through dist.all_reduce in DDP's bucket sizes (1 MiB first,
            then 25 MiB), each divided by the ranks as DDP's hook does, alone
Communication per step is reported two ways, each labelled:
  measured    khor: from the return of loss.backward() to the return of the optimizer's
              synchronize() inside step() (the wait for what backward did not hide), on
              the rank that waited least, the one that finished backward last: its wait is
              communication alone; 'wait max' is the longest any rank waited, that plus
              the time it waited for slower ranks' backward. DDP has no such point (its
              allreduces finish inside backward): '-'
  step-nosync the step less the no-sync step (both libraries): the time communication adds
and the ar rows give each library's time for the same bytes with nothing to overlap.
Times are per step, the slowest rank's (measured: as above), median of the timed steps;
img/s is the images of all ranks per step over the step time.

Before timing, two steps of each copy from the same weights on the same data must give the
same averaged gradients and updated weights (#wrong: the tensors that differ, rtol 1e-4, in
the two steps together; exit status 1 when any do).
Exit status: 0 on success, 1 on a wrong result or error, 2 for a bad flag.
"""
import argparse
import copy
import datetime
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
FIRST_BUCKET, BUCKET = 1 << 20, 25 << 20  # DDP's default bucket caps (torch 1.13)
DEFAULT_BATCH = {"resnet18": 8, "cnn": 64}
MODES = ["khor", "ddp", "no-sync", "khor-ar", "gloo-ar"]


class BasicBlock(nn.Module):
    """ResNet's two-convolution residual block (torchvision's layout)."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 as torchvision's resnet18(): 11,689,512 parameters in 62 tensors."""

    def __init__(self, num_classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, inplanes = [], 64
        for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            stages.append(nn.Sequential(BasicBlock(inplanes, planes, stride),
                                        BasicBlock(planes, planes)))
            inplanes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build(name, image_size):
    """(model, input shape of one image, classes)."""
    if name == "resnet18":
        return ResNet18(), (3, image_size, image_size), 1000
    sys.path.insert(0, os.path.join(HERE, "..", "examples", "python"))
    from train_cnn import Net
    return Net(), (1, 28, 28), 10


def parse_args(argv):
    def positive(s):
        v = int(s)
        if v < 1:
            raise argparse.ArgumentTypeError(f"'{s}': it needs a positive number")
        return v

    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["resnet18", "cnn", "both"], default="both")
    p.add_argument("--batch", type=positive,
                   help="images per rank per step (default: resnet18 8, cnn 64)")
    p.add_argument("--steps", type=positive, default=10, help="timed steps per mode (10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per mode first (2)")
    p.add_argument("--block", type=positive, default=2,
                   help="steps of one mode before the next mode's turn (2)")
    p.add_argument("--image-size", type=positive, default=224, help="ResNet-18's input (224)")
    p.add_argument("--threads", type=positive,
                   help="torch intra-op threads per rank (default: 1 with 2 or more ranks)")
    p.add_argument("--json", metavar="FILE", help="also write the run as JSON to FILE (rank 0)")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup needs 0 or more")
    return args


def join_gloo(hvd):
    """torch.distributed on gloo over the ranks of the khor job, on rank 0's port. On the
    namespace cluster (bench/cluster/netns_cluster.sh --exec) rank 0's host address comes
    from CLUSTER_HOST_ADDR, and gloo uses that host's eth0."""
    port = int(os.environ.get("KHOR_BENCH_GLOO_PORT", "0"))
    here = os.environ.get("CLUSTER_HOST_ADDR", "127.0.0.1")
    if port == 0 and hvd.rank() == 0:
        with socket.socket() as s:  # a free port; the tiny race with another binder is accepted
            s.bind((here, 0))
            port = s.getsockname()[1]
    port, addr = hvd.broadcast_object((port, here), root_rank=0)
    if "CLUSTER_HOST_ADDR" in os.environ:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0")
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port),
                      RANK=str(hvd.rank()), WORLD_SIZE=str(hvd.size()))
    dist.init_process_group("gloo", rank=hvd.rank(), world_size=hvd.size(),
                            timeout=datetime.timedelta(seconds=120))
    return port


def gloo_buckets(nbytes):
    """Element counts of DDP's buckets for nbytes of float32 gradients (caps, not the tensor
    boundaries DDP also respects)."""
    left, out, cap = nbytes // 4, [], FIRST_BUCKET // 4
    while left:
        out.append(min(cap, left))
        left -= out[-1]
        cap = BUCKET // 4
    return out


class Bench:
    """One model's copies, optimizers, batch and step functions."""

    def __init__(self, hvd, name, args):
        self.hvd, self.name = hvd, name
        self.batch = args.batch or DEFAULT_BATCH[name]
        torch.manual_seed(0)
        model, shape, classes = build(name, args.image_size)
        gen = torch.Generator().manual_seed(1000 + hvd.rank())
        self.x = torch.randn((self.batch,) + shape, generator=gen)
        self.y = torch.randint(0, classes, (self.batch,), generator=gen)
        self.tensors = sum(1 for p in model.parameters() if p.requires_grad)
        self.numel = sum(p.numel() for p in model.parameters() if p.requires_grad)

        self.khor_model = model
        self.ddp_model = copy.deepcopy(model)
        hvd.broadcast_parameters(self.khor_model.state_dict(), root_rank=0)
        opt = torch.optim.SGD(self.khor_model.parameters(), lr=0.01, momentum=0.9)
        self.khor_opt = hvd.DistributedOptimizer(
            opt, named_parameters=self.khor_model.named_parameters(), op=hvd.Average)
        self.sync_end = None
        synchronize = self.khor_opt.synchronize

        def timed_synchronize(*a, **kw):  # what step() waits on: the end of communication
            r = synchronize(*a, **kw)
            self.sync_end = time.perf_counter()
            return r

        self.khor_opt.synchronize = timed_synchronize
        self.ddp = nn.parallel.DistributedDataParallel(self.ddp_model, broadcast_buffers=False)
        self.ddp_opt = torch.optim.SGD(self.ddp.parameters(), lr=0.01, momentum=0.9)
        self.flat = torch.zeros(self.numel)
        self.buckets = [torch.zeros(n) for n in gloo_buckets(4 * self.numel)]

    def khor(self):
        """(step, measured communication) of a DistributedOptimizer step, seconds."""
        self.sync_end = None
        t0 = time.perf_counter()
        self.khor_opt.zero_grad()
        F.cross_entropy(self.khor_model(self.x), self.y).backward()
        t_bwd = time.perf_counter()
        self.khor_opt.step()
        t1 = time.perf_counter()
        if self.sync_end is None:
            raise RuntimeError("khor.torch's DistributedOptimizer.step() did not call its "
                               "synchronize(), so its communication cannot be timed")
        return t1 - t0, self.sync_end - t_bwd

    def ddp_step(self, sync=True):
        t0 = time.perf_counter()
        self.ddp_opt.zero_grad()
        if sync:
            F.cross_entropy(self.ddp(self.x), self.y).backward()
        else:
            with self.ddp.no_sync():
                F.cross_entropy(self.ddp(self.x), self.y).backward()
        self.ddp_opt.step()
        return time.perf_counter() - t0, None

    def khor_ar(self):
        t0 = time.perf_counter()
        self.hvd.allreduce(self.flat, name=f"torch_step.{self.name}.flat", op=self.hvd.Average)
        return time.perf_counter() - t0, None

    def gloo_ar(self):
        t0 = time.perf_counter()
        for b in self.buckets:
            dist.all_reduce(b)
            b.div_(dist.get_world_size())
        return time.perf_counter() - t0, None

    def run(self, mode):
        return {"khor": self.khor, "ddp": self.ddp_step,
                "no-sync": lambda: self.ddp_step(sync=False),
                "khor-ar": self.khor_ar, "gloo-ar": self.gloo_ar}[mode]()

    def check(self):
        """Tensors whose averaged gradient or updated weight differs between khor and DDP,
        in two steps (the second one through khor's warm caches), each from the same
        weights (khor's copied into DDP's first: a ResNet turns a 1e-7 difference in its
        weights into percents in its next gradients), the same data, the same dropout.
        The largest count of any rank."""
        wrong = 0
        for _ in range(2):
            with torch.no_grad():
                for a, b in zip(self.khor_model.parameters(), self.ddp_model.parameters()):
                    b.copy_(a)
            torch.manual_seed(7 + self.hvd.rank())
            self.khor()
            torch.manual_seed(7 + self.hvd.rank())
            self.ddp_step()
            for a, b in zip(self.khor_model.parameters(), self.ddp_model.parameters()):
                if a.grad is None or not torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6) \
                        or not torch.allclose(a, b, rtol=1e-4, atol=1e-6):
                    wrong += 1
        t = torch.tensor([wrong])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)


def over_ranks(samples, op=dist.ReduceOp.MAX):
    """Per step, the largest (or with op MIN the smallest) of the ranks' values."""
    t = torch.tensor(samples, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.tolist()


def measure(bench, args):
    """{mode: {"step": [s...], "measured": [s...], "wait_max": [s...]}} (measured and
    wait_max empty but for khor), the modes interleaved in blocks."""
    for mode in MODES:
        for _ in range(args.warmup):
            bench.run(mode)
    out = {m: {"step": [], "measured": [], "wait_max": []} for m in MODES}
    while len(out[MODES[0]]["step"]) < args.steps:
        n = min(args.block, args.steps - len(out[MODES[0]]["step"]))
        for mode in MODES:
            dist.barrier()
            steps, comms = [], []
            for _ in range(n):
                s, c = bench.run(mode)
                steps.append(s)
                comms.append(c)
            out[mode]["step"] += over_ranks(steps)
            if comms[0] is not None:
                out[mode]["measured"] += over_ranks(comms, dist.ReduceOp.MIN)
                out[mode]["wait_max"] += over_ranks(comms)
    return out


def main(argv):
    args = parse_args(argv)
    import khor.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    threads = args.threads or (1 if size > 1 else torch.get_num_threads())
    torch.set_num_threads(threads)
    port = join_gloo(hvd)
    names = ["resnet18", "cnn"] if args.model == "both" else [args.model]

    rows, failed = [], 0
    for name in names:
        bench = Bench(hvd, name, args)
        wrong = bench.check()
        failed += wrong
        t = measure(bench, args)
        med = {m: statistics.median(t[m]["step"]) for m in MODES}
        images = bench.batch * size
        nbytes = 4 * bench.numel
        for mode in MODES:
            row = {"model": name, "mode": mode, "tensors": bench.tensors, "bytes": nbytes,
                   "batch": bench.batch, "step_ms": 1e3 * med[mode], "img_s": None,
                   "comm_measured_ms": None, "comm_wait_max_ms": None,
                   "comm_step_nosync_ms": None, "gbps": None,
                   "vs_ddp": None, "wrong": wrong, "steps_ms": [1e3 * v for v in t[mode]["step"]]}
            if mode in ("khor", "ddp", "no-sync"):
                row["img_s"] = images / med[mode]
            if mode in ("khor", "ddp"):
                row["comm_step_nosync_ms"] = 1e3 * (med[mode] - med["no-sync"])
                row["vs_ddp"] = med["ddp"] / med[mode]
            if mode == "khor":
                row["comm_measured_ms"] = 1e3 * statistics.median(t[mode]["measured"])
                row["comm_wait_max_ms"] = 1e3 * statistics.median(t[mode]["wait_max"])
                row["measured_ms"] = [1e3 * v for v in t[mode]["measured"]]
                row["wait_max_ms"] = [1e3 * v for v in t[mode]["wait_max"]]
            if mode in ("khor-ar", "gloo-ar"):
                row["gbps"] = nbytes / med[mode] / 1e9
                row["vs_ddp"] = med["gloo-ar"] / med[mode]
            rows.append(row)
        del bench
    if rank == 0:
        report(args, size, threads, port, rows, hvd)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"program": "torch_step", "ranks": size, "threads": threads,
                           "torch": torch.__version__, "steps": args.steps,
                           "warmup": args.warmup, "block": args.block,
                           "image_size": args.image_size, "rows": rows}, f, indent=1)
    dist.destroy_process_group()
    hvd.shutdown()
    if failed:
        print(f"torch_step: rank {rank}: {failed} tensor(s) differ between khor and DDP",
              file=sys.stderr)
        return 1
    return 0


def report(args, size, threads, port, rows, hvd):
    version = getattr(hvd, "__version__", None) or getattr(sys.modules.get("khor"),
                                                           "__version__", "?")
    print(f"# torch_step: {size} ranks, {threads} thread(s) each, steps {args.steps}, "
          f"warmup {args.warmup}, block {args.block}; torch {torch.__version__}, khor {version}")
    print(f"# khor: DistributedOptimizer (op average); ddp: DistributedDataParallel on gloo "
          f"(port {port}, broadcast_buffers off); SGD momentum 0.9, synthetic data")
    print("# times: the slowest rank's per step, median of the timed steps; measured: khor's "
          "end of backward")
    print("# -> end of synchronize() in step() on the rank that waited least (wait max: the "
          "most any rank")
    print("# waited); step-nosync: step less the no-sync step; *-ar: the gradient bytes "
          "allreduced alone")
    print("# (khor: one flat tensor; gloo: DDP's bucket sizes); vs ddp: ddp's time / this one's")
    print("#")
    cols = [("model", 9), ("mode", 8), ("tensors", 8), ("bytes", 10), ("batch", 6),
            ("step", 9), ("img/s", 8), ("measured", 9), ("wait max", 9), ("step-nosync", 12),
            ("GB/s", 6), ("vs ddp", 7), ("#wrong", 7)]
    units = {"bytes": "(B)", "step": "(ms)", "measured": "comm (ms)", "wait max": "(ms)",
             "step-nosync": "comm (ms)"}
    print("#" + " ".join(f"{c:>{w}}" for c, w in cols))
    print("#" + " ".join(f"{units.get(c, ''):>{w}}" for c, w in cols).rstrip())

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in rows:
        cells = [r["model"], r["mode"], r["tensors"], r["bytes"], r["batch"],
                 num(r["step_ms"], ".2f"), num(r["img_s"], ".1f"),
                 num(r["comm_measured_ms"], ".2f"), num(r["comm_wait_max_ms"], ".2f"),
                 num(r["comm_step_nosync_ms"], ".2f"), num(r["gbps"], ".2f"),
                 num(r["vs_ddp"], ".2f"), r["wrong"]]
        print(" " + " ".join(f"{v:>{w}}" for v, (_, w) in zip(cells, cols)))
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
