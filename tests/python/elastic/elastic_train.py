"""A khor.torch elastic training script for run_elastic.py: khorrun's elastic driver runs it,
the runner kills workers or changes the hosts, and this script checks, in every generation,
what the elastic API promises; rank 0 writes one JSON line per epoch (and a line "fail"
for a broken promise, then the worker exits 1).

Built before the elastic function, as Horovod's scripts do: the model, a
DistributedOptimizer, a process set of ranks 0 and 1 (a set of fixed ranks, as the job never
has fewer than 2: every worker, new or surviving, has the same sets in the same order), an
ElasticSampler over a dataset of --samples indices. Each batch: every rank trains on its
samples (the sampler's), the optimizer averages the gradients, the process set's allreduce
must give the sum of its members, the samples of every rank are gathered into the state (so that at the end of an
epoch rank 0 can check that each sample was trained on, once, apart from the sampler's
padding), then state.commit(). The first batch of every generation also makes each rank
allreduce a tensor of a different shape: in an elastic job that mistake must raise the
plain KhorError, not HorovodInternalError (which would reset).

--kill E,B,R: the worker whose start rank (HOROVOD_RANK when it started) is R kills itself
with SIGKILL before batch B of epoch E (once: --marker names a file made first).
--hosts-schedule '{"E": "LINES", "E,B": "LINES"}': at the end of epoch E, or before batch B
of epoch E, rank 0 writes LINES to --hosts-file (the discovery script cats it) and waits
until state._host_messages says the driver noticed; the next commit resets.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch

import khor
import khor.torch as hvd

ap = argparse.ArgumentParser()
ap.add_argument("--log", required=True)
ap.add_argument("--epochs", type=int, default=3)
ap.add_argument("--batch-size", type=int, default=2)
ap.add_argument("--samples", type=int, default=24)
ap.add_argument("--kill", default=None)
ap.add_argument("--marker", default=None)
ap.add_argument("--hosts-file", default=None)
ap.add_argument("--hosts-schedule", default="{}")
ap.add_argument("--notice-timeout", type=float, default=15.0)
args = ap.parse_args()
schedule = {tuple(int(x) for x in k.split(",")): v
            for k, v in json.loads(args.hosts_schedule).items()}
start_rank = int(os.environ.get("HOROVOD_RANK", "-1"))

hvd.init()


def fail(msg):
    with open(args.log, "a") as f:
        f.write(json.dumps({"fail": "rank %d (start rank %d): %s"
                            % (hvd.rank(), start_rank, msg)}) + "\n")
    sys.stderr.write("elastic_train: %s\n" % msg)
    os._exit(1)


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return args.samples

    def __getitem__(self, i):
        return i


def sample(i):
    g = torch.Generator().manual_seed(1000 + i)
    return torch.randn(1, 4, generator=g), torch.tensor([[float(i % 3)]])


model = torch.nn.Linear(4, 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
pair = hvd.add_process_set(hvd.ProcessSet([0, 1]))
sampler = hvd.elastic.ElasticSampler(Data(), shuffle=True, seed=5)
loader = torch.utils.data.DataLoader(Data(), batch_size=args.batch_size, sampler=sampler)


def check_generation(state):
    """Once per generation: the job's numbers and the error classes."""
    n, r = hvd.size(), hvd.rank()
    if not khor._core.is_elastic():
        fail("not an elastic job")
    if not (0 <= r < n and 0 <= hvd.local_rank() < hvd.local_size() <= n):
        fail("rank %d size %d local %d/%d" % (r, n, hvd.local_rank(), hvd.local_size()))
    if n > 1:
        try:
            hvd.allreduce(torch.ones(1 + r), name="elastic_train.mismatch")
            fail("a mismatch did not raise")
        except hvd.HorovodInternalError as e:
            fail("a mismatch raised HorovodInternalError: %s" % e)
        except khor.KhorError as e:
            if "elastic_train.mismatch" not in str(e):
                fail("the mismatch's error does not name the tensor: %s" % e)
    if sampler.num_replicas != n or sampler.rank != r:
        fail("the sampler is sharded for %d/%d in a job of %d/%d"
             % (sampler.rank, sampler.num_replicas, r, n))


def train_batch(state, idx):
    r = hvd.rank()
    opt.zero_grad()
    xs, ys = zip(*[sample(i) for i in idx]) if idx else ((torch.zeros(1, 4),), (torch.zeros(1, 1),))
    loss = torch.nn.functional.mse_loss(model(torch.cat(xs)), torch.cat(ys))
    loss.backward()
    opt.step()
    if pair.process_set_id is None:
        fail("the process set of ranks 0 and 1 is not registered in this generation")
    if pair.included():
        got = hvd.allreduce(torch.tensor([float(r + 1)]), op=hvd.Sum, process_set=pair)
        if got.item() != 3.0:
            fail("the allreduce of ranks 0 and 1 gave %s, want 3" % got.item())
    seen = hvd.allgather_object(list(idx), name="elastic_train.seen")
    state.seen = state.seen + [i for part in seen for i in part]


def end_epoch(state):
    w = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    ws = hvd.allgather(w.reshape(1, -1))
    if not bool((ws == ws[0]).all()):
        fail("the ranks' weights differ at the end of epoch %d" % state.epoch)
    if hvd.rank() != 0:
        return
    seen = state.seen
    missing = set(range(args.samples)) - set(seen)
    if missing:
        fail("epoch %d: samples %s were never trained on" % (state.epoch, sorted(missing)))
    with open(args.log, "a") as f:
        f.write(json.dumps({"epoch": state.epoch, "size": hvd.size(),
                            "generation": khor._core.generation(),
                            "rendezvous": state.rendezvous, "start_rank": start_rank,
                            "hostname": os.environ.get("HOROVOD_HOSTNAME"),
                            "seen": len(seen), "distinct": len(set(seen))}) + "\n")
    change_hosts(state, (state.epoch,))


def change_hosts(state, when):
    """Rank 0: the host change scheduled for `when`, once the driver has noticed it."""
    hosts = schedule.pop(when, None)
    if hosts is not None and hvd.rank() == 0:
        with open(args.hosts_file + ".tmp", "w") as f:
            f.write(hosts.replace(",", "\n") + "\n")
        os.rename(args.hosts_file + ".tmp", args.hosts_file)
        t0 = time.time()
        while state._host_messages.empty():
            if time.time() - t0 > args.notice_timeout:
                fail("the driver did not report the host change within %.0f s"
                     % args.notice_timeout)
            time.sleep(0.05)


def maybe_kill(state, batch):
    if args.kill is None:
        return
    e, b, who = (int(x) for x in args.kill.split(","))
    if (state.epoch, batch, start_rank) == (e, b, who) and not os.path.exists(args.marker):
        open(args.marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)


@hvd.elastic.run
def train(state):
    state.rendezvous += 1
    check_generation(state)
    while state.epoch < args.epochs:
        for b, idx in enumerate(loader):
            maybe_kill(state, state.batch)
            change_hosts(state, (state.epoch, state.batch))
            train_batch(state, idx.tolist())
            sampler.record_batch(b, args.batch_size)
            state.batch += 1
            state.commit()
        end_epoch(state)
        state.epoch += 1
        state.batch = 0
        state.seen = []
        sampler.set_epoch(state.epoch)
        state.commit()


resets = []
state = hvd.elastic.TorchState(model, opt, sampler=sampler, epoch=0, batch=0, seen=[],
                               rendezvous=0)
state.register_reset_callbacks([lambda: resets.append(hvd.size())])
train(state)
hvd.shutdown()
