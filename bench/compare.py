#!/usr/bin/python3
"""compare.py -- khor against its peers, side by side: a CSV, a PNG and a markdown table.

  bench/compare.py -c allreduce allgather -n 2 4 -e 4M -R 3 -o results/
  bench/compare.py -c alltoall --khor tcp shm:auto --peers mpi-shm -- -d bfloat16

For each rank count and collective it runs the same sweep with every series (khor on each
--khor TRANSPORT[:ALGO], then each peer: OpenMPI over TCP on loopback, OpenMPI over shared
memory (vader), torch.distributed's gloo), interleaved: khor, peer, khor, peer... and again
R times, so that a noisy neighbour or a clock change hits every series alike instead of
whichever ran last. The median (or best) time of the R runs is kept per size. Every program
writes --csv, so nothing here depends on the layout of their printed tables.

Writes into -o DIR:
  compare.csv   one row per (collective, ranks, series, size): median time, algbw, busbw
  runs.csv      every row of every run, with its repetition number
  compare.png   busbw against size (log-log), a panel per (collective, ranks), a line per
                series (gnuplot; skipped with a line saying so when gnuplot is missing)
  compare.md    per (collective, ranks): busbw of every series and best khor / peer ratios,
                and a summary of the ratios
  logs/         each run's output
A peer that is not installed is skipped with a line saying so. Exit status: 0 when every
khor run succeeded with right results, 1 otherwise, 2 for a bad flag. Standard library only.
"""
import argparse
import csv
import math
import os
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
COLLS = ["allreduce", "reduce", "broadcast", "allgather", "reducescatter", "alltoall",
         "gather", "scatter", "barrier"]
PEERS = {  # name: (label, how it runs)
    "mpi-tcp": ("OpenMPI tcp", ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self",
                                "--mca", "btl_tcp_if_include", "lo"]),
    "mpi-shm": ("OpenMPI vader", ["--mca", "pml", "ob1", "--mca", "btl", "vader,self"]),
    "gloo": ("gloo", None),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-c", "--collectives", nargs="+", default=["allreduce"], metavar="COLL",
                   help=f"any of: {' '.join(COLLS)}, or all (default allreduce)")
    p.add_argument("-n", "--nranks", nargs="+", type=int, default=[2, 4], metavar="N")
    p.add_argument("-b", "--minbytes", default="8")
    p.add_argument("-e", "--maxbytes", default="64M")
    p.add_argument("-f", "--stepfactor", default="2")
    p.add_argument("-i", "--iters", default="20", help="timed iterations per size")
    p.add_argument("-w", "--warmup", default="5", help="warm-up iterations per size")
    p.add_argument("-R", "--repeats", type=int, default=3, help="interleaved repetitions")
    p.add_argument("-s", "--stat", choices=["median", "best"], default="median")
    p.add_argument("--khor", nargs="*", default=["tcp", "shm"], metavar="TRANSPORT[:ALGO]",
                   help="khor series (default: tcp shm, algo auto); none: no khor")
    p.add_argument("--peers", nargs="*", default=list(PEERS), metavar="PEER",
                   help=f"peers among {' '.join(PEERS)} (default all); none: no peer")
    p.add_argument("-B", "--build", default="build", help="dir with khorrun, khor-bench, "
                   "mpi-bench (default build)")
    p.add_argument("-o", "--out", default="compare-out", help="output dir (default compare-out)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per run (default 1800)")
    p.add_argument("extra", nargs="*",
                   help="after --: flags for every benchmark (-d, -o, --offset)")
    a = p.parse_args()
    a.khor_failed = False  # a khor series that failed its probe for a reason but absence
    if "all" in a.collectives:
        a.collectives = list(COLLS)
    for c in a.collectives:
        if c not in COLLS:
            p.error(f"unknown collective '{c}': choose from {' '.join(COLLS)} or all")
    a.khor = [] if a.khor == ["none"] else a.khor
    a.peers = [] if a.peers == ["none"] else a.peers
    for peer in a.peers:
        if peer not in PEERS:
            p.error(f"unknown peer '{peer}': choose from {' '.join(PEERS)} or none")
    if a.repeats < 1 or any(n < 1 for n in a.nranks):
        p.error("-R and -n need positive integers")
    if not a.khor and not a.peers:
        p.error("nothing to run: no khor series and no peer")
    return a


