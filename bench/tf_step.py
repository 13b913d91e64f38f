#!/usr/bin/env python3
"""tf_step.py -- Keras training steps under model.fit: khor.tensorflow.keras's
DistributedOptimizer against TensorFlow's own multi-worker choice,
tf.distribute.MultiWorkerMirroredStrategy (MWMS, its ring collectives over gRPC), in the
same job; and khor's TF allreduce of one flat buffer against khor's C allreduce of the same
bytes.

  python3 bench/tf_step.py --np 2,4 --out docs/data/tf_step       # the driver (below)
  khorrun -np 2 $TF_PYTHON bench/tf_step.py --worker --model cnn   # one job by hand

The driver (no --worker) runs, for each n of --np, one job `khorrun -np n <python>
tf_step.py --worker ...` and, around it, --c-rounds runs of `khorrun -np n khor-bench
allreduce` of the flat buffer's bytes (C, the direct API, its own buffers), each under
--timeout (the whole process group is killed past it); then it prints the summary with
the ratios and PASS/MISS verdicts. Raw output (each job's stdout and stderr, the JSON of
each worker job and of khor-bench) goes to --out.

In a worker job every rank is both a khor rank and an MWMS worker: khor.init() first, the
ranks swap free localhost ports through khor (allgather), set TF_CONFIG (cluster "worker"
of those ports, task index = rank), create MultiWorkerMirroredStrategy with
CommunicationOptions(implementation=RING), then start khor.tensorflow. Per model
(ResNet-50 from keras.applications, weights=None: 25.6 M trainable parameters in 214
tensors, torchvision's 161 and the biases of the 53 convolutions, which Keras's have;
batch 8 per rank at 224 x 224;
and/or the CNN of examples/tensorflow/keras_mnist.py at MNIST's 28 x 28 x 1, batch 32) it
builds three copies from the same seed: one compiled with hvd.DistributedOptimizer, one
inside strategy.scope() (Keras all-reduces the gradients through the strategy, as
replica_context.all_reduce(SUM, grads)), one plain (no communication: compute alone). All
use SGD(0.01, momentum 0.9) and the same synthetic data per rank, jit_compile off.
The modes run interleaved, in blocks of --block steps, round after round:
  khor-fit     model.fit of --block steps, hvd.DistributedOptimizer (one allreduce op per
               gradient, as Horovod)
  mwms-fit     model.fit of --block steps under the strategy (global batch = n x batch;
               the strategy hands each worker its batch)
  local-fit    model.fit of the plain copy: the same compute with no communication
  khor-grads   the model's gradient tensors (shapes and dtype of its trainable weights;
               random, different per rank) through hvd.grouped_allreduce (Average), in a
               tf.function
  khor-pertensor  the same list, one hvd.allreduce per tensor in one tf.function (what
               the DistributedOptimizer does inside model.fit)
  mwms-grads   the same list through the strategy: strategy.run of
               replica_context.all_reduce(SUM, list) in a tf.function (what Keras does
               under MWMS)
  tf-flat      all the gradient bytes as one flat float32 tensor through hvd.allreduce
               (the TF op), in a tf.function; the input is held (by Python), so the op
               writes a new output tensor: out of place
  np-flat      the same bytes through the khor package (the same engine, by ctypes, no
               TensorFlow) from a numpy array into another one held across calls: out of
               place, the same buffers every call, as khor-bench's C allreduce
  tf-flat-temp hvd.allreduce(flat * s) in a tf.function (s a tf.Variable holding 1.0): the
               op's input is a temporary, which the op reduces in place (TensorFlow hands
               its buffer over)
  scale-alone  flat * s alone: tf-flat-temp less this is the TF op in place
  np-flat-inplace  the khor package's allreduce in place (inplace=True), for that
  mwms-flat    the flat tensor through the strategy's all_reduce (for reference)
Times are per step (or call), the slowest rank's, median of the timed steps; a fit step is
the time from Keras's on_train_batch_begin to on_train_batch_end. img/s: the images of all
ranks per step over the step time. Communication per step is given two ways: the
gradients' collective alone (*-grads), and fit step less local-fit (what communication
adds to a step). Before timing, khor-grads and mwms-grads of the same inputs must agree
(mwms's sum / n against khor's average, rtol 1e-5), and so must tf-flat and np-flat
(#wrong counts the tensors that differ, over all ranks; exit status 1 when any do).

Two things Keras 3 (3.15) needs under MWMS to run model.fit at all, patched here and
nowhere else: its symbolic build reduces the first data batch (a tuple) through the
strategy, which MWMS refuses ("Attempt to convert a value (PerReplica...)"): the MWMS copy
is built from one local batch instead; and its per-step logs are reduced with axis=0,
which fails for MWMS's scalar metrics ("Invalid reduction dimension 0 for input with 0
dimensions"): scalars are reduced with axis=None (one small all-reduce per metric per
step, as Keras intends).

Exit status: 0 on success, 1 on a wrong result, an error or a timeout, 2 for a bad flag.
"""
import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DEFAULT_BATCH = {"resnet50": 8, "cnn": 32}
FIT_MODES = ["khor-fit", "mwms-fit", "local-fit"]
COMM_MODES = ["khor-grads", "khor-pertensor", "mwms-grads", "tf-flat", "np-flat",
              "tf-flat-temp", "scale-alone", "np-flat-inplace", "mwms-flat"]
