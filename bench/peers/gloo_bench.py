#!/usr/bin/python3
"""gloo_bench.py -- khor-bench's peer on torch.distributed's gloo backend.

  /usr/bin/python3 bench/peers/gloo_bench.py --np 4 allreduce -b 8 -e 64M -f 2

gloo is what PyTorch users get on CPUs without MPI, so it is the yardstick khor's users will
hold up. This program takes khor-bench's flags and prints its columns, CSV and JSON
(bench/bench_*.c are the reference: same sizes, busbw factors, data patterns, checks,
slowest-rank average time); a change to either must be made to both.

With --np N it is its own launcher: it starts N copies of itself with torchrun's variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT) and exits with
the first failing rank's status. Without --np it joins the job those variables describe
(so torchrun works too), or runs alone when none are set.

What gloo lacks is done as a torch user would, and timed with the call: avg is sum then a
division; all_reduce, reduce and broadcast are in place (torch has no out-of-place form), so
the timed loop reduces the previous result again (a checked call starts from fresh inputs).
What gloo does not provide (reduce_scatter before torch 2.x, any bfloat16 reduction in
torch 1.13) is reported as not provided (exit status 2), not emulated; bfloat16 moves
(broadcast, allgather, ...) travel as bytes. Each rank uses one intra-op thread, like a
khor rank.
"""
import argparse
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time

PROG = "gloo-bench"
PERIOD = 1021
COLLS = ["allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall",
         "gather", "scatter", "barrier"]
USES_OP = {"allreduce", "reduce", "reducescatter"}
USES_ROOT = {"reduce", "broadcast", "gather", "scatter"}
# name: (aliases, element size, exact-integer limit, sentinel); see bench_dtypes[] in C
DTYPES = {
    "float": (("float32", "f32"), 4, 2.0**24, -12345.0),
    "double": (("float64", "f64"), 8, 2.0**53, -12345.0),
    "int32": (("i32", "int"), 4, 2.0**31 - 1, -12345.0),
    "int64": (("i64",), 8, 2.0**53, -12345.0),
    "half": (("float16", "fp16", "f16"), 2, 2048.0, -12345.0),
    "bfloat16": (("bf16",), 2, 256.0, -12345.0),
    "int8": (("i8", "char"), 1, 127.0, -128.0),
    "uint8": (("u8",), 1, 254.0, 255.0),
}
OPS = ["sum", "avg", "min", "max", "prod"]
FLOATS = {"float", "double", "half", "bfloat16"}


def parse_size(s):
    """'64M' -> 67108864 (powers of 1024, an optional trailing B), as bench_parse_size."""
    t = s.upper()
    if t.endswith("B"):
        t = t[:-1]
    shift = {"K": 10, "M": 20, "G": 30}.get(t[-1:], 0)
    if shift:
        t = t[:-1]
    if not t.isdigit():
        raise argparse.ArgumentTypeError(f"'{s}' is not a size like 8, 4K or 64M")
    return int(t) << shift


def parse_dtype(s):
    for name, (aliases, *_rest) in DTYPES.items():
        if s == name or s in aliases:
            return name
    raise argparse.ArgumentTypeError(f"'{s}': it needs float, double, int32, int64, half, "
                                     "bfloat16, int8 or uint8")


def parse_coll(s):
    plain = s.replace("_", "").replace("-", "")
    plain = "broadcast" if plain == "bcast" else plain
    if plain not in COLLS:
        raise argparse.ArgumentTypeError(f"unknown collective '{s}'")
    return plain


