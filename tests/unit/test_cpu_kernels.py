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


def test_install_makes_vllms_sampler_count_token_ranks_eagerly():
    """vLLM's sampler counts the sampled token's rank through a `torch.compile`d function: on a
    CPU an inductor compile in a fresh engine's first steps (some 3 s of every run's first batch).
    After `install` (run by flashq's vLLM plugin in every vLLM process) it counts eagerly."""
    from vllm.v1.sample import sampler

    from flashq.engine.cpu_kernels import install, token_ranks

    install()
    assert sampler.batched_count_greater_than is token_ranks
    logprobs = torch.tensor([[-0.1, -2.0, -0.5, -0.5], [-3.0, -0.2, -0.9, -0.2]])
    sampled = torch.tensor([[-0.5], [-0.2]])
    assert sampler.batched_count_greater_than(logprobs, sampled).tolist() == [3, 2]  # ties count, as vLLM's do


SCAN_SCRIPT = """
import sys

import llvmlite.binding.ffi  # noqa: F401 - what numba loads, as a forked engine core may have it
from vllm.triton_utils.dispatcher import register_kernels
from vllm.v1.sample import rejection_sampler

from flashq.engine.cpu_kernels import KERNEL, expand_kernel, hidden_from_kernel_scan

with hidden_from_kernel_scan():
    register_kernels({KERNEL: expand_kernel})
print(type(rejection_sampler.expand_kernel).__name__, "llvmlite.binding.ffi" in sys.modules)
"""


def test_kernel_override_registers_with_llvmlite_loaded():
    """vLLM's registry scans every loaded module and fails on llvmlite's ffi.lib; a forked engine
    core has numba loaded wherever its worker had (the suite's in-process engines did)."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", SCAN_SCRIPT], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["KernelOverride", "True"]