MODES = FIT_MODES + COMM_MODES
TF_PYTHON = "/var/cache/khor-tf-venv/bin/python"


def log(msg):
    sys.stderr.write("tf_step %s: %s\n" % (time.strftime("%H:%M:%S"), msg))
    sys.stderr.flush()


def positive(s):
    v = int(s)
    if v < 1:
        raise argparse.ArgumentTypeError("'%s': it needs a positive number" % s)
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", action="store_true",
                   help="be one rank of a worker job (under khorrun); without it: the driver")
    p.add_argument("--model", choices=["resnet50", "cnn", "both"], default="both")
    p.add_argument("--batch", type=positive,
                   help="images per rank per step (default: resnet50 8, cnn 32)")
    p.add_argument("--steps", type=positive, default=6, help="timed steps per mode (6)")
    p.add_argument("--warmup", type=int, default=2,
                   help="untimed steps per mode first (2; the first fit traces its step)")
    p.add_argument("--block", type=positive, default=2,
                   help="steps of one mode before the next mode's turn (2)")
    p.add_argument("--image-size", type=positive, default=224, help="ResNet-50's input (224)")
    p.add_argument("--threads", type=positive,
                   help="TensorFlow intra-op threads per rank (default: 1 with 2 or more "
                        "ranks); inter-op threads: 2")
    p.add_argument("--comm-only", action="store_true",
                   help="only the collectives' modes, no model.fit (a quick look)")
    p.add_argument("--json", metavar="FILE", help="worker: also write the run as JSON (rank 0)")
    # driver
    p.add_argument("--np", default="2,4", help="driver: the job sizes, a list (2,4)")
    p.add_argument("--out", metavar="DIR", help="driver: where the raw output goes "
                   "(default: a new directory under /tmp)")
    p.add_argument("--python", default=TF_PYTHON,
                   help="driver: the Python with TensorFlow (%s)" % TF_PYTHON)
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="driver: the build tree with khorrun, khor-bench, libkhor.so and "
                        "libkhor_tf.so (%(default)s)")
    p.add_argument("--c-rounds", type=positive, default=3,
                   help="driver: khor-bench allreduce runs per n, before and after the "
                        "worker job (3: two before, one after)")
    p.add_argument("--c-iters", type=positive, default=10,
                   help="driver: khor-bench's timed iterations per run (10)")
    p.add_argument("--timeout", type=positive, default=1500,
                   help="seconds for each job (1500); the collectives' own timeout is 300 s")
    args = p.parse_args(argv)
    if args.warmup < 0:
        p.error("--warmup needs 0 or more")
    try:
        args.np_list = [int(x) for x in args.np.split(",") if x]
        if not args.np_list or min(args.np_list) < 1:
            raise ValueError
    except ValueError:
        p.error("--np takes a list of positive numbers, e.g. 2,4")
    return args


# ---------------------------------------------------------------------------- worker ----

