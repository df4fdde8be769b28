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


def test_recovered_tokens_draw_noise_only_for_drafting_requests():
    """At T > 0 vLLM draws vocabulary-wide noise for every request at each verification step,
    though only requests with a draft use it (9% of a CPU engine's time with drafts rare).
    flashq's replacement draws it for the drafting rows alone: the global RNG moves by exactly
    that draw, a request's own generator by its row, and each recovered token follows the target
    distribution without its draft token (vLLM's rule with no draft probabilities)."""
    from types import SimpleNamespace

    from vllm.platforms.cpu import CpuPlatform

    from flashq.engine.cpu_kernels import hidden_from_kernel_scan, sample_recovered_tokens

    with hidden_from_kernel_scan():  # where an earlier test loaded numba (tests selected with -k drafting)
        CpuPlatform.register_triton_kernel_overrides()  # the CPU fallbacks of vLLM's kernels, as its workers register them
    vocab = 6
    target = torch.softmax(torch.tensor([[0.5, 1.0, 2.0, 0.0, -1.0, 0.3], [1.5, 0.2, 0.2, 0.9, 0.0, -0.5],
                                         [0.0, 0.0, 0.0, 0.0, 0.0, 3.0]]), dim=-1)
    num_draft = [1, 0, 0, 2]  # requests 1 and 2 draft nothing
    cu = torch.tensor([1, 1, 1, 3])
    drafts = torch.tensor([2, 0, 5])
    none = SimpleNamespace(generators={})

    torch.manual_seed(0)
    sample_recovered_tokens(2, num_draft, cu, drafts, None, target, none, "cpu")
    after = torch.get_rng_state()
    torch.manual_seed(0)
    torch.empty((2, vocab)).exponential_()  # the two drafting rows' noise, nothing more
    assert torch.equal(after, torch.get_rng_state())

    own = torch.Generator().manual_seed(7)
    sample_recovered_tokens(2, num_draft, cu, drafts, None, target, SimpleNamespace(generators={3: own, 1: torch.Generator()}), "cpu")
    used = own.get_state()
    own.manual_seed(7)
    torch.empty(vocab).exponential_(generator=own)
    assert torch.equal(used, own.get_state())

    torch.manual_seed(1)
    n = 20_000
    counts = torch.zeros(3, vocab)
    for _ in range(n):
        out = sample_recovered_tokens(2, num_draft, cu, drafts, None, target, none, "cpu")
        counts[torch.arange(3), out] += 1
    expected = target.clone()
    expected[torch.arange(3), drafts] = 0
    expected /= expected.sum(-1, keepdim=True)
    assert (counts / n - expected).abs().max() < 0.015


class _Runner:
    """Just what the model runner's `_sample` reads, with samplers that say which one ran (the
    dispatch is what is tested here; real engines sample through it in test_speculation.py)."""

    use_async_scheduling = False

    def __init__(self):
        from types import SimpleNamespace

        self.input_batch = SimpleNamespace(sampling_metadata="metadata", update_async_output_token_ids=lambda: None)
        self.sampler = lambda logits, sampling_metadata: "plain"
        self.rejection_sampler = lambda spec, draft_probs, logits, sampling_metadata: "rejection"

    def _get_spec_decode_draft_probs(self, spec):
        return None


def test_a_step_without_drafts_is_sampled_as_without_speculation():
    """With speculation on, vLLM sends every step through the rejection sampler, one where no
    request drafted too (7% of the engine's time against 4.5% for the plain sampler with SmolLM2,
    drafting off). After `install`, such a step takes the plain sampler; a step with a draft in
    it is still verified."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    from flashq.engine.cpu_kernels import install

    install()
    install()  # idempotent: vLLM loads plugins in more than one place
    runner, logits = _Runner(), torch.zeros(3, 8)
    no_drafts = SpecDecodeMetadata.make_dummy([[], [], []], torch.device("cpu"))
    one_draft = SpecDecodeMetadata.make_dummy([[], [5, 6], []], torch.device("cpu"))
    assert CPUModelRunner._sample(runner, logits, no_drafts) == "plain"
    assert CPUModelRunner._sample(runner, logits, one_draft) == "rejection"
    assert CPUModelRunner._sample(runner, logits, None) == "plain"
