"""One vLLM `AsyncLLM` inside a rollout worker: generation with per-token policy versions, and
the engine side of vLLM's weight-transfer API.

Versions: the engine labels its weights with `update_weight_version(str(v))`; vLLM 0.32 then
reports, for every finished request, the spans of output tokens sampled under each label. A
request that was in flight across an update therefore carries several versions.

Weight updates never throw work away: the engine pauses with mode "keep" (running requests are
frozen, not aborted), receives the new weights, and resumes. With `recompute_kv_on_update` the
pause also clears the KV cache, so frozen requests re-prefill under the new weights and their
later tokens are sampled from exactly the new policy.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from flashq.config import FlashqConfig
from flashq.config.sections import UNIPROC_EXECUTOR
from flashq.wire.protocol import GenerateRequest, Sample

log = logging.getLogger(__name__)


def configure_cpu_threads(omp_threads: int) -> None:
    """Environment for the CPU backend; must run before vLLM starts its engine process."""
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    os.environ.setdefault("OMP_NUM_THREADS", str(omp_threads))


def pin_v1_model_runner() -> None:
    """vLLM 0.32 picks Model Runner V2 on CUDA by default (V1 on CPU, where V2 lacks Triton).
    What flashq does inside the engine (pause with keep, layer-wise reload, weight-version spans,
    processed logprobs, the grouped proposer, the LoRA manager) is built and tested on V1 only,
    so its engines run V1 everywhere unless the user asks for V2 by name."""
    asked = os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    if asked.strip().lower() in ("1", "true"):
        log.warning("VLLM_USE_V2_MODEL_RUNNER=%s: flashq's engine hooks are built and tested on vLLM's V1 model runner "
                    "only; unset it to run V1", asked)


def prepare_engine_process(cfg: FlashqConfig, device: str | None = None) -> None:
    """Call before this process imports vLLM. On the CPU backend: the engine's environment, and
    with one rank how its engine core will start (forked from here, or from a forkserver that
    imports vLLM meanwhile: flashq/engine/engine_process.py). `device` None: not known yet
    (knowing costs vLLM's import), and a vllm-cpu install means the CPU backend."""
    from flashq.engine.engine_process import engine_start, openmp_threads, start_forkserver, use_fork, vllm_cpu_installed

    rc = cfg.rollout
    pin_v1_model_runner()
    if device is None:
        device = "cpu" if vllm_cpu_installed() else None
    if device != "cpu":
        return
    if (kv := os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)) is not None:  # whole GiB; it would override rollout.kv_cache_gib
        log.warning("VLLM_CPU_KVCACHE_SPACE=%s ignored: the KV cache's size is rollout.kv_cache_gib (%g GiB)", kv, rc.kv_cache_gib)
    configure_cpu_threads(rc.omp_threads)
    if rc.tensor_parallel_size > 1:
        return
    start = engine_start(rc.engine_start, openmp_threads())
    if start == "fork":
        use_fork()
    elif start == "forkserver":
        start_forkserver()


def choose_engine_backend(cfg: FlashqConfig, device: str) -> str:
    """The weight-transfer backend the engine serves: weight_sync.backend, or by the device
    (gloo on a CPU; on CUDA, NCCL, or CUDA IPC on the device a colocated trainer shares)."""
    if cfg.weight_sync.backend != "auto":
        return cfg.weight_sync.backend
    if device == "cpu":
        return "gloo"
    return "ipc" if cfg.placement.colocate else "nccl"