def free_port():
    with socket.socket() as s:  # a free port; the tiny race with another binder is accepted
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patch_keras_for_mwms(tf, strategy):
    """Keras 3.15's reduce of per-step logs under MWMS uses axis=0, which its scalar metrics
    do not have; reduce scalars with axis=None (the module docstring)."""
    import keras.src.backend.tensorflow.trainer as ktr
    orig = ktr.reduce_per_replica

    def reduce_per_replica(values, strategy_, reduction="auto"):
        if reduction in ("auto", "mean") and ktr._collective_all_reduce_multi_worker(strategy_):
            def one(v):
                if getattr(getattr(v, "shape", None), "rank", None) == 0:
                    return strategy_.reduce("MEAN", v, axis=None)
                return orig(v, strategy_, reduction)
            return tf.nest.map_structure(one, values)
        return orig(values, strategy_, reduction)

    ktr.reduce_per_replica = reduce_per_replica


def build_once(model, strategy, sample):
    """Keras 3.15 builds a model under a strategy from the first batch reduced through the
    strategy, which MWMS cannot do for a tuple: build it from one local batch instead."""
    def build(iterator=None, data_batch=None):
        with strategy.scope():
            model._symbolic_build(data_batch=sample)
    model._maybe_symbolic_build = build


class Timer:
    """A Keras callback: each batch's time, on_train_batch_begin to on_train_batch_end."""

    def __init__(self, keras):
        class T(keras.callbacks.Callback):
            def on_train_batch_begin(cb, batch, logs=None):
                cb.t0 = time.perf_counter()

            def on_train_batch_end(cb, batch, logs=None):
                self.times.append(time.perf_counter() - cb.t0)
        self.times = []
        self.callback = T()


