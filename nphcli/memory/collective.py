"""How the ranks that share one memory combine partial results: `Collective`.

A memory spread over several processes (`nphcli.memory.sharded_bank.ShardedBank` with a process
group) hands each rank only its own rows. The engine's exact merges (online softmax, running
top-k, feature summaries, nearest-pattern search) then need three reductions across ranks:
an element-wise maximum, an element-wise sum and a concatenation. `LOCAL` is the single-process
case, where each is the identity, so kernels call them unconditionally and never ask which kind
of memory they read. `GroupCollective` runs them over `torch.distributed` (gloo or NCCL).

Each backend exchanges tensors on one device, a tensor elsewhere copied there and back: NCCL on
this rank's GPU (it takes CUDA tensors only), gloo on the host (its CUDA support lacks all_gather).

Every rank must make the same calls in the same order; kernels guarantee this by deciding
control flow only on merged values. `bytes_sent` counts what this rank contributed, for the
benchmarks' communication measurements.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nphcli.core.errors import NphRuntimeError


class Collective:
    """The single-process case: one rank, every reduction is the identity."""

    rank: int = 0
    world_size: int = 1
    bytes_sent: int = 0

    def all_max(self, tensor: Tensor) -> Tensor:
        """Element-wise maximum over ranks."""
        return tensor

    def all_sum(self, tensor: Tensor) -> Tensor:
        """Element-wise sum over ranks."""
        return tensor

    def all_cat(self, tensor: Tensor, dim: int) -> Tensor:
        """Every rank's `tensor` concatenated along `dim` in rank order (same shapes required)."""
        return tensor


LOCAL = Collective()


class GroupCollective(Collective):
    """Reductions over the default `torch.distributed` process group (already initialised)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self._dist = dist
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.bytes_sent = 0
        self.backend = str(dist.get_backend())
        # The device the backend exchanges tensors on (see the module docstring).
        self.wire = torch.device("cpu")
        if self.backend == "nccl":
            self.wire = torch.device("cuda", torch.cuda.current_device())

    def all_max(self, tensor: Tensor) -> Tensor:
        return self._reduce(tensor, self._dist.ReduceOp.MAX)

    def all_sum(self, tensor: Tensor) -> Tensor:
        return self._reduce(tensor, self._dist.ReduceOp.SUM)

    def all_cat(self, tensor: Tensor, dim: int) -> Tensor:
        sent = tensor.to(self.wire).contiguous()
        self.bytes_sent += sent.numel() * sent.element_size()
        parts = [torch.empty_like(sent) for _ in range(self.world_size)]
        self._guarded(lambda: self._dist.all_gather(parts, sent))
        return torch.cat(parts, dim=dim).to(tensor.device)

    def _reduce(self, tensor: Tensor, op) -> Tensor:
        # A copy: all_reduce works in place, and the caller's tensor must stay as it was.
        out = tensor.to(self.wire, copy=True, memory_format=torch.contiguous_format)
        self.bytes_sent += out.numel() * out.element_size()
        self._guarded(lambda: self._dist.all_reduce(out, op=op))
        return out.to(tensor.device)

    def _guarded(self, call) -> None:
        """Run one collective; a peer that died, left or hung past the group's timeout becomes
        one clear error on this rank instead of a backend traceback."""
        try:
            call()
        except RuntimeError as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
            raise NphRuntimeError(
                f"rank {self.rank}: lost the other ranks during a collective (a rank died, left "
                f"or did not answer within the timeout): {first}"
            ) from None