def at_least(lo):
    def parse(s):
        try:
            v = int(s)
        except ValueError:
            v = lo - 1
        if v < lo:
            raise argparse.ArgumentTypeError(f"'{s}': it needs an integer of {lo} or more")
        return v
    return parse


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description="khor-bench's columns on gloo; see the "
                                "file's docstring.", allow_abbrev=False)
    p.add_argument("collective", type=parse_coll, help=" ".join(COLLS))
    p.add_argument("-b", "--minbytes", type=parse_size, default=8)
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20)
    p.add_argument("-f", "--stepfactor", type=at_least(2), default=2)
    p.add_argument("-i", "--stepbytes", type=parse_size, default=0)
    p.add_argument("-n", "--iters", type=at_least(1), default=20)
    p.add_argument("-w", "--warmup_iters", type=at_least(0), default=5)
    p.add_argument("-c", "--check", nargs="?", const="all", default="1",
                   choices=["0", "1", "all", "2"], help="0, 1 or all (--check alone: all)")
    p.add_argument("-d", "--datatype", type=parse_dtype, default=None)
    p.add_argument("-o", "--op", choices=OPS, default=None)
    p.add_argument("-r", "--root", type=at_least(0), default=None)
    p.add_argument("--csv")
    p.add_argument("--json")
    p.add_argument("--progress", type=at_least(0), default=2)
    p.add_argument("--offset", type=at_least(0), default=0,
                   help="start the buffers OFFSET bytes past a page boundary (0-4095, a "
                   "multiple of the element size)")
    p.add_argument("-q", "--quiet", action="store_true")
    p.add_argument("--np", type=at_least(1), help="launch this many ranks on this host")
    a = p.parse_args(argv)
    # The same refusals as bench_parse_args: a flag that would be ignored is an error.
    if a.minbytes > a.maxbytes:
        p.error(f"-b {a.minbytes} is larger than -e {a.maxbytes}")
    if a.op is not None and a.collective not in USES_OP:
        p.error(f"-o does not apply to {a.collective}")
    if a.root is not None and a.collective not in USES_ROOT:
        p.error(f"-r does not apply to {a.collective}")
    if a.datatype is not None and a.collective == "barrier":
        p.error("-d does not apply to barrier")
    if a.offset > 4095:
        p.error(f"--offset {a.offset} is not in 0-4095")
    if a.quiet and not (a.csv or a.json):
        p.error("-q without --csv or --json would print nothing")
    a.check = {"0": 0, "1": 1, "all": 2, "2": 2}[a.check]
    a.datatype = a.datatype or "float"
    if a.offset % DTYPES[a.datatype][1]:
        # A tensor starts on an element: torch has no byte-granular view.
        p.error(f"--offset {a.offset} is not a multiple of {a.datatype}'s "
                f"{DTYPES[a.datatype][1]} bytes")
    a.op = a.op or "sum"
    a.root = a.root or 0
    return a


def placed(torch, numel, tdtype, offset):
    """A zeroed tensor of numel elements whose data starts offset bytes past a page boundary
    (khor-bench's --offset): a view into a larger one. torch's CPU allocator aligns only to
    64 bytes, so where a tensor falls in its page is otherwise up to the allocator."""
    esz = torch.empty(0, dtype=tdtype).element_size()
    base = torch.zeros(numel + (4096 + offset) // esz + 1, dtype=tdtype)
    skip = (offset - base.data_ptr()) % 4096 // esz
    t = base[skip:skip + numel]
    assert t.data_ptr() % 4096 == offset, (t.data_ptr(), offset)
    return t


def launch(argv, n):
    """Starts n ranks of this program with torchrun's variables; returns the exit status."""
    with socket.socket() as s:  # a free port; the tiny race with another binder is accepted
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rest = []
    skip = False
    for i, arg in enumerate(argv):  # drop --np N / --np=N, keep the rest in order
        if skip:
            skip = False
        elif arg == "--np":
            skip = True
        elif not arg.startswith("--np="):
            rest.append(arg)
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + rest,
                                      env=env))
    status = 0
    try:
        live = list(procs)
        while live:  # the first failure stops the others, as khorrun does
            for pr in list(live):
                rc = pr.poll()
                if rc is None:
                    continue
                live.remove(pr)
                if rc != 0 and status == 0:
                    status = rc if rc > 0 else 1
                    print(f"{PROG}: rank {procs.index(pr)} exited with status {rc}; "
                          "stopping the others", file=sys.stderr)
                    for other in live:
                        other.send_signal(signal.SIGTERM)
            time.sleep(0.05)
    except KeyboardInterrupt:
        for pr in procs:
            pr.send_signal(signal.SIGTERM)
        status = 130
    return status