class Bench:
    """One model's three copies, its data, and the step and collective functions."""

    def __init__(self, ctx, name, args):
        tf, keras, hvd, st, np = ctx.tf, ctx.keras, ctx.hvd, ctx.strategy, ctx.np
        self.ctx, self.name = ctx, name
        self.batch = args.batch or DEFAULT_BATCH[name]
        n, rank = hvd.size(), hvd.rank()

        def build():
            keras.utils.set_random_seed(1234)
            if name == "resnet50":
                m = keras.applications.ResNet50(weights=None, input_shape=(
                    args.image_size, args.image_size, 3), classes=1000)
                return m, 1000
            sys.path.insert(0, os.path.join(ROOT, "examples", "tensorflow"))
            from keras_mnist import build_model
            return build_model(keras, (28, 28, 1)), 10

        def sgd():
            return keras.optimizers.SGD(0.01, momentum=0.9)

        loss = "sparse_categorical_crossentropy"
        self.khor_model, classes = build()
        self.khor_model.compile(optimizer=ctx.hk.DistributedOptimizer(sgd()), loss=loss,
                                jit_compile=False)
        # Keras 3's variables hold their tf.Variable as .value (broadcast_variables takes
        # tf.Variables)
        hvd.broadcast_variables([getattr(v, "value", v) for v in self.khor_model.variables],
                                root_rank=0)
        with st.scope():
            self.mwms_model, _ = build()
            self.mwms_model.compile(optimizer=sgd(), loss=loss, jit_compile=False)
        self.local_model, _ = build()
        self.local_model.compile(optimizer=sgd(), loss=loss, jit_compile=False)

        shape = tuple(self.khor_model.input_shape[1:])
        gen = np.random.default_rng(1000 + rank)
        x = gen.random((self.batch,) + shape, dtype=np.float32)
        y = gen.integers(0, classes, self.batch).astype(np.int64)
        self.ds = tf.data.Dataset.from_tensors((x, y)).repeat()
        # the strategy's input: the global batch, of which each worker gets its n-th (all
        # workers read the same; auto-sharding off, since from_tensors has no files)
        xg = np.concatenate([x] * n)
        yg = np.concatenate([y] * n)
        opts = tf.data.Options()
        opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        self.gds = tf.data.Dataset.from_tensors((xg, yg)).repeat().with_options(opts)
        build_once(self.mwms_model, st, (tf.constant(x), tf.constant(y)))

        weights = self.khor_model.trainable_weights
        self.tensors = len(weights)
        self.numel = int(sum(int(np.prod(w.shape)) for w in weights))
        self.grads = [tf.constant(gen.standard_normal(tuple(w.shape), dtype=np.float32))
                      for w in weights]
        self.flat = tf.constant(gen.standard_normal(self.numel, dtype=np.float32))
        self.flat_np = self.flat.numpy().copy()
        self.flat_np_out = np.empty_like(self.flat_np)
        self.flat_np_in = self.flat_np.copy()
        self.one = tf.Variable(1.0)

        Average, Sum = hvd.Average, ctx.tf.distribute.ReduceOp.SUM

        @tf.function
        def khor_grads(ts):
            return hvd.grouped_allreduce(ts, op=Average, name="tf_step.%s.grads" % name)

        @tf.function
        def khor_pertensor(ts):
            return [hvd.allreduce(t, op=Average, name="tf_step.%s.g%d" % (name, i))
                    for i, t in enumerate(ts)]

        @tf.function
        def tf_flat(t):
            return hvd.allreduce(t, op=Average, name="tf_step.%s.flat" % name)

        @tf.function
        def tf_flat_temp(t):
            return hvd.allreduce(t * self.one, op=Average, name="tf_step.%s.temp" % name)

        @tf.function
        def scale_alone(t):
            return t * self.one

        def replica_all_reduce(ts):
            # identity places the inputs on the replica's device (all_reduce takes its
            # destinations from there); on the CPU it forwards the buffer, no copy
            return tf.distribute.get_replica_context().all_reduce(
                Sum, [tf.identity(t) for t in ts])

        @tf.function
        def mwms_reduce(ts):
            return st.run(replica_all_reduce, args=(ts,))

        self.fns = dict(khor_grads=khor_grads, khor_pertensor=khor_pertensor,
                        tf_flat=tf_flat, tf_flat_temp=tf_flat_temp, scale_alone=scale_alone,
                        mwms_reduce=mwms_reduce)

    def fit(self, model, data, steps):
        t = Timer(self.ctx.keras)
        model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False,
                  callbacks=[t.callback])
        if len(t.times) != steps:
            raise RuntimeError("model.fit ran %d batches, not %d" % (len(t.times), steps))
        return t.times

    def timed(self, fn, steps):
        out = []
        for _ in range(steps):
            t0 = time.perf_counter()
            fn()  # eager tf.function calls return once their ops have run
            out.append(time.perf_counter() - t0)
        return out

    def run(self, mode, steps):
        f, np_ = self.fns, self.ctx.khor_np
        if mode == "khor-fit":
            return self.fit(self.khor_model, self.ds, steps)
        if mode == "mwms-fit":
            return self.fit(self.mwms_model, self.gds, steps)
        if mode == "local-fit":
            return self.fit(self.local_model, self.ds, steps)
        if mode == "khor-grads":
            return self.timed(lambda: f["khor_grads"](self.grads), steps)
        if mode == "khor-pertensor":
            return self.timed(lambda: f["khor_pertensor"](self.grads), steps)
        if mode == "mwms-grads":
            return self.timed(lambda: f["mwms_reduce"](self.grads), steps)
        if mode == "tf-flat":
            return self.timed(lambda: f["tf_flat"](self.flat), steps)
        if mode == "mwms-flat":
            return self.timed(lambda: f["mwms_reduce"]([self.flat]), steps)
        if mode == "np-flat":
            return self.timed(self.np_flat_out, steps)
        if mode == "tf-flat-temp":
            return self.timed(lambda: f["tf_flat_temp"](self.flat), steps)
        if mode == "scale-alone":
            return self.timed(lambda: f["scale_alone"](self.flat), steps)
        if mode == "np-flat-inplace":
            return self.timed(lambda: np_.synchronize(np_.allreduce_async(
                self.flat_np_in, op=np_.Average, name="tf_step.%s.npin" % self.name,
                inplace=True)), steps)
        raise ValueError(mode)

    def np_flat_out(self):
        """The khor package's allreduce into a held output array (its public allreduce
        makes a new one each call; this is the same enqueue with the output given)."""
        khor = self.ctx.khor_np
        from khor import _core, _buf
        out = self.flat_np_out
        return khor.synchronize(_core.enqueue_allreduce(
            ["tf_step.%s.npflat" % self.name], [_buf(self.flat_np)], [_buf(out)],
            khor.Average, 1.0, 1.0, khor.global_process_set, lambda p: out, None))

    def check(self):
        """Tensors whose result differs: khor-grads against mwms-grads / n, khor-pertensor
        against khor-grads, tf-flat against np-flat (on a copy of the same input). The
        total over the ranks."""
        np, n = self.ctx.np, self.ctx.hvd.size()

        def close(a, b):
            return np.allclose(a, b, rtol=1e-5, atol=1e-6)
        k = [t.numpy() for t in self.fns["khor_grads"](self.grads)]
        p = [t.numpy() for t in self.fns["khor_pertensor"](self.grads)]
        m = [t.numpy() / n for t in self.fns["mwms_reduce"](self.grads)]
        tf_out = self.fns["tf_flat"](self.flat).numpy()
        temp_out = self.fns["tf_flat_temp"](self.flat).numpy()
        np_out = self.np_flat_out().copy()
        # per check, the tensors that differ: sums in another order (n > 2: a grouped
        # allreduce fuses small tensors, which then take another algorithm than alone) are
        # allowed float32's rounding, not bit equality
        counts = {
            "mwms-grads vs khor-grads": sum(not close(a, b) for a, b in zip(k, m)),
            "khor-pertensor vs khor-grads": sum(not close(a, b) for a, b in zip(k, p)),
            "np-flat vs tf-flat": int(not close(tf_out, np_out)),
            "tf-flat-temp vs tf-flat": int(not close(tf_out, temp_out)),
            # the held input is still this rank's own (an in-place op must not reach it)
            "tf-flat's input unchanged": int(not np.array_equal(self.flat.numpy(),
                                                                 self.flat_np)),
        }
        totals = over_ranks(self.ctx, list(counts.values()), "sum")
        self.wrong_by_check = dict(zip(counts, [int(x) for x in totals]))
        if self.ctx.rank == 0 and any(totals):
            log("%s: results that differ, summed over the ranks: %s"
                % (self.name, self.wrong_by_check))
        wrong = sum(counts.values())
        return int(over_ranks(self.ctx, [wrong], "sum")[0])


