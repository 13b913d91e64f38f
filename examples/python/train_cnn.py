#!/usr/bin/python3
"""train_cnn.py -- Horovod's MNIST example in torch form, data-parallel over khor.

  khorrun -np 2 /usr/bin/python3 examples/python/train_cnn.py
  khorrun -np 4 /usr/bin/python3 examples/python/train_cnn.py --data ~/mnist --epochs 3

Every rank builds the same small CNN (two 3x3 convolutions, max-pool, dropout, two linear
layers), takes rank 0's initial weights and optimizer state (hvd.broadcast_parameters,
hvd.broadcast_optimizer_state), trains on its own shard (rank::size) of the training set
and averages its gradients with the others' in hvd.DistributedOptimizer; the learning rate
is scaled by the number of ranks, as in Horovod's example. Rank 0 prints a line per epoch
(training loss and accuracy, test accuracy, each over all ranks) and saves --checkpoint;
the other ranks write nothing.

Data: MNIST from its IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally .gz) in --data DIR (or
DIR/MNIST/raw, torchvision's layout); without them, scikit-learn's 8x8 digits (1797
images), resized to 28x28 so that the same model fits, split 80/20 with a fixed seed.

--horovod imports horovod.torch instead of khor.torch: the same program, the same API.
Exit status: 0 on success (and, with --expect-accuracy, a test accuracy at least that),
1 on any error.
"""
import argparse
import gzip
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
               "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class Net(nn.Module):
    """The CNN of Horovod's and PyTorch's MNIST examples: 1x28x28 in, 10 logits out."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(),
            nn.Conv2d(32, 64, 3), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(0.25), nn.Flatten())
        self.classifier = nn.Sequential(
            nn.Linear(64 * 12 * 12, 128), nn.ReLU(), nn.Dropout(0.5),
            nn.Linear(128, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, allow_abbrev=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", metavar="DIR",
                   help="directory with MNIST's IDX files (default: scikit-learn's digits)")
    p.add_argument("--epochs", type=int, default=8, help="epochs to train (default 8)")
    p.add_argument("--batch-size", type=int, default=32,
                   help="images per step on each rank (default 32)")
    p.add_argument("--test-batch-size", type=int, default=500)
    p.add_argument("--lr", type=float, default=1e-3,
                   help="Adam's learning rate for one rank, multiplied by the number of "
                        "ranks (default 1e-3)")
    p.add_argument("--seed", type=int, default=0,
                   help="base of each rank's seed (seed + rank) for dropout and shuffling")
    p.add_argument("--checkpoint", default="checkpoint.pt", metavar="PATH",
                   help="where rank 0 saves the model and optimizer state at the end "
                        "(default checkpoint.pt; '' saves nothing)")
    p.add_argument("--fp16-allreduce", action="store_true",
                   help="compress gradients to float16 for the allreduce")
    p.add_argument("--expect-accuracy", type=float, default=0.0, metavar="PCT",
                   help="exit 1 when the final test accuracy is below PCT percent")
    p.add_argument("--horovod", action="store_true",
                   help="use horovod.torch instead of khor.torch")
    args = p.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.test_batch_size < 1:
        p.error("--epochs, --batch-size and --test-batch-size need a positive number")
    return args


def read_idx(path):
    """An IDX file (MNIST's format, optionally gzipped) as a numpy array of uint8."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    start = 4 + 4 * ndim
    count = int(np.prod(dims))
    if len(raw) - start != count:
        raise ValueError(f"{path}: {len(raw) - start} bytes of data for shape {dims}")
    return np.frombuffer(raw, np.uint8, count, start).reshape(dims)


def find_idx(directory, name):
    for d in (directory, os.path.join(directory, "MNIST", "raw")):
        for candidate in (name, name + ".gz"):
            path = os.path.join(d, candidate)
            if os.path.isfile(path):
                return path
    return None


def load_mnist(directory):
    """((train x, train y), (test x, test y)) from DIR's IDX files, or None when absent."""
    paths = {part: [find_idx(directory, n) for n in names]
             for part, names in MNIST_FILES.items()}
    if not all(all(ps) for ps in paths.values()):
        return None
    out = []
    for part in ("train", "test"):
        images, labels = (read_idx(p) for p in paths[part])
        if images.ndim != 3 or images.shape[1:] != (28, 28) or labels.shape != images.shape[:1]:
            raise ValueError(f"{directory}: MNIST {part} files of shapes {images.shape} and "
                             f"{labels.shape}")
        x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
        out.append(((x - MNIST_MEAN) / MNIST_STD, torch.from_numpy(labels.astype(np.int64))))
    return tuple(out)


def load_digits():
    """scikit-learn's 8x8 digits resized to 28x28, split 80/20 with a fixed seed."""
    from sklearn.datasets import load_digits as sk_digits
    digits = sk_digits()
    x = torch.from_numpy(digits.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(x, size=(28, 28), mode="bilinear", align_corners=False)
    x = (x - x.mean()) / x.std()
    y = torch.from_numpy(digits.target.astype(np.int64))
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(1234))
    cut = int(0.8 * len(y))
    train, test = order[:cut], order[cut:]
    return (x[train], y[train]), (x[test], y[test])


def shard(n, rank, size):
    """Indices rank::size of n, padded by wrapping so that every rank gets ceil(n / size)
    (torch's DistributedSampler does the same): every rank then takes the same number of
    steps, which DistributedOptimizer needs."""
    idx = list(range(rank, n, size))
    want = -(-n // size)
    return torch.tensor((idx * (want // max(len(idx), 1) + 1))[:want])


def metric_sum(hvd, values, name):
    """The element-wise sum over ranks of a list of numbers."""
    return hvd.allreduce(torch.tensor(values, dtype=torch.float64), name=name,
                         op=hvd.Sum).tolist()


def evaluate(hvd, model, x, y, batch):
    """Test accuracy in percent over all ranks, each evaluating its shard of (x, y)."""
    model.eval()
    idx = torch.arange(hvd.rank(), len(y), hvd.size())
    correct = 0
    with torch.no_grad():
        for i in range(0, len(idx), batch):
            b = idx[i:i + batch]
            correct += int((model(x[b]).argmax(1) == y[b]).sum())
    correct, total = metric_sum(hvd, [correct, len(idx)], "test.accuracy")
    return 100.0 * correct / total


def main(argv):
    args = parse_args(argv)
    if args.horovod:
        import horovod.torch as hvd
    else:
        import khor.torch as hvd

    # the data first: a rank that cannot read it fails before joining the job
    data = load_mnist(args.data) if args.data else None
    if args.data and data is None:
        raise SystemExit(f"train_cnn: {args.data}: no MNIST IDX files there "
                         f"({', '.join(n for ns in MNIST_FILES.values() for n in ns)})")
    source = f"MNIST from {args.data}" if data else "scikit-learn digits resized to 28x28"
    (train_x, train_y), (test_x, test_y) = data or load_digits()

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.manual_seed(args.seed + rank)
    if size > 1:
        torch.set_num_threads(1)  # one core per rank, not every rank on every core

    mine = shard(len(train_y), rank, size)

    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr * size)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    if rank == 0:
        print(f"train_cnn: {size} rank(s), {source}: {len(train_y)} training images "
              f"({len(mine)} per rank), {len(test_y)} test images; batch {args.batch_size} "
              f"per rank, Adam lr {args.lr * size:g}", flush=True)
    start = time.monotonic()
    test_acc = 0.0
    for epoch in range(1, args.epochs + 1):
        model.train()
        t0 = time.monotonic()
        order = mine[torch.randperm(len(mine))]
        loss_sum, correct = 0.0, 0
        for i in range(0, len(order), args.batch_size):
            b = order[i:i + args.batch_size]
            optimizer.zero_grad()
            out = model(train_x[b])
            loss = F.cross_entropy(out, train_y[b])
            loss.backward()
            optimizer.step()
            loss_sum += float(loss) * len(b)
            correct += int((out.argmax(1) == train_y[b]).sum())
        loss_sum, correct, seen = metric_sum(hvd, [loss_sum, correct, len(order)],
                                             "train.metrics")
        test_acc = evaluate(hvd, model, test_x, test_y, args.test_batch_size)
        if rank == 0:
            print(f"epoch {epoch:3d}/{args.epochs}  loss {loss_sum / seen:.4f}  "
                  f"train acc {100.0 * correct / seen:6.2f}%  test acc {test_acc:6.2f}%  "
                  f"({time.monotonic() - t0:.1f} s)", flush=True)

    if rank == 0:
        print(f"final test accuracy {test_acc:.2f}% after {args.epochs} epochs "
              f"in {time.monotonic() - start:.1f} s", flush=True)
        if args.checkpoint:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epochs": args.epochs, "ranks": size, "test_accuracy": test_acc},
                       args.checkpoint)
            print(f"saved {args.checkpoint}", flush=True)
    hvd.shutdown()
    if test_acc < args.expect_accuracy:
        print(f"train_cnn: rank {rank}: test accuracy {test_acc:.2f}% is below "
              f"--expect-accuracy {args.expect_accuracy:g}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