class RolloutEngine:
    def __init__(self, cfg: FlashqConfig, model_path: Path, worker_index: int, device: str):
        self.cfg = cfg
        self.model_path = model_path
        self.worker_index = worker_index
        self.device = device
        self.llm = None
        self.version = 0
        self.transfer_ready = False
        self.update_open = False  # started, not finished: generation stays paused until a push completes
        self.paused_s = 0.0  # seconds generation stood paused for pushes, summed
        self.colocate = cfg.placement.colocate  # generation and training take turns on the devices
        self.backend: str | None = None  # the weight-transfer backend, chosen at start
        self.released_at: float | None = None  # colocated: when the engine last gave the devices up
        self.released_s = 0.0  # seconds it stood released, summed
        self.receive_while_generating = False  # set at start, with the backend
        self.recompute_kv = cfg.rollout.recompute_kv_on_update
        self.draft_stats_path: str | None = None
        self.lora_request = None  # with trainer.lora: the policy's adapter, built once at start
        self.counters = None  # vLLM's counts, where its statistics are on (with speculation)

    async def start(self) -> None:
        from flashq.engine.engine_process import launching_engine_core

        rc = self.cfg.rollout
        prepare_engine_process(self.cfg, self.device)  # before vLLM's import
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from flashq.engine.engine_counters import EngineCounters, engine_counters
        from flashq.engine.vllm_plugin import end_engine_core_without_teardown

        self.backend = backend = choose_engine_backend(self.cfg, self.device)
        self.receive_while_generating = self.cfg.receives_while_generating(backend, self.colocate)
        kwargs = dict(
            model=str(self.model_path),
            dtype=self.cfg.model.dtype,
            max_model_len=rc.max_model_len,
            max_num_seqs=rc.max_num_seqs,
            enforce_eager=rc.enforce_eager,
            tensor_parallel_size=rc.tensor_parallel_size,
            seed=self.cfg.seed + self.worker_index,
            weight_transfer_config={"backend": backend},
            logprobs_mode="processed_logprobs",
            disable_log_stats=rc.speculation == "none",  # vLLM counts drafts and accepted tokens in its stats
        )
        if self.device == "cuda":
            kwargs["gpu_memory_utilization"] = rc.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = self.colocate  # released between batches: weights to CPU memory, KV cache freed
        else:
            kwargs["kv_cache_memory_bytes"] = int(rc.kv_cache_gib * 2**30)
        os.environ["FLASHQ_SPECULATION"] = rc.speculation  # read by flashq's vLLM plugin in every engine process
        wait = rc.engine_wait if rc.engine_wait != "auto" else ("nap" if self.device == "cpu" else "spin")
        os.environ["FLASHQ_ENGINE_WAIT"] = wait  # and this
        if rc.speculation == "ngram":
            kwargs["speculative_config"] = {"method": "ngram", "num_speculative_tokens": rc.num_speculative_tokens,
                                            "prompt_lookup_min": 2, "prompt_lookup_max": 5}
        elif rc.speculation == "suffix":
            import importlib.util

            if importlib.util.find_spec("arctic_inference") is None:
                raise RuntimeError("rollout.speculation=suffix needs arctic-inference's suffix tree: pip install "
                                   "arctic-inference, or build it alone with bench/build_arctic_suffix.sh and add it to PYTHONPATH")
            kwargs["speculative_config"] = {"method": "suffix", "num_speculative_tokens": rc.num_speculative_tokens}
        elif rc.speculation == "grouped":
            from flashq.engine.vllm_plugin import use_grouped_proposer

            os.environ["FLASHQ_DRAFT_ADAPTIVE"] = "1" if rc.adaptive_drafts else "0"  # and these by its proposer
            os.environ["FLASHQ_DRAFT_HISTORY_EPOCHS"] = str(rc.history_epochs)
            os.environ["FLASHQ_DRAFT_STATS"] = self.draft_stats_path = os.path.join(
                tempfile.gettempdir(), f"flashq-drafts-{os.getpid()}-{self.worker_index}.f64")
            if os.path.exists(self.draft_stats_path):  # an earlier engine's in this process
                os.remove(self.draft_stats_path)
            use_grouped_proposer()  # and in this one, whose plugins may have loaded already
            kwargs["speculative_config"] = {"method": "suffix", "num_speculative_tokens": rc.num_speculative_tokens,
                                            "suffix_decoding_min_token_prob": rc.draft_min_prob}
        lora = self.cfg.trainer.lora
        if lora is not None and lora.serve == "adapter":  # one adapter, the policy's (flashq.engine.adapter), named by every request
            from flashq.engine.adapter import adapter_request

            kwargs.update(enable_lora=True, max_loras=1, max_cpu_loras=1, max_lora_rank=lora.engine_rank)
            self.lora_request = adapter_request()
        if self.device == "cpu" and rc.tensor_parallel_size == 1:
            # vllm-cpu runs its one worker in a process of its own (the "mp" executor) and passes it
            # every engine step over shared memory; in the engine-core process (vLLM's UniProcExecutor)
            # the quickstart's engine took 98 ms of CPU per training step instead of 130 + 22 ms
            kwargs["distributed_executor_backend"] = UNIPROC_EXECUTOR
        kwargs.update(rc.engine_kwargs)
        kwargs.setdefault("worker_extension_cls", "flashq.engine.worker_extension.FlashqWorkerExtension")
        end_engine_core_without_teardown()
        with launching_engine_core():
            # a statistics logger of its own switches vLLM's statistics on: only where they are kept
            loggers = None if kwargs["disable_log_stats"] else [EngineCounters]
            self.llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs), stat_loggers=loggers)
        self.counters = engine_counters(self.llm)
        await self.llm.update_weight_version("0")

    def speculation_counters(self) -> dict[str, float]:
        """vLLM's counts since the engine started (flashq.engine.engine_counters): engine steps
        (iterations), and with speculation the verification steps with a draft, draft tokens and
        accepted draft tokens; with grouped drafts also the seconds spent drafting, the
        proposer's calls and the steps it drafted nothing because no draft would have paid."""
        if self.counters is None:
            return {}  # vLLM's statistics are off (they cost time) without speculation, so it counts nothing
        from flashq.engine.grouped_proposer import read_stats

        out = dict(self.counters.totals)
        stats = read_stats(self.draft_stats_path) if self.draft_stats_path else None  # flashq's proposer's
        if stats:
            out["spec_drafting_s"], out["spec_proposer_calls"] = stats["drafting_s"], stats["calls"]
            out["spec_step_fixed_s"], out["spec_step_per_position_s"] = stats["step_fixed_s"], stats["step_per_token_s"]
            out["spec_off_steps"] = stats["off_steps"]
        return out

    @property
    def engine_ranks(self) -> int:
        return self.cfg.rollout.tensor_parallel_size

    async def generate(self, req: GenerateRequest) -> Sample:
        from vllm import SamplingParams
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            max_tokens=req.max_tokens,
            min_tokens=req.min_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            seed=req.seed,
            logprobs=0,  # the sampled token's logprob only
            flat_logprobs=True,  # plain float lists instead of a dict per position
            stop=req.stop or None,
            detokenize=bool(req.stop),  # decoded once at the end (below); stop strings need text as it grows
            skip_clone=True,  # made for this request alone: vLLM's per-request deepcopy only costs time
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        t0 = time.monotonic()
        final = None
        async for out in self.llm.generate(tokens_input(req.prompt_ids.tolist()), params, request_id=req.request_id,
                                           lora_request=self.lora_request):
            final = out
        c = final.outputs[0]
        token_ids = np.asarray(c.token_ids, dtype=np.int32)
        flat = c.logprobs
        if len(flat.logprobs) != len(token_ids) or flat.token_ids != list(c.token_ids):
            raise RuntimeError(f"{req.request_id}: vLLM returned {len(flat.logprobs)} logprobs for {len(token_ids)} tokens")
        logprobs = np.asarray(flat.logprobs, dtype=np.float32)
        return Sample(
            request_id=req.request_id,
            group_id=req.group_id,
            worker=self.worker_index,
            token_ids=token_ids,
            logprobs=np.maximum(logprobs, np.float32(-1e4)),
            versions=self._versions(c, len(token_ids)),
            finish_reason=c.finish_reason if c.finish_reason in ("stop", "length", "abort") else "error",
            gen_seconds=time.monotonic() - t0,
            # decoded here, with the tokenizer vLLM loaded anyway, so the reward worker needs none of
            # its own (loading one through transformers cost it 3.7 s of CPU at start-up)
            text=self.llm.tokenizer.decode(c.token_ids, skip_special_tokens=True),
        )

    def _versions(self, completion, n: int) -> np.ndarray:
        versions = np.full(n, -1, dtype=np.int32)
        for span in completion.weight_versions or []:
            versions[span.start : span.end] = int(span.version)
        if n and versions.min() < 0:
            raise RuntimeError(f"vLLM returned tokens without a weight-version label: {completion.weight_versions}")
        return versions

    # --- vLLM's weight-transfer API, as the trainer drives it

    async def weight_sync(self, method: str, payload, version: int) -> None:
        """`init_weight_transfer_engine`: join (or rejoin) the trainer's transfer group.
        `push_weights`: a whole update in one call into the engine core (pause with keep,
        receive while the trainer broadcasts, label the weights `version`, resume), so generation
        stops only for the transfer itself, not for round trips between processes. With
        `receive_while_generating` the receive comes first, while the engine generates, and the
        pause only loads what arrived."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        llm = self.llm
        if method == "init_weight_transfer_engine":
            if self.update_open:  # a push broke off (a rollout worker died mid-way)
                await llm.collective_rpc("flashq_abandon_weight_update")
                self.update_open = False
            if self.transfer_ready:  # the trainer rebuilt the group (the rollout workers changed)
                await llm.shutdown_weight_transfer_engine()
            if self.backend == "ipc":  # one engine on the trainer's device: no group, so no rank in it
                payload = {k: v for k, v in payload.items() if k != "rank_offset"}
            await llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=payload))
            self.transfer_ready = True
        elif method == "release_devices":
            await self.release_devices()
        elif method == "push_weights":
            lora = self.cfg.trainer.lora
            deadline_s = self.cfg.weight_sync.timeout_s  # NCCL receives only: gloo's collectives time out themselves
            if lora is not None:
                call = ("flashq_push_adapter", {"update_info": payload, "peft_config": lora.peft_dict(), "merged": lora.serve == "merged",
                                                "deadline_s": deadline_s})
            elif self.receive_while_generating:
                # the bytes arrive while the engine generates; a receive that fails never paused it
                await llm.engine_core.call_utility_async("flashq_receive_while_generating",
                                                         {"update_info": payload, "deadline_s": deadline_s})
                call = ("flashq_load_staged", {})
            else:
                call = ("flashq_push_weights", {"update_info": payload, "deadline_s": deadline_s})
            self.update_open = True
            asleep = self.colocate and self.device == "cuda"
            if asleep:  # the new weights load into resident parameters
                await llm.wake_up(["weights"])
            # one call into the engine core (flashq's vllm_plugin); the engine stays paused if it fails. A
            # sleeping engine resumes when its KV cache is back, not before
            self.paused_s += await llm.engine_core.call_utility_async("flashq_pause_push_resume", *call, str(version),
                                                                      self.recompute_kv, not asleep)
            if asleep:
                await llm.wake_up(["kv_cache"])  # all resident again: vLLM resumes scheduling
            self.update_open = False
            self.version = version
            if self.released_at is not None:
                self.released_s += time.monotonic() - self.released_at
                self.released_at = None
        else:
            raise ValueError(f"unknown weight sync method {method!r}")

    async def release_devices(self) -> None:
        """Colocated: give the devices to the trainer until the next push. Requests in flight are
        kept (frozen) and go on after it. On a GPU, vLLM's sleep level 1 (weights to CPU memory,
        KV cache freed); on a CPU, the scheduler paused (vLLM's level 0), so the trainer has
        every core."""
        if not self.colocate:
            raise RuntimeError("release_devices without placement.colocate: the engine has devices of its own")
        await self.llm.sleep(level=1 if self.device == "cuda" else 0, mode="keep")
        self.released_at = time.monotonic()

    async def shutdown(self) -> None:
        if self.llm is not None:
            try:
                await self.llm.shutdown_weight_transfer_engine()
            except Exception:  # noqa: BLE001 - not initialised, or the engine is already gone
                pass
            self.llm.shutdown(timeout=10)
            self.llm = None
        if self.draft_stats_path and os.path.exists(self.draft_stats_path):  # the proposer's counters, read by now
            os.remove(self.draft_stats_path)
