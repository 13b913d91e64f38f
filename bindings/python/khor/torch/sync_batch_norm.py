"""SyncBatchNorm: batch normalization whose batch statistics are those of the whole batch
across the ranks of a process set (CPU or CUDA tensors), as Horovod's.

Training mode: per channel, each rank's count, sum and sum of squares go through one
allreduce (sum); every rank normalises with the global mean and variance and updates the
running statistics with them. Backward needs the global sums of dy and dy * x_hat: one more
allreduce. Evaluation mode is plain batch norm with the running statistics.
"""

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from .._core import Sum, global_process_set
from .mpi_ops import allreduce


class _SyncBN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, process_set):
        c = x.shape[1]
        dims = [0] + list(range(2, x.dim()))
        xf = x.double()
        n_local = x.numel() // c
        stats = torch.cat([torch.tensor([float(n_local)], dtype=torch.float64, device=x.device),
                           xf.sum(dims), (xf * xf).sum(dims)])
        stats = allreduce(stats, op=Sum, name=None, process_set=process_set)
        n = stats[0]
        mean = stats[1:1 + c] / n
        var = stats[1 + c:] / n - mean * mean
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                unbiased = var * n / max(n.item() - 1, 1.0)
                running_mean.mul_(1 - momentum).add_(momentum * mean.to(running_mean.dtype))
                running_var.mul_(1 - momentum).add_(momentum * unbiased.to(running_var.dtype))
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = (xf - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.double().view(shape) + bias.double().view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.n, ctx.shape, ctx.dims, ctx.ps = n, shape, dims, process_set
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        shape, dims = ctx.shape, ctx.dims
        dyf = dy.double()
        sum_dy = dyf.sum(dims)
        sum_dy_xhat = (dyf * xhat).sum(dims)
        g = allreduce(torch.cat([sum_dy, sum_dy_xhat]), op=Sum, process_set=ctx.ps)
        c = sum_dy.numel()
        gsum_dy, gsum_dy_xhat = g[:c], g[c:]
        w = weight.double() if weight is not None else torch.ones(c, dtype=torch.float64, device=dy.device)
        dx = (dyf - gsum_dy.view(shape) / ctx.n - xhat * gsum_dy_xhat.view(shape) / ctx.n) * \
            (w * invstd).view(shape)
        dw = sum_dy_xhat.to(dy.dtype) if weight is not None else None
        db = sum_dy.to(dy.dtype) if weight is not None else None
        return dx.to(dy.dtype), dw, db, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm*d with statistics over every rank's batch."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, process_set=global_process_set):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_set = process_set

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError("expected at least 2D input (got %dD input)" % input.dim())

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training:
            return torch.nn.functional.batch_norm(
                input, self.running_mean, self.running_var, self.weight, self.bias, False,
                0.0, self.eps)
        if self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
        momentum = self.momentum if self.momentum is not None else \
            1.0 / float(self.num_batches_tracked)
        return _SyncBN.apply(input, self.weight, self.bias,
                             self.running_mean if self.track_running_stats else None,
                             self.running_var if self.track_running_stats else None,
                             self.eps, momentum, self.process_set)