def say(msg):
    print(f"# [compare] {msg}", file=sys.stderr, flush=True)


class Series:
    """One line of the plot: a library with one transport/algorithm, and how to start it."""

    def __init__(self, key, label, is_khor, argv_for):
        self.key, self.label, self.is_khor, self.argv_for = key, label, is_khor, argv_for
        self.dead = set()  # (coll, n) where it failed: not run again there


def make_series(a):
    khor, peers = [], []
    build = os.path.abspath(a.build)
    if a.khor:
        missing = [x for x in ("khorrun", "khor-bench") if not os.access(f"{build}/{x}", os.X_OK)]
        if missing:
            sys.exit(f"compare.py: {build}/{missing[0]} not found; build it first "
                     f"(cmake --build {a.build})")
        for spec in a.khor:
            transport, _, algo = spec.partition(":")
            algo = algo or "auto"
            # A transport this build or host lacks (shm not built, no RDMA device) is a
            # missing series, like a missing peer: find out with a 2-rank barrier.
            probe = subprocess.run([f"{build}/khorrun", "-np", "2", f"{build}/khor-bench",
                                    "barrier", "--transport", transport, "--algo", algo,
                                    "-n", "1", "-w", "0"], capture_output=True, text=True,
                                   timeout=120)
            if probe.returncode != 0:
                why = [ln for ln in probe.stderr.splitlines() if "khor-bench" in ln]
                say(f"skipping khor {transport}/{algo}: "
                    + (why[0].split(": ", 2)[-1] if why else f"status {probe.returncode}"))
                if "not supported" not in probe.stderr:
                    a.khor_failed = True
                continue
            khor.append(Series(f"khor-{transport}-{algo}", f"khor {transport}/{algo}", True,
                               lambda n, t=transport, al=algo: [
                                   f"{build}/khorrun", "-np", str(n), f"{build}/khor-bench",
                                   "--transport", t, "--algo", al]))
    for peer in a.peers:
        label, mca = PEERS[peer]
        if mca is not None:
            mpirun = shutil.which("mpirun")
            if not mpirun:
                say(f"skipping {label}: no mpirun (apt-get install openmpi-bin)")
                continue
            if not os.access(f"{build}/mpi-bench", os.X_OK):
                say(f"skipping {label}: {build}/mpi-bench not built "
                    "(apt-get install libopenmpi-dev, then cmake --build)")
                continue
            root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
            peers.append(Series(peer, label, False, lambda n, m=mca, r=root, mr=mpirun: [
                mr, "--oversubscribe", *r, *m, "-np", str(n), f"{build}/mpi-bench"]))
        else:
            py = "/usr/bin/python3"
            probe = subprocess.run([py, "-c", "import torch.distributed as d; "
                                    "assert d.is_gloo_available(); print(__import__('torch')"
                                    ".__version__)"], capture_output=True, text=True,
                                   timeout=300) if os.access(py, os.X_OK) else None
            if probe is None or probe.returncode != 0:
                say("skipping gloo: /usr/bin/python3 cannot import torch.distributed with gloo "
                    "(apt-get install python3-torch)")
                continue
            peers.append(Series(peer, f"gloo (torch {probe.stdout.strip()})", False,
                                lambda n, p=py: [p, f"{HERE}/peers/gloo_bench.py", "--np",
                                                 str(n)]))
    # khor, peer, khor, peer...: neighbours in time are the pairs being compared.
    order = []
    for i in range(max(len(khor), len(peers))):
        order += khor[i:i + 1] + peers[i:i + 1]
    return order


def bench_flags(a):
    return ["-b", a.minbytes, "-e", a.maxbytes, "-f", a.stepfactor, "-n", a.iters,
            "-w", a.warmup] + a.extra


def applicable(flags, coll):
    """Drops -d, -o and -r where they do not apply: the benchmarks refuse them there, and
    one --extra list serves every collective of the comparison."""
    drop = set()
    if coll == "barrier":
        drop |= {"-d", "-b", "-e", "-f"}
    if coll not in ("allreduce", "reduce", "reducescatter"):
        drop.add("-o")
    if coll not in ("reduce", "broadcast", "gather", "scatter"):
        drop.add("-r")
    out, i = [], 0
    while i < len(flags):
        if flags[i] in drop:
            i += 2
        else:
            out.append(flags[i])
            i += 1
    return out


