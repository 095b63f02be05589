"""Joining a `torch.distributed` process group, and this rank's part of a sharded memory.

torch.distributed's rendezvous (a TCP store) has no authentication: anyone who can reach the
master port can join or disturb a group. Run it on trusted networks only (docs/distributed.md).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from datetime import timedelta

import torch

from nphcli.core.devices import unpinned_cuda
from nphcli.core.errors import NphError
from nphcli.memory import open_memory
from nphcli.memory.collective import GroupCollective
from nphcli.memory.format import is_manifest
from nphcli.memory.sharded_bank import ShardedBank
from nphcli.memory.shards import Manifest, read_manifest

# Seconds a rank waits for the others in one collective before it gives up: a rank that died
# or hangs makes every other rank fail within this time instead of waiting for ever.
DEFAULT_TIMEOUT = 120.0


def launched_by_torchrun() -> bool:
    """Whether this process is one rank of a group that torchrun (or a similar launcher) set up
    through the environment (WORLD_SIZE > 1)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1 and "RANK" in os.environ


def choose_backend(device: str, local_ranks: int) -> str:
    """The process group's backend for `local_ranks` ranks on this machine computing on `device`
    (a `--device` string): "nccl" when each rank gets a GPU of its own (`devices.unpinned_cuda`,
    more than one GPU visible and at least one per local rank, NCCL built in), else "gloo" (CPU
    ranks, ranks pinned to one `cuda:N`, or more ranks than GPUs: NCCL refuses two ranks on one
    GPU)."""
    import torch.distributed as dist

    gpus = torch.cuda.device_count() if unpinned_cuda(device) else 0
    if 1 < gpus and local_ranks <= gpus and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def distributed():
    """torch.distributed, or one line saying this torch build lacks it."""
    import torch.distributed as dist

    if not dist.is_available():
        raise NphError("this torch build has no torch.distributed; install a standard build")
    return dist


def join_group(
    *,
    rank: int | None = None,
    world_size: int | None = None,
    address: str | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    device: str = "cpu",
) -> GroupCollective:
    """Join the default process group as `rank` of `world_size` at `address` ("tcp://host:port";
    all None: from torchrun's environment, RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT), with the backend `choose_backend` picks. With an `address` every rank is one of
    nph's own workers on this machine; else torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE say which.
    When `devices.unpinned_cuda(device)`, this rank computes on GPU local rank mod the visible
    GPUs (made the current device, which `--device cuda` resolves to)."""
    dist = distributed()
    if address is not None:
        local_rank, local_ranks = rank, world_size
    else:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))
    if unpinned_cuda(device):
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    if not dist.is_initialized():
        kwargs = {"timeout": timedelta(seconds=timeout)}
        if address is not None:  # the parent serves the store (launch.rendezvous_store)
            host, port = address.removeprefix("tcp://").rsplit(":", 1)
            store = dist.TCPStore(host, int(port), world_size, is_master=False, **kwargs)
            kwargs.update(store=store, rank=rank, world_size=world_size)
        dist.init_process_group(backend=choose_backend(device, local_ranks), **kwargs)
    collective = GroupCollective()
    if collective.rank > 0:  # every rank would say the same; rank 0 speaks for all
        logging.getLogger("nph").setLevel(logging.ERROR)
    return collective


def leave_group(*, wait_for_peers: bool = True) -> None:
    """Leave the default process group, if joined, in order: a barrier first (`wait_for_peers`),
    so no rank closes its connections while a peer still reads them, then
    `destroy_process_group`, which stops the group's communication threads. A process that
    exits with them still running can abort in the C++ runtime at exit ("terminate called
    without an active exception"): torchrun then reports the rank as failed after the output
    was written. After an error, leave without the barrier: the peers may never reach it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if wait_for_peers:
            dist.barrier()
    finally:
        dist.destroy_process_group()


def owned_parts(parts: int, rank: int, world_size: int) -> range:
    """The shards rank `rank` reads: a contiguous run, as even as possible, in rank order (so
    ranks hold rows in rank order, which the merges' tie rules rely on)."""
    if parts < world_size:
        raise NphError(
            f"the shard set has {parts} shards but {world_size} ranks; every rank needs a shard: "
            f"re-shard with `nph shard --parts {world_size}` or use fewer ranks"
        )
    return range(rank * parts // world_size, (rank + 1) * parts // world_size)


def open_rank_memory(path, *, stream: bool, collective: GroupCollective) -> ShardedBank:
    """This rank's shards of the manifest at `path` as a `ShardedBank` over the process group.

    Before any compute, each rank checks its own shards (headers; loaded shards also their
    rows) and the ranks compare outcomes and set ids: if any rank refuses its shards, or the
    ranks read different shard sets, every rank stops with an error naming the rank.
    """
    problem, set_id = None, 0
    try:
        manifest = read_shard_set(path, check=())
        owned = owned_parts(len(manifest.parts), collective.rank, collective.world_size)
        bank = open_memory(path, stream=stream, owned=owned, collective=collective)
        set_id = int(manifest.set_id[:15], 16)  # 60 bits of the id: fits an int64
    except NphError as error:
        problem = error
    status = torch.tensor([[1 if problem else 0, set_id]], dtype=torch.int64)
    every = collective.all_cat(status, dim=0)  # (W, 2)
    if problem is not None:
        raise problem
    failed = every[:, 0].nonzero()[:, 0].tolist()
    if failed:
        raise NphError(f"rank {failed[0]} refused its shards (its own error says why)")
    other = (every[:, 1] != set_id).nonzero()[:, 0].tolist()
    if other:
        raise NphError(
            f"rank {other[0]} reads another shard set than rank {collective.rank} "
            "(the manifests differ between machines)"
        )
    return bank


def read_shard_set(path, check: Iterable[int] | None = None) -> Manifest:
    """The validated manifest at `path` (shards `check` checked, default all); a plain memory
    file is refused with what to do."""
    if not is_manifest(path):
        raise NphError(
            f"{path} is one memory file; several ranks need a shard set: split it with "
            "`nph shard MEMORY --parts N --out-dir DIR` and pass the manifest (DIR/*.shards.json)"
        )
    # Headers only: each rank verifies its own shards' checksums (`open_memory`) before compute.
    return read_manifest(path, check=check, verify=False)
