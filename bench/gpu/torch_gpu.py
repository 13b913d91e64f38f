#!/usr/bin/python3
"""khor.torch on CUDA tensors, for the device machine (bench/gpu/device_check.sh runs it).

    khorrun -np 2 python3 bench/gpu/torch_gpu.py allreduce [--bytes 64M] [--iters 20]
    python3 bench/gpu/torch_gpu.py step [--model resnet50] [--batch 32] [--steps 20]

allreduce: hvd.allreduce_ of one float32 CUDA tensor of --bytes, timed per call (the median of
--iters after warm-ups), checked against the sum every rank expects. Prints one line
`torch_allreduce bytes=B n=N median_us=T busbw_gbs=G`, which device_check.sh sets beside
khor-bench's C device allreduce of the same size in the same run.

step: one process (n = 1, khor's job of one rank), a training step of a torchvision model on
synthetic data, plain torch against the same model under hvd.DistributedOptimizer, timed in
interleaved blocks (both see the same GPU state). Prints `torch_step model=M plain_ms=P
hvd_ms=H ratio=R` (target: the hooks cost nothing when there is no one to talk to, R <= 1.05).
Exits 77 (a skip) where torch sees no CUDA device.
"""
import argparse
import statistics
import sys
import time


def size_arg(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    s = s.strip().upper()
    if s and s[-1] in mult:
        return int(float(s[:-1]) * mult[s[-1]])
    return int(s)


def bench_allreduce(hvd, torch, args):
    dev = torch.device("cuda", hvd.local_rank() % torch.cuda.device_count())
    n = hvd.size()
    count = args.bytes // 4
    x = torch.empty(count, dtype=torch.float32, device=dev)
    want = float(n * (n + 1) // 2)
    times = []
    for it in range(args.warmup + args.iters):
        x.fill_(float(hvd.rank() + 1))
        torch.cuda.current_stream(dev).synchronize()
        t0 = time.perf_counter()
        hvd.allreduce_(x, op=hvd.Sum, name="bench.allreduce")
        t1 = time.perf_counter()
        if it >= args.warmup:
            times.append(t1 - t0)
    if not bool(torch.all(x == want).item()):
        print("torch_allreduce: WRONG RESULT (want %g everywhere)" % want, file=sys.stderr)
        return 1
    med = statistics.median(times)
    busbw = 2.0 * (n - 1) / n * args.bytes / med / 1e9 if n > 1 else 0.0
    if hvd.rank() == 0:
        print("torch_allreduce bytes=%d n=%d median_us=%.1f busbw_gbs=%.2f"
              % (args.bytes, n, med * 1e6, busbw), flush=True)
    return 0


def bench_step(hvd, torch, args):
    import torchvision
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)().to(dev)
    x = torch.randn(args.batch, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (args.batch,), device=dev)
    plain = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(opt):
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()

    hvd_opt = None
    times = {"plain": [], "hvd": []}
    for block in range(2 * args.blocks):
        mode = "plain" if block % 2 == 0 else "hvd"
        if mode == "hvd" and hvd_opt is None:
            hvd_opt = hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                named_parameters=model.named_parameters())
        opt = plain if mode == "plain" else hvd_opt
        for _ in range(args.warmup):
            step(opt)
        torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step(opt)
        torch.cuda.synchronize(dev)
        times[mode].append((time.perf_counter() - t0) / args.steps)
    p, h = statistics.median(times["plain"]), statistics.median(times["hvd"])
    print("torch_step model=%s batch=%d plain_ms=%.2f hvd_ms=%.2f ratio=%.3f"
          % (args.model, args.batch, p * 1e3, h * 1e3, h / p), flush=True)
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["allreduce", "step"])
    p.add_argument("--bytes", type=size_arg, default=64 << 20)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=10, help="timed steps per block")
    p.add_argument("--blocks", type=int, default=3, help="blocks per mode, interleaved")
    args = p.parse_args()
    import torch
    if not torch.cuda.is_available():
        print("torch_gpu: no CUDA device (torch.cuda.is_available() is False)")
        return 77
    import khor.torch as hvd
    hvd.init()
    try:
        return bench_allreduce(hvd, torch, args) if args.what == "allreduce" else \
            bench_step(hvd, torch, args)
    finally:
        hvd.shutdown()


if __name__ == "__main__":
    sys.exit(main())