def run_one(a, s, coll, n, rep, logdir):
    """Runs one sweep; returns its CSV rows, or None after saying why it failed."""
    base = os.path.join(logdir, f"{coll}-n{n}-{s.key}-r{rep}")
    flags = applicable(bench_flags(a), coll)
    cmd = s.argv_for(n) + [coll] + flags + ["--csv", base + ".csv", "-q"]
    t0 = time.monotonic()
    with open(base + ".log", "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT,
                                timeout=a.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    took = time.monotonic() - t0
    if rc != 0:
        with open(base + ".log") as f:
            lines = f.read().splitlines()[1:]
        # The programs' own lines name the cause; launcher noise and usage text follow them.
        why = [ln for ln in lines if "bench" in ln or "khorrun" in ln] or lines[-5:]
        provide = [ln for ln in why if "does not provide" in ln]
        if rc == 2 and provide:
            say(f"{s.label}, {coll}, {n} ranks: skipped: {provide[0].split(': ', 1)[-1]}")
            return None
        say(f"{s.label}, {coll}, {n} ranks, run {rep}: failed (status {rc}) after {took:.0f} s; "
            f"skipping it for this collective and rank count. Log: {base}.log")
        for ln in why[:6]:
            print(f"#     {ln}", file=sys.stderr)
        return None
    with open(base + ".csv") as f:
        rows = list(csv.DictReader(f))
    say(f"{coll}, {n} ranks, run {rep}/{a.repeats}: {s.label} {took:.1f} s")
    return rows


def human(b):
    """8, 4K, 64M: exact only; a size that is not a whole K, M or G stays in bytes."""
    b = int(b)
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if b >= 1 << shift and b % (1 << shift) == 0:
            return f"{b >> shift}{unit}"
    return str(b)


def summarise(samples, stat):
    """The chosen time, and the busbw and algbw that go with it (both are size/time x k)."""
    pick = min if stat == "best" else statistics.median
    t = pick([float(r["time_us"]) for r in samples])
    ref = samples[0]
    k = float(ref["time_us"]) / t if t > 0 else 0.0
    return t, float(ref["algbw_gbs"]) * k, float(ref["busbw_gbs"]) * k


def write_plot(a, order, table, panels, out):
    """compare.png with gnuplot: one panel per (collective, ranks), one line per series."""
    gp = shutil.which("gnuplot")
    if not gp:
        say("no PNG: gnuplot not found (apt-get install gnuplot-nox)")
        return
    panels = [p for p in panels if p[0] != "barrier"]  # one point, no sizes: table only
    if not panels:
        return
    datdir = os.path.join(out, "plot-data")
    os.makedirs(datdir, exist_ok=True)
    cols = len(a.nranks)
    rows = math.ceil(len(panels) / cols)
    script = [f"set terminal pngcairo size {600 * cols},{480 * rows} font 'sans,10'",
              "set output 'compare.png'",  # run in out: the script names no absolute path
              f"set multiplot layout {rows},{cols} title 'busbw against size, "
              f"{a.stat} of {a.repeats} interleaved run(s)' font 'sans,12'",
              "set logscale x 2", "set logscale y 10", "set format y '%g'",
              "set grid xtics ytics lc rgb '#dddddd'",
              "set xlabel 'size (bytes)'", "set ylabel 'busbw (GB/s)'",
              "set key outside below font 'sans,9' maxrows 3"]
    # Fixed colours per series across panels; peers dashed, khor solid.
    palette = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
               "#17becf", "#7f7f7f"]
    for coll, n in panels:
        sizes = sorted({sz for (c, nn, _k, sz) in table if c == coll and nn == n})
        if not sizes:
            continue
        tics = ", ".join(f"'{human(sz)}' {sz}" for sz in sizes)
        script += [f"set title '{coll}, {n} ranks{', ' + ' '.join(a.extra) if a.extra else ''}'",
                   f"set xtics ({tics}) rotate by -45", f"set xrange [{sizes[0] / 1.5}:"
                                                          f"{sizes[-1] * 1.5}]"]
        plots = []
        for i, s in enumerate(order):
            pts = [(sz, table[(coll, n, s.key, sz)][2]) for sz in sizes
                   if (coll, n, s.key, sz) in table and table[(coll, n, s.key, sz)][2] > 0]
            if not pts:
                continue
            dat = os.path.join(datdir, f"{coll}-n{n}-{s.key}.dat")
            with open(dat, "w") as f:
                f.writelines(f"{sz} {bw:.6g}\n" for sz, bw in pts)
            dash = 1 if s.is_khor else 2
            plots.append(f"'{os.path.relpath(dat, out)}' using 1:2 with linespoints lw 2 pt {7 if s.is_khor else 5} "
                         f"ps 0.8 dt {dash} lc rgb '{palette[i % len(palette)]}' "
                         f"title '{s.label}'")
        if plots:
            script.append("plot " + ", ".join(plots))
    script.append("unset multiplot")
    r = subprocess.run([gp], input="\n".join(script) + "\n", capture_output=True, text=True,
                       cwd=out)
    if r.returncode != 0:
        say(f"gnuplot failed, no PNG: {r.stderr.strip()[-500:]}")
    else:
        with open(os.path.join(out, "compare.gp"), "w") as f:
            f.write("\n".join(script) + "\n")


