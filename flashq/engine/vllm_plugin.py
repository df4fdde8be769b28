"""vLLM plugin entry point (`vllm.general_plugins`), run in every vLLM process.

Keep this import-light: vLLM loads it before building each worker.
"""

import logging


class _BenignReloadWarnings(logging.Filter):
    """vLLM's layerwise reload warns for layers that receive no weights. Rotary embeddings have
    none, and a tied LM head shares the embedding's (flashq repacks it, see gloo_transfer), so
    on every weight update these two lines are noise; so is the notice that flashq's CPU
    `expand_kernel` (cpu_kernels) replaces vLLM's. Anything else still gets through."""

    BENIGN = ("RotaryEmbedding: Failed to load weights", "ParallelLMHead: Failed to load weights",
              "Kernel vllm.v1.sample.rejection_sampler.expand_kernel is already registered. Overwriting.")

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() not in self.BENIGN


def register() -> None:
    import os

    from flashq.engine.gloo_transfer import register as register_gloo

    register_gloo()
    if _cpu_platform():
        from flashq.engine.cpu_kernels import install

        install()
    if os.environ.get("FLASHQ_SPECULATION") == "grouped":
        use_grouped_proposer()
    logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_BenignReloadWarnings())
    logging.getLogger("vllm.triton_utils.dispatcher").addFilter(_BenignReloadWarnings())


def _cpu_platform() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def use_grouped_proposer() -> None:
    """vLLM's "suffix" method, with flashq's grouped drafter as its proposer. vLLM checks that
    arctic-inference (its own suffix implementation) is installed; flashq's replaces it, so
    that check is answered for it."""
    import vllm.config.speculative as speculative
    import vllm.v1.worker.gpu_model_runner as runner

    from flashq.engine.grouped_proposer import GroupedSuffixProposer

    speculative.has_arctic_inference = lambda: True
    runner.SuffixDecodingProposer = GroupedSuffixProposer