def over_ranks(ctx, samples, how="max"):
    """Per sample, the largest (min: smallest; sum: the total) of the ranks' values."""
    np, khor = ctx.np, ctx.khor_np
    op = {"max": khor.Max, "min": khor.Min, "sum": khor.Sum}[how]
    a = np.asarray(samples, dtype=np.float64)
    return khor.allreduce(a, op=op, name="tf_step.over_ranks").tolist()


def measure(ctx, bench, args):
    """{mode: [s...]} of the slowest rank per step, the modes interleaved in blocks."""
    modes = COMM_MODES if args.comm_only else MODES
    for mode in modes:
        log("%s: warm-up %s" % (bench.name, mode)) if ctx.rank == 0 else None
        if args.warmup:
            bench.run(mode, args.warmup)
    out = {m: [] for m in modes}
    rnd = 0
    while len(out[modes[0]]) < args.steps:
        k = min(args.block, args.steps - len(out[modes[0]]))
        rnd += 1
        for mode in modes:
            ctx.khor_np.barrier()
            out[mode] += over_ranks(ctx, bench.run(mode, k))
        if ctx.rank == 0:
            log("%s: round %d: %s" % (bench.name, rnd, ", ".join(
                "%s %.1f ms" % (m, 1e3 * statistics.median(out[m])) for m in modes)))
    return out


class Ctx:
    pass


