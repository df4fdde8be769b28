"""flashq's CPU `expand_kernel` (vLLM issue #55005): per-request values spread to their tokens,
in the buffer's own dtype, with the greedy sentinel replaced."""

import torch

from flashq.engine.cpu_kernels import expand_kernel


def test_expand_writes_float_and_int_buffers_in_place():
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    temps = torch.tensor([1.0, 0.0, 0.7])
    out = torch.full((6,), -9.0)
    expand_kernel(out, temps, cu, 0, 1)  # temperature 0 (greedy) is verified at temperature 1
    assert out.tolist() == torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0, 0.7]).tolist()
    top_k = torch.tensor([5, 0, 7], dtype=torch.int32)
    out = torch.full((6,), -9, dtype=torch.int32)
    expand_kernel(out, top_k, cu, 0, 0)
    assert out.tolist() == [5, 5, 0, 0, 0, 7]


def test_expand_leaves_the_buffer_tail_alone():
    out = torch.full((4,), -1.0)
    expand_kernel(out, torch.tensor([0.5]), torch.tensor([2]), 0, 1)
    assert out.tolist() == [0.5, 0.5, -1.0, -1.0]
