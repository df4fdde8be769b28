"""A gloo process group between the trainer and the rollout engines, and how weights are cut
into broadcast buckets. Plain torch: no vLLM import, so tests and tools can use it cheaply."""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 64 << 20


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r} in weight update metadata")
    return dtype


def nbytes(dtype: torch.dtype, shape: list[int] | tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n * dtype.itemsize


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Group tensor indices, in order, into buckets of at most `bucket_bytes` (a larger tensor
    travels alone)."""
    buckets: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i, size in enumerate(sizes):
        if current and used + size > bucket_bytes:
            buckets.append(current)
            current, used = [], 0
        current.append(i)
        used += size
    if current:
        buckets.append(current)
    return buckets


def open_group(address: str, port: int, rank: int, world_size: int, timeout_s: float):
    """A gloo process group that leaves torch's default group alone (a vLLM worker has its
    own). Rank 0 hosts the TCP store."""
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, world_size, is_master=(rank == 0), timeout=timeout)
    return group_on(store, rank, world_size, timeout_s), store


def host_store(address: str, port: int, world_size: int, timeout_s: float, any_port: bool):
    """Rank 0's TCP store, listening before anyone is told its port. A port picked free earlier
    (`any_port`) may have been taken since: then the system picks another, and the workers are
    told that one (`store.port`); a port the config names is not changed."""
    timeout = timedelta(seconds=timeout_s)
    try:
        return dist.TCPStore(address, port, world_size, is_master=True, timeout=timeout, wait_for_workers=False)
    except dist.DistNetworkError as e:
        if not any_port or "EADDRINUSE" not in str(e):
            raise
        return dist.TCPStore(address, 0, world_size, is_master=True, timeout=timeout, wait_for_workers=False)


def group_on(store, rank: int, world_size: int, timeout_s: float):
    return dist.ProcessGroupGloo(dist.PrefixStore("flashq-weights", store), rank, world_size, timedelta(seconds=timeout_s))


def close_group(group) -> None:
    """Release gloo's connections now rather than in a destructor at interpreter exit, which
    can stall a vLLM worker's shutdown for seconds once the trainer is gone."""
    if group is not None:
        try:
            group.shutdown()
        except RuntimeError:
            pass


def broadcast(group, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    group.broadcast([tensor], opts).wait()