def main(argv):
    a = parse_args(argv)
    if a.np:
        return launch(argv, a.np)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    tdtype = {"float": torch.float32, "double": torch.float64, "int32": torch.int32,
              "int64": torch.int64, "half": torch.float16, "bfloat16": torch.bfloat16,
              "int8": torch.int8, "uint8": torch.uint8}[a.datatype]
    rank, n = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if "MASTER_ADDR" not in os.environ:  # a one-rank job, as khor_init's rule
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
    # A deadline on every wait, as khor's KHOR_TIMEOUT: gloo's default is 30 minutes.
    timeout = datetime.timedelta(seconds=float(os.environ.get("GLOO_BENCH_TIMEOUT", "300")))
    dist.init_process_group("gloo", rank=rank, world_size=n, timeout=timeout)
    rank0 = rank == 0
    coll = a.collective
    _aliases, esize, limit, sentinel = DTYPES[a.datatype]
    signed = a.datatype != "uint8"
    redop = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
             "max": dist.ReduceOp.MAX, "prod": dist.ReduceOp.PRODUCT}[a.op]
    library = f"torch {torch.__version__} gloo"
    transport, algo = "tcp", "gloo"

    # ---- the patterns of bench_data.c, on whole tensors ----
    def period():
        p = limit - n + 2 if a.op in ("min", "max") else limit / n
        return 1 if p < 1 else PERIOD if p > PERIOD else int(p)

    def pattern(first, count):
        i = torch.arange(first, first + count, dtype=torch.int64)
        p = period()
        if a.op in ("sum", "avg"):
            v = (i + rank) % p + 1
        elif a.op in ("min", "max"):
            v = i % p + (i + rank) % n
        else:
            v = torch.where(i % n == rank, i % 7 + 2, torch.ones_like(i))
            if signed and n > 1:
                v = torch.where((i + 1) % n == rank, -torch.ones_like(i), v)
        return v.to(tdtype)

    def expected(first, count):
        i = torch.arange(first, first + count, dtype=torch.int64)
        p = period()
        k, q, m = i % p, n // p, n % p
        kd = k.double()
        head = (p - k).double()
        tail = m - head
        wrapped = torch.where(k + m <= p, m * kd + m * (m - 1) / 2,
                              head * (kd + p - 1) / 2 + tail * (tail - 1) / 2)
        s = n + q * p * (p - 1) / 2 + wrapped
        if a.op == "sum":
            return s
        if a.op == "avg":
            return s / n if a.datatype in FLOATS else torch.div(s, n, rounding_mode="trunc")
        if a.op == "min":
            return kd
        if a.op == "max":
            return kd + n - 1
        v = (i % 7 + 2).double()
        return -v if signed and n > 1 else v

    def value(src, count):
        p = int(limit) + 1 if limit + 1 < PERIOD else PERIOD
        return ((torch.arange(count, dtype=torch.int64) + 7 * src) % p).to(tdtype)

    def blocks(nblocks, count, first, stride):
        if nblocks * count == 0:
            return torch.empty(0, dtype=tdtype)
        return torch.cat([value(first + k * stride, count) for k in range(nblocks)])

    def wrong_reduced(got, first):
        want = expected(first, got.numel())
        g = got.double()
        if a.op == "avg" and a.datatype in FLOATS:
            rel = {"float": 1e-6, "double": 1e-14, "half": 1 / 1024, "bfloat16": 1 / 128}
            tol = rel[a.datatype] * want.abs().clamp(min=1.0)
            return int((~((g - want).abs() <= tol)).sum())
        return int((g != want).sum())

    def wrong_equal(got, want):
        return int((got != want).sum())

    def sentinel_fill(t):
        t.fill_(sentinel)

    # ---- shapes: (total, param, send, recv) as bench_shape ----
    def rs_count(count, r):
        return count // n + (1 if r < count % n else 0)

    def rs_offset(count, r):
        return r * (count // n) + min(r, count % n)

    def shape(total):
        per = total // n
        if coll in ("allreduce", "reduce", "broadcast"):
            return total, total, total, total
        if coll in ("allgather", "gather"):
            return per * n, per, per, per * n
        if coll == "scatter":
            return per * n, per, per * n, per
        if coll == "reducescatter":
            return total, total, total, rs_count(total, 0)
        if coll == "alltoall":
            return per * n, per, per * n, per * n
        return 0, 0, 0, 0

    factor = {"allreduce": 2 * (n - 1) / n, "reduce": 1.0, "broadcast": 1.0,
              "barrier": 0.0}.get(coll, (n - 1) / n)

    # ---- the calls ----
    def mv(t):
        """gloo (torch 1.13) refuses bfloat16 (and int16) even to move them: moves go as
        bytes, as a user would send them. Its reductions of bfloat16 stay refused (status 2)."""
        return t.view(torch.uint8) if tdtype == torch.bfloat16 else t

    def run(sh, send, recv):
        total, param, ns, nr = sh
        root = a.root
        if coll == "allreduce":
            dist.all_reduce(recv[:nr], op=redop)
            if a.op == "avg":
                divide(recv[:nr])
        elif coll == "reduce":
            dist.reduce(recv[:nr], dst=root, op=redop)
            if a.op == "avg" and rank == root:
                divide(recv[:nr])
        elif coll == "broadcast":
            dist.broadcast(mv(recv[:nr]), src=root)
        elif coll == "allgather":
            dist.all_gather(list(mv(recv[:nr]).chunk(n)), mv(send[:ns]))
        elif coll == "reducescatter":
            counts = [rs_count(total, r) for r in range(n)]
            dist.reduce_scatter(recv[:counts[rank]], list(send[:ns].split(counts)), op=redop)
            if a.op == "avg":
                divide(recv[:counts[rank]])
        elif coll == "alltoall":
            dist.all_to_all_single(mv(recv[:nr]), mv(send[:ns]))
        elif coll == "gather":
            dist.gather(mv(send[:ns]), list(mv(recv[:nr]).chunk(n)) if rank == root else None,
                        dst=root)
        elif coll == "scatter":
            dist.scatter(mv(recv[:nr]), list(mv(send[:ns]).chunk(n)) if rank == root else None,
                         src=root)
        else:
            dist.barrier()

    def divide(t):
        if a.datatype in FLOATS:
            t.div_(n)
        else:
            t.copy_(torch.div(t, n, rounding_mode="trunc"))

    def fill(sh, send, recv):
        total, param, ns, nr = sh
        if coll in USES_OP:
            send[:ns] = pattern(0, ns)
            sentinel_fill(recv[:nr])
            if coll in ("allreduce", "reduce"):  # torch's in-place form starts from the input
                recv[:nr] = send[:ns]
        elif coll == "broadcast":
            if rank == a.root:
                recv[:nr] = value(a.root, nr)
            else:
                sentinel_fill(recv[:nr])
        elif coll in ("allgather", "gather"):
            send[:ns] = value(rank, ns)
            sentinel_fill(recv[:nr])
        elif coll == "scatter":
            if rank == a.root:
                send[:ns] = blocks(n, param, 0, 1)
            sentinel_fill(recv[:nr])
        elif coll == "alltoall":
            send[:ns] = blocks(n, param, rank * n, 1)
            sentinel_fill(recv[:nr])

    def check(sh, recv):
        total, param, ns, nr = sh
        if coll == "allreduce" or (coll == "reduce" and rank == a.root):
            return wrong_reduced(recv[:nr], 0)
        if coll == "reducescatter":
            c = rs_count(total, rank)
            w = wrong_reduced(recv[:c], rs_offset(total, rank))
            stored = torch.tensor([sentinel], dtype=torch.float64).to(tdtype)
            return w + int((recv[c:nr] != stored).sum())
        if coll == "broadcast":
            return wrong_equal(recv[:nr], value(a.root, nr))
        if coll == "allgather" or (coll == "gather" and rank == a.root):
            return wrong_equal(recv[:nr], blocks(n, param, 0, 1))
        if coll == "scatter":
            return wrong_equal(recv[:nr], value(rank, nr))
        if coll == "alltoall":
            return wrong_equal(recv[:nr], blocks(n, param, rank, n))
        return 0

    # ---- output ----
    rtype = "none" if coll == "barrier" else a.datatype
    rop = a.op if coll in USES_OP else "none"
    check_name = {0: "0", 1: "1", 2: "all"}[a.check]

    def fmt_time(us):
        return f"{us:7.0f}" if us >= 10000 else f"{us:7.1f}" if us >= 100 else f"{us:7.2f}"

    def human(b):
        v, u = float(b), 0
        while v >= 1024 and u < 4:
            v, u = v / 1024, u + 1
        unit = ["B", "KiB", "MiB", "GiB", "TiB"][u]
        return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"

    def fail(what, size, e):
        print(f"{PROG}: rank {rank}: {what} failed at {size} bytes: {e}", file=sys.stderr)

    if coll in USES_ROOT and a.root >= n:
        if rank0:
            print(f"{PROG}: -r {a.root} is not a rank of this {n}-rank job", file=sys.stderr)
        return 2

    csvf = jsonf = None
    if rank0:
        try:
            csvf = open(a.csv, "w") if a.csv else None
            jsonf = open(a.json, "w") if a.json else None
        except OSError as e:
            print(f"{PROG}: cannot open {e.filename}: {e.strerror}", file=sys.stderr)
            return 2  # the other ranks fail at their first call, when rank 0 is gone
    if csvf:
        csvf.write("collective,library,transport,algo,nranks,size,count,type,redop,time_us,"
                   "algbw_gbs,busbw_gbs,wrong\n")
    doc = {"program": PROG, "library": library, "transport": transport, "algo": algo,
           "collective": coll, "nranks": n, "type": rtype, "redop": rop,
           "root": a.root if coll in USES_ROOT else -1, "iters": a.iters,
           "warmup": a.warmup_iters, "check": check_name, "offset": a.offset, "rows": []}

    maxsh = shape(0 if coll == "barrier" else a.maxbytes // esize)
    send = placed(torch, max(maxsh[2], 1), tdtype, a.offset)
    recv = placed(torch, max(maxsh[3], 1), tdtype, a.offset)
    if coll != "barrier":
        fill(maxsh, send, recv)

    if rank0 and not a.quiet:
        head = f"# {PROG} {coll}: {n} rank{'' if n == 1 else 's'}, "
        if coll != "barrier":
            head += f"dtype {a.datatype}, "
        if coll in USES_OP:
            head += f"op {a.op}, "
        if coll in USES_ROOT:
            head += f"root {a.root}, "
        print(head + f"iters {a.iters}, warmup {a.warmup_iters}, check {check_name}"
              + (f", buffers at page + {a.offset} B" if a.offset else ""))
        print(f"# library: {library} (transport {transport}, algo {algo})")
        print("#")
        print(f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'time':>7}  "
              f"{'algbw':>6}  {'busbw':>6}  {'#wrong':>6}")
        print(f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'(us)':>7}  "
              f"{'(GB/s)':>6}  {'(GB/s)':>6}")
        sys.stdout.flush()

    status, wrong_total, busbw_sum, rows = 0, 0, 0.0, 0
    size = a.minbytes
    while True:
        sh = shape(0 if coll == "barrier" else size // esize)
        nbytes = sh[0] * esize
        if sh[0] > 0 or coll == "barrier":
            mine_wrong, t_mine = 0, 0.0
            check_all = a.check == 2 and coll != "barrier"
            start, next_line = time.monotonic(), float(a.progress)

            def tick(done, of, warm):
                nonlocal next_line
                if not rank0 or a.progress <= 0:
                    return
                el = time.monotonic() - start
                if el >= next_line:
                    what = f"warm-up {done} of {of}" if warm else f"{done} of {of} iterations"
                    print(f"# [{PROG}] {human(nbytes)}: {what}, {el:.0f} s so far",
                          file=sys.stderr)
                    next_line = el + 5 * a.progress

            try:
                for it in range(a.warmup_iters):
                    if check_all:
                        fill(sh, send, recv)
                    run(sh, send, recv)
                    if check_all:
                        mine_wrong += check(sh, recv)
                    tick(it + 1, a.warmup_iters, True)
                dist.barrier()
                t0 = time.perf_counter()
                for it in range(a.iters):
                    if check_all:
                        fill(sh, send, recv)
                        dist.barrier()
                        t0 = time.perf_counter()
                    run(sh, send, recv)
                    if check_all:
                        t_mine += time.perf_counter() - t0
                        mine_wrong += check(sh, recv)
                    tick(it + 1, a.iters, False)
                if not check_all:
                    t_mine = time.perf_counter() - t0
                t = torch.tensor([t_mine / a.iters], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                sec = float(t[0])
                if a.check == 1 and coll != "barrier":
                    fill(sh, send, recv)
                    run(sh, send, recv)
                    mine_wrong += check(sh, recv)
                w = torch.tensor([mine_wrong], dtype=torch.int64)
                dist.all_reduce(w)
                wrong = int(w[0])
            except RuntimeError as e:
                fail(coll, nbytes, str(e).splitlines()[0] if str(e) else repr(e))
                low = str(e).lower()
                missing = ("not supported", "does not support", "invalid scalar type")
                if any(x in low for x in missing):
                    if rank0:
                        what = f" for {a.datatype}" if "scalar type" in low else ""
                        print(f"{PROG}: {library} does not provide {coll}{what}",
                              file=sys.stderr)
                    status = 2
                else:
                    status = 1
                break
            algbw = nbytes / sec / 1e9 if sec > 0 else 0.0
            busbw = algbw * factor
            wrong_total += wrong
            busbw_sum += busbw
            shown = wrong if a.check else -1
            if rank0 and not a.quiet:
                wcol = f"{wrong:6d}" if a.check else f"{'N/A':>6}"
                print(f"{nbytes:12d}  {sh[0]:12d}  {rtype:>8}  {rop:>6}  {fmt_time(sec * 1e6)}  "
                      f"{algbw:6.2f}  {busbw:6.2f}  {wcol}")
                sys.stdout.flush()
            if csvf:
                csvf.write(f"{coll},{library},{transport},{algo},{n},{nbytes},{sh[0]},{rtype},"
                           f"{rop},{sec * 1e6:.6g},{algbw:.6g},{busbw:.6g},{shown}\n")
            doc["rows"].append({"size": nbytes, "count": sh[0], "time_us": sec * 1e6,
                                "algbw_gbs": algbw, "busbw_gbs": busbw, "wrong": shown})
            rows += 1
        if coll == "barrier":
            break
        nxt = size + a.stepbytes if a.stepbytes else size * a.stepfactor
        if size == 0 and not a.stepbytes:
            nxt = 1
        if nxt <= size or nxt > a.maxbytes:
            break
        size = nxt

    avg = busbw_sum / rows if rows else 0.0
    if rank0 and not a.quiet and status == 0:
        print(f"# Out of bounds values : {wrong_total} {'FAILED' if wrong_total else 'OK'}")
        print(f"# Avg bus bandwidth    : {avg:g}")
        print("#")
    if wrong_total and status == 0:
        status = 1
    if csvf:
        csvf.close()
    if jsonf:
        doc.update(wrong_total=wrong_total if a.check else -1, avg_busbw_gbs=avg,
                   ok=status == 0)
        json.dump(doc, jsonf, indent=1)
        jsonf.write("\n")
        jsonf.close()
    if status == 0:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
