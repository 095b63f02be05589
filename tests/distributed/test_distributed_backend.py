"""Which backend and GPU each rank uses, and how `GroupCollective` hands tensors to it, checked
in one process with torch.distributed's calls replaced (no process group, no GPU needed). Real
multi-process runs, on the CPU and on CUDA, are in tests/distributed/test_distributed.py."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from nphcli.distributed.group import choose_backend, join_group
from nphcli.memory.collective import GroupCollective


def _fake_gpus(monkeypatch, count: int, *, nccl: bool = True) -> list[int]:
    """Pretend `count` GPUs are visible; returns the list that records `set_device` calls."""
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: chosen[-1] if chosen else 0)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: nccl)
    return chosen


@pytest.mark.parametrize(
    ("device", "gpus", "nccl", "backend"),
    [
        ("cpu", 4, True, "gloo"),
        ("cuda", 2, True, "nccl"),  # a GPU per rank
        ("auto", 8, True, "nccl"),
        ("CUDA", 2, True, "nccl"),
        ("cuda", 1, True, "gloo"),  # ranks share the one GPU: NCCL refuses that
        ("cuda", 2, False, "gloo"),  # no NCCL in this torch build
        ("cuda:1", 2, True, "gloo"),  # every rank pinned to GPU 1
        ("auto", 0, True, "gloo"),  # no GPU: auto is the CPU
        ("cuda", 0, True, "gloo"),
    ],
)
def test_choose_backend(monkeypatch, device, gpus, nccl, backend):
    _fake_gpus(monkeypatch, gpus, nccl=nccl)
    assert choose_backend(device, 2) == backend


@pytest.mark.parametrize(("local_ranks", "backend"), [(2, "nccl"), (3, "nccl"), (4, "gloo")])
def test_more_local_ranks_than_gpus_take_gloo(monkeypatch, local_ranks, backend):
    """Three GPUs hold three ranks; a fourth would share GPU 0, which NCCL refuses at its first
    exchange, so the group uses gloo."""
    _fake_gpus(monkeypatch, 3)
    assert choose_backend("cuda", local_ranks) == backend


def _fake_group(monkeypatch) -> list[str]:
    """Replace process-group setup: records the backend asked for; rank 0 of 2."""
    backends = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(backends))
    monkeypatch.setattr(dist, "TCPStore", lambda *_, **__: None)  # no rendezvous to reach
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **_: backends.append(backend))
    monkeypatch.setattr(dist, "get_backend", lambda: backends[-1])
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    return backends


@pytest.mark.parametrize(
    ("device", "gpus", "rank", "local_rank", "backend", "gpu"),
    [
        ("cuda", 2, 3, None, "nccl", 1),  # --workers: rank 3 on GPU 3 mod 2
        ("cuda", 4, None, "5", "nccl", 1),  # torchrun: LOCAL_RANK 5 on GPU 5 mod 4
        ("cuda", 1, 1, None, "gloo", 0),  # one GPU: both ranks on cuda:0, over gloo
        ("cuda:1", 2, 0, None, "gloo", None),  # pinned: nph leaves the current device alone
        ("cpu", 2, 1, None, "gloo", None),
    ],
)
def test_each_rank_takes_its_gpu(monkeypatch, device, gpus, rank, local_rank, backend, gpu):
    chosen = _fake_gpus(monkeypatch, gpus)
    backends = _fake_group(monkeypatch)
    address = "tcp://127.0.0.1:1" if rank is not None else None
    if local_rank is not None:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    collective = join_group(rank=rank, world_size=2, address=address, device=device)
    assert backends == [backend] and collective.backend == backend
    assert chosen == ([] if gpu is None else [gpu])
    wire = torch.device("cuda", gpu) if backend == "nccl" else torch.device("cpu")
    assert collective.wire == wire  # NCCL exchanges on the rank's GPU, gloo on the host


@pytest.mark.parametrize(("workers", "backend"), [(2, "nccl"), (3, "gloo")])
def test_local_ranks_beyond_the_gpus_join_over_gloo(monkeypatch, workers, backend):
    """nph's workers (an address) and torchrun's ranks (LOCAL_WORLD_SIZE) alike: with more ranks
    on this machine than its 2 GPUs, two share a GPU, so the group uses gloo."""
    for launcher in ("workers", "torchrun"):
        _fake_gpus(monkeypatch, 2)
        backends = _fake_group(monkeypatch)
        if launcher == "workers":
            join_group(rank=0, world_size=workers, address="tcp://127.0.0.1:1", device="cuda")
        else:
            monkeypatch.setenv("LOCAL_RANK", "0")
            monkeypatch.setenv("LOCAL_WORLD_SIZE", str(workers))
            join_group(device="cuda")
        assert backends == [backend], launcher


def _two_equal_ranks(monkeypatch, backend: str) -> tuple[GroupCollective, list[torch.device]]:
    """A collective over a fake group of two ranks holding equal tensors; it refuses tensors
    off the wire device, as gloo refuses a CUDA all_gather. Returns it and the devices seen."""
    seen = []
    monkeypatch.setattr(dist, "get_backend", lambda: backend)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    collective = GroupCollective()

    def on_wire(tensor):
        assert tensor.device == collective.wire and tensor.is_contiguous()
        seen.append(tensor.device)

    def all_reduce(tensor, op):
        on_wire(tensor)
        if op == dist.ReduceOp.SUM:
            tensor.mul_(2)

    def all_gather(parts, tensor):
        on_wire(tensor)
        for part in parts:
            part.copy_(tensor)

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    return collective, seen


def test_gloo_exchanges_on_the_host_and_leaves_the_input_alone(monkeypatch):
    collective, seen = _two_equal_ranks(monkeypatch, "gloo")
    assert collective.wire == torch.device("cpu")
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()  # (3, 2), not contiguous
    before = x.clone()
    total, top, joined = collective.all_sum(x), collective.all_max(x), collective.all_cat(x, 1)
    assert torch.equal(x, before)  # all_reduce ran on a copy
    assert torch.equal(total, 2 * before) and torch.equal(top, before)
    assert torch.equal(joined, torch.cat([before, before], dim=1))
    assert {t.device for t in (total, top, joined)} == {x.device}
    assert len(seen) == 3 and collective.bytes_sent == 3 * 6 * 4


def test_nccl_exchanges_on_the_ranks_gpu(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    torch.cuda.set_device(1)
    collective, _ = _two_equal_ranks(monkeypatch, "nccl")
    assert collective.wire == torch.device("cuda", 1)