def worker(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import khor

    khor.init()
    rank, size = khor.rank(), khor.size()
    ports = khor.allgather(np.array([free_port()], np.int64), name="tf_step.ports").tolist()
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": ["127.0.0.1:%d" % p for p in ports]},
        "task": {"type": "worker", "index": rank}})
    import tensorflow as tf
    threads = args.threads or (1 if size > 1 else 0)
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(2)
    impl = tf.distribute.experimental.CommunicationImplementation.RING
    comm_opts = tf.distribute.experimental.CommunicationOptions(implementation=impl,
                                                                timeout_seconds=300.0)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=comm_opts)
    if strategy.num_replicas_in_sync != size:
        raise RuntimeError("MWMS has %d replicas, khor %d ranks"
                           % (strategy.num_replicas_in_sync, size))
    import keras
    import khor.tensorflow as hvd
    import khor.tensorflow.keras as hk
    hvd.init()
    patch_keras_for_mwms(tf, strategy)
    ctx = Ctx()
    ctx.tf, ctx.keras, ctx.hvd, ctx.strategy, ctx.np, ctx.khor_np = tf, keras, hvd, strategy, \
        np, khor
    ctx.rank, ctx.hk = rank, hk
    if rank == 0:
        log("worker job: %d ranks, MWMS on ports %s, %s intra-op thread(s) each"
            % (size, ports, threads or "default"))
    names = ["resnet50", "cnn"] if args.model == "both" else [args.model]
    rows, failed = [], 0
    for name in names:
        bench = Bench(ctx, name, args)
        if rank == 0:
            log("%s: %d tensors, %d parameters (%d bytes), batch %d per rank"
                % (name, bench.tensors, bench.numel, 4 * bench.numel, bench.batch))
        wrong = bench.check()
        failed += wrong
        t = measure(ctx, bench, args)
        med = {m: statistics.median(t[m]) for m in t}
        for mode in t:
            row = {"model": name, "mode": mode, "tensors": bench.tensors,
                   "bytes": 4 * bench.numel, "batch": bench.batch, "ms": 1e3 * med[mode],
                   "img_s": None, "fit_less_local_ms": None, "gbps": None, "wrong": wrong,
                   "samples_ms": [1e3 * v for v in t[mode]]}
            if mode in FIT_MODES:
                row["img_s"] = bench.batch * size / med[mode]
            if mode in ("khor-fit", "mwms-fit") and "local-fit" in med:
                row["fit_less_local_ms"] = 1e3 * (med[mode] - med["local-fit"])
            if mode in COMM_MODES:
                row["gbps"] = 4 * bench.numel / med[mode] / 1e9
            row["wrong_by_check"] = bench.wrong_by_check
            rows.append(row)
        del bench
    if rank == 0:
        doc = {"program": "tf_step", "ranks": size, "threads": threads,
               "tensorflow": tf.__version__, "keras": keras.__version__,
               "khor": hvd.__version__ if hasattr(hvd, "__version__") else khor.__version__,
               "steps": args.steps, "warmup": args.warmup, "block": args.block,
               "image_size": args.image_size, "rows": rows}
        report_worker(doc)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=1)
    hvd.shutdown()
    if failed:
        log("rank %d: %d result(s) differ between khor and MWMS or TF and numpy"
            % (rank, failed))
        return 1
    return 0


def report_worker(doc):
    print("# tf_step worker: %d ranks, %s intra-op thread(s) each, steps %d, warmup %d, "
          "block %d; tensorflow %s, keras %s, khor %s"
          % (doc["ranks"], doc["threads"] or "default", doc["steps"], doc["warmup"],
             doc["block"], doc["tensorflow"], doc["keras"], doc["khor"]))
    print("# times: the slowest rank's per step or call, median of the timed ones (ms)")
    cols = [("model", 9), ("mode", 15), ("tensors", 8), ("bytes", 10), ("batch", 6),
            ("ms", 9), ("img/s", 8), ("fit-local", 10), ("GB/s", 6), ("#wrong", 7)]
    print("#" + " ".join("%*s" % (w, c) for c, w in cols))

    def num(v, fmt):
        return "-" if v is None else format(v, fmt)

    for r in doc["rows"]:
        cells = [r["model"], r["mode"], r["tensors"], r["bytes"], r["batch"],
                 num(r["ms"], ".2f"), num(r["img_s"], ".1f"), num(r["fit_less_local_ms"], ".1f"),
                 num(r["gbps"], ".2f"), r["wrong"]]
        print(" " + " ".join("%*s" % (w, v) for v, (_, w) in zip(cells, cols)))
    sys.stdout.flush()


# ---------------------------------------------------------------------------- driver ----

