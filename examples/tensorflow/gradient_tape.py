"""gradient_tape.py -- Horovod's TensorFlow 2 MNIST example (a custom training loop),
data-parallel over khor.

  khorrun -np 2 python examples/tensorflow/gradient_tape.py
  khorrun -np 4 python examples/tensorflow/gradient_tape.py --data ~/mnist

Horovod's program (``import horovod.tensorflow as hvd``; ``--khor`` imports khor.tensorflow
instead): a tf.function training step whose tape is wrapped in hvd.DistributedGradientTape,
so tape.gradient returns gradients averaged over the ranks; after the first step every rank
takes rank 0's model and optimizer variables (hvd.broadcast_variables; the optimizer's
exist only once it has applied a step). The learning rate is scaled by hvd.size() and
divided by 10 for the last quarter of the epochs. Rank 0 alone prints and writes the
tf.train.Checkpoint (--checkpoint); at the end every rank evaluates the whole test set and
rank 0 prints "test accuracy: A".

Data as in keras_mnist.py (MNIST in --data DIR, else scikit-learn's 8x8 digits), the same
CNN. Exit status: 0, or 1 on any error or (with --expect-accuracy P) an accuracy below P %.
"""
import argparse
import math
import os
import sys

import numpy as np

from keras_mnist import build_model, load_digits, load_mnist, shard


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", metavar="DIR", help="directory with mnist.npz or MNIST's IDX "
                   "files (default: scikit-learn's digits)")
    p.add_argument("--epochs", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32, help="per rank (default 32)")
    p.add_argument("--lr", type=float, default=0.001, help="per rank; times size")
    p.add_argument("--checkpoint", default="checkpoints/ckpt",
                   help="tf.train.Checkpoint prefix, written by rank 0 only")
    p.add_argument("--expect-accuracy", type=float, metavar="P",
                   help="exit 1 if the test accuracy is below P percent")
    p.add_argument("--khor", action="store_true",
                   help="import khor.tensorflow rather than horovod.tensorflow")
    return p.parse_args(argv)


def main(argv):
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    if args.khor:
        import khor.tensorflow as hvd
    else:
        import horovod.tensorflow as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tf.keras.utils.set_random_seed(42 + rank)   # ranks differ until the broadcast

    data = load_mnist(args.data) if args.data else None
    if args.data and data is None:
        print("gradient_tape: no mnist.npz or MNIST IDX files in %s" % args.data,
              file=sys.stderr)
        return 1
    (xtr, ytr), (xte, yte) = data or load_digits()
    mine = shard(len(ytr), rank, size)
    steps = math.ceil(len(mine) / args.batch_size)
    ds = (tf.data.Dataset.from_tensor_slices((xtr[mine], ytr[mine]))
          .shuffle(len(mine), seed=rank).repeat().batch(args.batch_size))

    model = build_model(tf.keras, xtr.shape[1:])
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy()
    scaled_lr = args.lr * size
    opt = tf.keras.optimizers.Adam(scaled_lr)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)

    @tf.function
    def training_step(images, labels, first_batch):
        with tf.GradientTape() as tape:
            probs = model(images, training=True)
            loss = loss_fn(labels, probs)
        tape = hvd.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        if first_batch:   # a Python bool: traced once each way
            hvd.broadcast_variables(model.variables, root_rank=0)
            hvd.broadcast_variables(list(opt.variables), root_rank=0)
        return loss

    decay = args.epochs - args.epochs // 4
    it = iter(ds)
    for epoch in range(args.epochs):
        if epoch == decay:
            opt.learning_rate = scaled_lr / 10
        total = 0.0
        for b in range(steps):
            images, labels = next(it)
            total += float(training_step(images, labels, epoch == 0 and b == 0))
        if rank == 0:
            print("epoch %d: loss %.4f (rank 0's batches), lr %g"
                  % (epoch + 1, total / steps, float(np.asarray(opt.learning_rate))))

    if rank == 0:   # one writer: ranks writing the same files would corrupt them
        checkpoint.save(args.checkpoint)
    probs = model.predict(xte, batch_size=256, verbose=0)
    acc = float(np.mean(np.argmax(probs, axis=1) == yte))
    if rank == 0:
        print("test accuracy: %.4f (np %d, %d test images)" % (acc, size, len(yte)))
    hvd.shutdown()
    if args.expect_accuracy is not None and acc * 100 < args.expect_accuracy:
        print("gradient_tape: rank %d: test accuracy %.2f %% is below the expected %.2f %%"
              % (rank, acc * 100, args.expect_accuracy), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
