"""keras_mnist.py -- Horovod's tf.keras MNIST example, data-parallel over khor.

  khorrun -np 2 python examples/tensorflow/keras_mnist.py
  khorrun -np 4 python examples/tensorflow/keras_mnist.py --data ~/mnist --epochs 6

The program is Horovod's (``import horovod.tensorflow.keras as hvd``; ``--khor`` imports
khor.tensorflow.keras instead, the same API): hvd.init(), each rank trains on its own shard
of the data, the learning rate is scaled by hvd.size(), hvd.DistributedOptimizer averages
the gradients inside model.fit's train step, BroadcastGlobalVariablesCallback(0) gives every
rank rank 0's initial weights, MetricAverageCallback averages the epoch's metrics and
LearningRateWarmupCallback ramps the rate up over the first epochs and
LearningRateScheduleCallback lowers it for the last ones. Only rank 0 writes
checkpoints (tf.keras's ModelCheckpoint) and prints; at the end every rank evaluates the
whole test set (the ranks' weights are identical) and rank 0 prints "test accuracy: A".

Data: MNIST from mnist.npz (tf.keras.datasets' file) or its IDX files in --data DIR;
without them, scikit-learn's 8x8 digits (1797 images, split 80/20 with a fixed seed), on
which the same CNN runs at 8x8. Nothing is downloaded.

Exit status: 0, or 1 on any error or (with --expect-accuracy P) a test accuracy below P %.
"""
import argparse
import gzip
import math
import os
import sys

import numpy as np


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", metavar="DIR", help="directory with mnist.npz or MNIST's IDX "
                   "files (default: scikit-learn's digits)")
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    p.add_argument("--lr", type=float, default=0.001, help="per rank; times size")
    p.add_argument("--warmup-epochs", type=int, default=3)
    p.add_argument("--checkpoint", default="checkpoint-{epoch}.keras",
                   help="ModelCheckpoint's file pattern, written by rank 0 only")
    p.add_argument("--expect-accuracy", type=float, metavar="P",
                   help="exit 1 if the test accuracy is below P percent")
    p.add_argument("--khor", action="store_true",
                   help="import khor.tensorflow.keras rather than horovod.tensorflow.keras")
    return p.parse_args(argv)


def _idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_mnist(d):
    """(train, test) from d/mnist.npz or d's IDX files (optionally .gz), or None."""
    npz = os.path.join(d, "mnist.npz")
    if os.path.exists(npz):
        with np.load(npz) as f:
            parts = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
    else:
        names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
        found = []
        for n in names:
            hit = [os.path.join(d, n + s) for s in ("", ".gz")
                   if os.path.exists(os.path.join(d, n + s))]
            if not hit:
                return None
            found.append(_idx(hit[0]))
        parts = found
    xtr, ytr, xte, yte = parts
    f = lambda x: (x[..., None] / 255.0).astype(np.float32)  # noqa: E731
    return (f(xtr), ytr.astype(np.int64)), (f(xte), yte.astype(np.int64))


def load_digits():
    """scikit-learn's digits as 8x8x1 images in [0, 1], split 80/20 with a fixed seed."""
    from sklearn.datasets import load_digits as sk_digits
    d = sk_digits()
    x = (d.images / 16.0).astype(np.float32)[..., None]
    y = d.target.astype(np.int64)
    order = np.random.default_rng(1234).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def shard(n, rank, size):
    """Indices rank::size of range(n), padded by wrapping to ceil(n / size): every rank then
    takes the same number of steps per epoch, as DistributedOptimizer's allreduce needs."""
    per = math.ceil(n / size)
    return np.arange(rank, rank + per * size, size) % n


def build_model(keras, shape):
    """Horovod's MNIST CNN: two 3x3 convolutions, max-pool, dropout, two dense layers."""
    return keras.Sequential([
        keras.Input(shape),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Dropout(0.25),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dropout(0.5),
        keras.layers.Dense(10, activation="softmax"),
    ])


def main(argv):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    if args.khor:
        import khor.tensorflow.keras as hvd
    else:
        import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(42 + rank)   # ranks differ until the broadcast

    data = load_mnist(args.data) if args.data else None
    if args.data and data is None:
        print("keras_mnist: no mnist.npz or MNIST IDX files in %s" % args.data,
              file=sys.stderr)
        return 1
    (xtr, ytr), (xte, yte) = data or load_digits()
    mine = shard(len(ytr), rank, size)
    steps = math.ceil(len(mine) / args.batch_size)
    ds = (tf.data.Dataset.from_tensor_slices((xtr[mine], ytr[mine]))
          .shuffle(len(mine), seed=rank).repeat().batch(args.batch_size))

    model = build_model(tf.keras, xtr.shape[1:])
    scaled_lr = args.lr * size
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(scaled_lr))
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                  metrics=["accuracy"])

    decay = max(args.warmup_epochs, args.epochs - args.epochs // 4)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # before any callback that reads the epoch's metrics
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr,
                                                 warmup_epochs=args.warmup_epochs,
                                                 verbose=1 if rank == 0 else 0),
        # then the full rate, and a tenth of it over the last quarter of the epochs (a
        # settled end makes the accuracy depend less on the number of ranks)
        hvd.callbacks.LearningRateScheduleCallback(scaled_lr, lambda e: 1.0,
                                                   start_epoch=args.warmup_epochs,
                                                   end_epoch=decay),
        hvd.callbacks.LearningRateScheduleCallback(scaled_lr, lambda e: 0.1,
                                                   start_epoch=decay),
    ]
    if rank == 0:   # one writer: ranks writing the same file would corrupt it
        callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint))

    model.fit(ds, steps_per_epoch=steps, epochs=args.epochs, callbacks=callbacks,
              shuffle=False, verbose=2 if rank == 0 else 0)   # ds is shuffled already
    _, acc = model.evaluate(xte, yte, batch_size=256, verbose=0)
    if rank == 0:
        print("test accuracy: %.4f (np %d, %d test images)" % (acc, size, len(yte)))
    hvd.shutdown()
    if args.expect_accuracy is not None and acc * 100 < args.expect_accuracy:
        print("keras_mnist: rank %d: test accuracy %.2f %% is below the expected %.2f %%"
              % (rank, acc * 100, args.expect_accuracy), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