def write_markdown(a, order, table, panels, what, out):
    khor = [s for s in order if s.is_khor]
    peers = [s for s in order if not s.is_khor]
    md = [f"# khor vs peers: {a.stat} of {a.repeats} interleaved run(s) per size",
          "",
          f"Sweep: `-b {a.minbytes} -e {a.maxbytes} -f {a.stepfactor} -n {a.iters} "
          f"-w {a.warmup}{' ' + ' '.join(a.extra) if a.extra else ''}`, host `{os.uname()[1]}`, "
          f"{os.cpu_count()} CPUs. busbw in GB/s (barrier: time in us). "
          "Ratio = peer time / best khor time = best khor busbw / peer busbw: "
          "above 1, khor is faster.", ""]
    summary = []
    sections = []
    for coll, n in panels:
        sizes = sorted({sz for (c, nn, _k, sz) in table if c == coll and nn == n})
        if not sizes:
            continue
        present = [s for s in order if any((coll, n, s.key, sz) in table for sz in sizes)]
        kp = [s for s in present if s.is_khor]
        pp = [s for s in present if not s.is_khor]
        use_time = coll == "barrier"
        sec = [f"## {what.get((coll, n), coll)}, {n} ranks", ""]
        head = ["size"] + [s.label for s in present]
        if kp:
            head.append("best khor")
        head += [f"khor/{p.key}" for p in pp if kp]
        sec.append("| " + " | ".join(head) + " |")
        sec.append("|" + "---:|" * (len(head) - (1 if kp else 0)) + ("---|" if kp else ""))
        if kp:  # the best-khor name column is text: left-aligned, placed after the numbers
            sec[-1] = "|" + "---:|" * (1 + len(present)) + "---|" + "---:|" * len(pp)
        ratios = {p.key: [] for p in pp}
        for sz in sizes:
            cells = [human(sz)]
            for s in present:
                v = table.get((coll, n, s.key, sz))
                cells.append("-" if v is None else f"{v[0]:.1f}" if use_time else f"{v[2]:.3g}")
            best = min(((table[(coll, n, s.key, sz)][0], s) for s in kp
                        if (coll, n, s.key, sz) in table), default=None, key=lambda x: x[0])
            if kp:
                cells.append(best[1].label.replace("khor ", "") if best else "-")
                for p in pp:
                    v = table.get((coll, n, p.key, sz))
                    if best and v and best[0] > 0:
                        r = v[0] / best[0]
                        ratios[p.key].append((r, sz))
                        txt = f"{r:.2f}" if r >= 0.1 else f"{r:.2g}"
                        cells.append(f"**{txt}**" if r < 1 else txt)
                    else:
                        cells.append("-")
            sec.append("| " + " | ".join(cells) + " |")
        sections += sec + [""]
        for p in pp:
            rs = ratios[p.key]
            if rs:
                g = math.exp(sum(math.log(r) for r, _ in rs) / len(rs))
                lo, hi = min(rs), max(rs)
                at = (lambda sz: "") if coll == "barrier" else (lambda sz: f" at {human(sz)}")
                r2 = (lambda r: f"{r:.2f}" if r >= 0.1 else f"{r:.2g}")
                summary.append(f"| {coll} | {n} | {p.label} | {r2(g)} | {r2(lo[0])}{at(lo[1])} "
                               f"| {r2(hi[0])}{at(hi[1])} |")
    if summary:
        md += ["## Summary: best khor / peer over the sizes", "",
               "| collective | ranks | peer | geometric mean | lowest | highest |",
               "|---|---:|---|---:|---:|---:|"] + summary + [""]
    md += sections
    if not khor:
        md.append("(no khor series ran, so there are no ratios)")
    md.append("Bold: the peer was faster. Series that failed or were skipped are absent; "
              "see the run's stderr and logs/.")
    with open(os.path.join(out, "compare.md"), "w") as f:
        f.write("\n".join(md) + "\n")