def run_job(cmd, env, timeout, out_prefix):
    """Runs cmd in its own process group, stdout and stderr to out_prefix.{out,err} (and
    stderr's lines echoed); kills the group past timeout. Returns (rc, stdout text)."""
    log("run: %s" % " ".join(cmd))
    with open(out_prefix + ".out", "w") as fo, open(out_prefix + ".err", "w") as fe:
        p = subprocess.Popen(cmd, env=env, stdout=fo, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        deadline = time.monotonic() + timeout
        import selectors
        sel = selectors.DefaultSelector()
        sel.register(p.stderr, selectors.EVENT_READ)
        rc = None
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                log("timeout after %d s: killing the job's process group" % timeout)
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                rc = 124
                break
            if sel.select(timeout=min(left, 5.0)):
                line = p.stderr.readline()
                if line:
                    fe.write(line)
                    fe.flush()
                    if "tf_step " in line or "Error" in line or "khorrun:" in line:
                        sys.stderr.write("  | " + line)
                    continue
            if p.poll() is not None:
                rest = p.stderr.read()
                fe.write(rest)
                rc = p.returncode
                break
    with open(out_prefix + ".out") as f:
        return rc, f.read()


def driver(args):
    out = args.out or "/tmp/tf_step.%d" % os.getpid()
    os.makedirs(out, exist_ok=True)
    khorrun = os.path.join(args.build, "khorrun")
    bench = os.path.join(args.build, "khor-bench")
    env = dict(os.environ)
    env.update(PYTHONPATH=os.path.join(ROOT, "bindings", "python"),
               KHOR_LIBRARY_PATH=os.path.join(args.build, "libkhor.so"),
               KHOR_TF_LIBRARY_PATH=os.path.join(args.build, "libkhor_tf.so"),
               PYTHONDONTWRITEBYTECODE="1", TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    log("driver: n = %s, raw output in %s; load: %s" % (args.np_list, out, uptime()))
    worker_flags = ["--model", args.model, "--steps", str(args.steps), "--warmup",
                    str(args.warmup), "--block", str(args.block), "--image-size",
                    str(args.image_size)]
    if args.batch:
        worker_flags += ["--batch", str(args.batch)]
    if args.threads:
        worker_flags += ["--threads", str(args.threads)]
    if args.comm_only:
        worker_flags += ["--comm-only"]
    results, status = {}, 0
    for n in args.np_list:
        sizes = model_bytes(args)  # checked against the worker's count in summary()
        c = {name: [] for name in sizes}

        def c_round(tag):
            for name, nbytes in sizes.items():
                js = os.path.join(out, "c_allreduce_%s_n%d_%s.json" % (name, n, tag))
                rc, _ = run_job([khorrun, "-np", str(n), bench, "allreduce", "-b", str(nbytes),
                                 "-e", str(nbytes), "-n", str(args.c_iters), "-w", "3",
                                 "-o", "avg", "-q", "--json", js], env, args.timeout,
                                os.path.join(out, "c_allreduce_%s_n%d_%s" % (name, n, tag)))
                if rc != 0:
                    raise RuntimeError("khor-bench allreduce failed (status %d)" % rc)
                c[name].append(c_time_ms(js))

        before = max(1, args.c_rounds - args.c_rounds // 3)
        for i in range(before):
            c_round("r%d" % i)
        js = os.path.join(out, "step_n%d.json" % n)
        rc, text = run_job([khorrun, "-np", str(n), args.python, os.path.abspath(__file__),
                            "--worker", "--json", js] + worker_flags, env, args.timeout,
                           os.path.join(out, "step_n%d" % n))
        sys.stdout.write(text)
        if rc != 0:
            log("worker job at n = %d failed (status %d); see %s/step_n%d.err" % (n, rc, out, n))
            status = 1
            continue
        for i in range(before, args.c_rounds):
            c_round("r%d" % i)
        with open(js) as f:
            results[n] = json.load(f)
        results[n]["c_allreduce_ms"] = c
    log("load after: %s" % uptime())
    if results:
        summary(results)
        with open(os.path.join(out, "summary.json"), "w") as f:
            json.dump({str(k): v for k, v in results.items()}, f, indent=1)
    return status


def uptime():
    try:
        with open("/proc/loadavg") as f:
            return "load average " + " ".join(f.read().split()[:3])
    except OSError:
        return "?"


model_bytes_known = {"resnet50": 4 * 25583592, "cnn": 4 * 1199882}


def model_bytes(args):
    """The flat buffer's bytes per model: 4 x the trainable parameters (Keras's ResNet-50:
    25,583,592 at 1000 classes, any input size; the example's CNN at 28 x 28 x 1:
    1,199,882)."""
    known = model_bytes_known
    names = ["resnet50", "cnn"] if args.model == "both" else [args.model]
    return {n: known[n] for n in names}


def c_time_ms(path):
    """khor-bench's time per call (ms) at its one size, from its JSON."""
    with open(path) as f:
        doc = json.load(f)
    rows = doc.get("rows") or doc.get("results") or []
    row = rows[0]
    for key in ("time_us", "avg_us", "us"):
        if key in row:
            return row[key] / 1e3
    raise KeyError("no time in %s: %s" % (path, sorted(row)))


def summary(results):
    """The table of ratios and verdicts, one line per n and model (markdown)."""
    def v(ok):
        return "PASS" if ok else "MISS"

    def ms(m, mode, fmt="%.1f"):
        return fmt % m[mode]["ms"] if mode in m else "-"

    print()
    print("# summary. grads: the model's gradient list through khor's grouped_allreduce and "
          "through MWMS's all_reduce (ms, the")
    print("# slowest rank's, median); fit: model.fit step (ms); flat: the gradient bytes as "
          "one buffer, out of place:")
    print("# TF op / khor package (same process, same engine) / khor-bench C; in place: TF "
          "op on a temporary less")
    print("# making it / khor package in place. Targets: grads <= 0.5x MWMS, img/s >= MWMS, "
          "TF flat <= 1.1x C")
    hdr = ("| n | model | grads khor / mwms (ms) | khor/mwms | fit khor / mwms / local (ms) "
           "| img/s khor / mwms | khor/mwms | flat TF / np / C (ms) | TF/C | TF/np "
           "| in place TF / np (ms) | #wrong |")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    verdicts = []
    for n in sorted(results):
        doc = results[n]
        by = {}
        for r in doc["rows"]:
            by.setdefault(r["model"], {})[r["mode"]] = r
        for model, m in by.items():
            if m["tf-flat"]["bytes"] != model_bytes_known[model]:
                raise RuntimeError("%s: the worker counted %d bytes of gradients, khor-bench "
                                   "ran %d" % (model, m["tf-flat"]["bytes"],
                                               model_bytes_known[model]))
            g = m["khor-grads"]["ms"] / m["mwms-grads"]["ms"]
            cms = statistics.median(doc["c_allreduce_ms"][model])
            tc = m["tf-flat"]["ms"] / cms
            tn = m["tf-flat"]["ms"] / m["np-flat"]["ms"]
            tin = m["tf-flat-temp"]["ms"] - m["scale-alone"]["ms"]
            if "khor-fit" in m:
                ips = m["khor-fit"]["img_s"] / m["mwms-fit"]["img_s"]
                fit = "%.0f / %.0f / %.0f" % (m["khor-fit"]["ms"], m["mwms-fit"]["ms"],
                                              m["local-fit"]["ms"])
                img = "%.1f / %.1f" % (m["khor-fit"]["img_s"], m["mwms-fit"]["img_s"])
                ipv = "**%.2f %s**" % (ips, v(ips >= 1.0))
            else:
                ips, fit, img, ipv = None, "-", "-", "-"
            print("| %d | %s | %s / %s | **%.2f %s** | %s | %s | %s | %s / %s / %.1f "
                  "| **%.2f %s** | %.2f | %.1f / %s | %d |"
                  % (n, model, ms(m, "khor-grads"), ms(m, "mwms-grads"), g, v(g <= 0.5), fit,
                     img, ipv, ms(m, "tf-flat"), ms(m, "np-flat"), cms, tc, v(tc <= 1.1), tn,
                     tin, ms(m, "np-flat-inplace"), m["tf-flat"]["wrong"]))
            verdicts.append((n, model, g <= 0.5, ips is None or ips >= 1.0, tc <= 1.1,
                             tn <= 1.1))
    print("# also: khor-pertensor (one allreduce op per gradient, as DistributedOptimizer) "
          "and mwms-flat (one flat tensor through MWMS):")
    for n in sorted(results):
        print("#   n=%d: " % n + ", ".join(
            "%s %s %.1f ms" % (r["model"], r["mode"], r["ms"]) for r in results[n]["rows"]
            if r["mode"] in ("khor-pertensor", "mwms-flat")))
    print("# khor-bench allreduce runs (ms per call, avg, each the mean of its timed "
          "iterations): " + ", ".join(
              "n=%d %s %s" % (n, k, " / ".join("%.1f" % x for x in vals))
              for n in sorted(results) for k, vals in results[n]["c_allreduce_ms"].items()))
    sys.stdout.flush()
    return verdicts


def main(argv):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    return driver(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
