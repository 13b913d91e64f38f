"""ElasticSampler: Horovod's sampler that shards a dataset over the ranks and, kept in a
TorchState, reshards what is left of the epoch over the new ranks after a reset."""

import math
import random

import torch.utils.data

from ..mpi_ops import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Like DistributedSampler, plus a record of what has been processed this epoch:
    record_batch(batch_idx, batch_size) after each batch (Horovod's count: every rank did
    batch_size samples), or record_indices(indices) for the samples this rank did. A
    TorchState saves, restores and syncs that record; after a reset the unprocessed samples
    of the epoch are shared out over the new size. Call set_epoch at the end of each epoch:
    it clears the record and reshuffles (seed + epoch, the same order on every rank)."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.processed_indices = set()
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices = []
        self.indices = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Every rank has processed a batch of batch_size more."""
        self.processed_num += batch_size * self.num_replicas

    def record_indices(self, indices):
        """This rank has processed these dataset indices."""
        self.processed_indices.update(int(i) for i in indices)

    def get_indices(self, batch_idx, batch_size):
        """The dataset indices of this rank's batch batch_idx in the current iteration."""
        start = batch_idx * batch_size
        return self.indices[start:min(start + batch_size, len(self.indices))]

    def state_dict(self):
        return dict(epoch=self.epoch, processed_num=self.processed_num,
                    processed_indices=set(self.processed_indices))

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.processed_indices = set(state_dict.get("processed_indices", ()))
        self.reset()

    def reset(self):
        """Shards what is left of the epoch over the job's ranks as they are now."""
        self.num_replicas = size()
        self.rank = rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        left = order[self.processed_num:]
        if self.processed_indices:
            left = [i for i in left if i not in self.processed_indices]
        self.remaining_indices = left
        self.num_samples = int(math.ceil(len(left) / self.num_replicas))
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        idx = list(self.remaining_indices)
        # Pad, repeating from the start, so that every rank gets num_samples.
        while idx and len(idx) < self.total_size:
            idx += idx[:self.total_size - len(idx)]
        self.indices = idx[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self):
        return self.num_samples
