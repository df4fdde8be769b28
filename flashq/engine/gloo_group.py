"""A gloo process group between the trainer and the rollout engines, and how weights are cut
into broadcast buckets. Plain torch: no vLLM import, so tests and tools can use it cheaply."""

from __future__ import annotations

import errno
import socket
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
    own). Rank 0 hosts the TCP store (`host_store`); the others join it."""
    timeout = timedelta(seconds=timeout_s)
    if rank == 0:
        store = host_store(address, port, world_size, timeout_s, any_port=False)
    else:
        store = dist.TCPStore(address, port, world_size, is_master=False, timeout=timeout)
    return group_on(store, rank, world_size, timeout_s, address), store


def host_store(address: str, port: int, world_size: int, timeout_s: float, any_port: bool):
    """Rank 0's TCP store, listening on `address` alone (torch's own listens on every interface)
    before anyone is told its port. A port picked free earlier (`any_port`) may have been taken
    since: then the system picks another, and the workers are told that one (`store.port`); a
    port the config names is not changed."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        listener = socket.create_server((address, port), family=family, backlog=1024)
    except OSError as e:
        if not any_port or e.errno != errno.EADDRINUSE:
            raise OSError(e.errno, f"the weight transfer's store cannot listen on {address}:{port}: {e.strerror}") from None
        listener = socket.create_server((address, 0), family=family, backlog=1024)
    bound = listener.getsockname()[1]
    return dist.TCPStore(address, bound, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False, master_listen_fd=listener.detach())  # the store owns the socket now


def local_address_towards(address: str) -> str:
    """This host's address on the route to `address` (no packet is sent): where its end of the
    group listens, rather than on every interface."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        probe.connect((address, 9))
        return probe.getsockname()[0]


def group_on(store, rank: int, world_size: int, timeout_s: float, address: str):
    """The group over `store`; this rank's gloo connections listen on its address facing
    `address` (the store's host), not on every interface."""
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timedelta(seconds=timeout_s)
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=local_address_towards(address))]
    return dist.ProcessGroupGloo(dist.PrefixStore("flashq-weights", store), rank, world_size, options)


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
