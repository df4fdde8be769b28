"""The gloo weight-transfer pieces that need no vLLM engine: bucket plans and a real two-process
broadcast over the same group code the engines use."""

import multiprocessing as mp

import pytest
import torch

from flashq.engine.gloo_group import broadcast, close_group, dtype_from_name, nbytes, open_group, plan_buckets
from flashq.roles.common import free_port


def test_buckets_keep_order_and_size():
    assert plan_buckets([4, 4, 4], 8) == [[0, 1], [2]]
    assert plan_buckets([10, 1, 1], 8) == [[0], [1, 2]]  # an oversized tensor travels alone
    assert plan_buckets([], 8) == []
    assert nbytes(torch.float32, [2, 3]) == 24
    with pytest.raises(ValueError, match="unknown dtype"):
        dtype_from_name("float33")


def _receiver(port, q):
    group, store = open_group("127.0.0.1", port, 1, 2, 30)
    buf = torch.empty(1000, dtype=torch.uint8)
    broadcast(group, buf)
    q.put(buf.view(torch.float32).sum().item())
    close_group(group)


def test_two_process_broadcast():
    port = free_port()
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_receiver, args=(port, q))
    p.start()
    group, store = open_group("127.0.0.1", port, 0, 2, 30)
    data = torch.arange(250, dtype=torch.float32)
    broadcast(group, data.view(torch.uint8))
    assert q.get(timeout=30) == float(data.sum())
    p.join(30)
    close_group(group)
    assert p.exitcode == 0