def main():
    a = parse_args()
    order = make_series(a)
    if not order:
        sys.exit("compare.py: nothing to run: every series was skipped")
    out = os.path.abspath(a.out)
    logdir = os.path.join(out, "logs")
    os.makedirs(logdir, exist_ok=True)
    for old in ("compare.png", "compare.gp"):  # never leave a stale plot beside new numbers
        if os.path.exists(os.path.join(out, old)):
            os.unlink(os.path.join(out, old))
    say("series, in run order: " + ", ".join(s.label for s in order))

    samples = {}  # (coll, n, series, size) -> rows
    what = {}     # (coll, n) -> "allreduce float sum"
    status = 1 if a.khor_failed else 0
    with open(os.path.join(out, "runs.csv"), "w", newline="") as rf:
        raw = None
        for n in a.nranks:
            for coll in a.collectives:
                for rep in range(1, a.repeats + 1):
                    for s in order:
                        if (coll, n) in s.dead:
                            continue
                        rows = run_one(a, s, coll, n, rep, logdir)
                        if rows is None or any(int(r["wrong"]) > 0 for r in rows):
                            if rows is not None:
                                say(f"{s.label}, {coll}, {n} ranks, run {rep}: WRONG results; "
                                    "dropped")
                            s.dead.add((coll, n))
                            if s.is_khor:
                                status = 1
                            for key in [k for k in samples if k[:3] == (coll, n, s.key)]:
                                del samples[key]
                            continue
                        for r in rows:
                            if raw is None:
                                raw = csv.DictWriter(rf, ["series", "repeat"] + list(r))
                                raw.writeheader()
                            raw.writerow({"series": s.label, "repeat": rep, **r})
                            samples.setdefault((coll, n, s.key, int(r["size"])), []).append(r)
                            desc = coll
                            if r["type"] != "none":
                                desc += f" {r['type']}"
                            if r["redop"] != "none":
                                desc += f" {r['redop']}"
                            what[(coll, n)] = desc
                        rf.flush()

    table = {k: summarise(v, a.stat) for k, v in samples.items()}
    labels = {s.key: s for s in order}
    with open(os.path.join(out, "compare.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["collective", "nranks", "series", "library", "transport", "algo", "size",
                    "count", "type", "redop", f"time_us_{a.stat}", "algbw_gbs", "busbw_gbs",
                    "runs"])
        for key in sorted(table, key=lambda k: (a.collectives.index(k[0]), k[1],
                                                 [s.key for s in order].index(k[2]), k[3])):
            coll, n, skey, sz = key
            first = samples[key][0]
            t, algbw, busbw = table[key]
            w.writerow([coll, n, labels[skey].label, first["library"], first["transport"],
                        first["algo"], sz, first["count"], first["type"], first["redop"],
                        f"{t:.6g}", f"{algbw:.6g}", f"{busbw:.6g}", len(samples[key])])
    panels = [(c, n) for c in a.collectives for n in a.nranks]
    write_plot(a, order, table, panels, out)
    write_markdown(a, order, table, panels, what, out)
    say(f"wrote {out}/compare.csv, runs.csv, compare.md"
        + (", compare.png" if os.path.exists(os.path.join(out, "compare.png")) else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
