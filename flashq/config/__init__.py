"""One typed config for a whole run, one section per role, validated when it is loaded.

A run is described by a YAML file plus `key=value` overrides (`async_ratio=2`,
`trainer.lr=3e-4`). Unknown keys and bad values fail at load with the field's dotted path.
The defaults run the quickstart on a laptop CPU.

This module must stay importable without torch or vLLM (the launcher and `--dry-run` use it).
"""

from __future__ import annotations

import difflib
import logging
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from flashq.config.fields import all_keys, section_at
from flashq.config.sections import (  # noqa: F401 - the sections are part of this module's interface
    ArithmeticConfig,
    ConfigError,
    EnvConfig,
    EvalConfig,
    FaultConfig,
    FileTaskConfig,
    ForcedLengths,
    LogConfig,
    ModelConfig,
    PlacementConfig,
    RayConfig,
    RayRoleResources,
    ReasoningGymConfig,
    RewardConfig,
    RolloutConfig,
    SamplingConfig,
    Section,
    SFTConfig,
    TaskConfig,
    TransportConfig,
    WeightSyncConfig,
)
from flashq.config.training import LoRAConfig, LossConfig, TrainerConfig  # noqa: F401 - as above

REFERENCE = "docs/reference/configuration.md"  # every key, generated from these models (`flashq reference`)


SFT_STOP_NEEDS_ANSWERS = ("sft.stop_at_greedy_accuracy checks answers to task prompts: an env's demonstrations have none "
                          "(set sft.stop_at_greedy_accuracy=null and choose sft.steps)")


class FlashqConfig(Section):
    name: str = Field("quickstart", description="The run's name: its directory is <log.root>/<name>-<timestamp>.")
    seed: int = Field(0, description="Seeds the vLLM engines (plus each worker's index), seeded requests (sampling.seed_requests) and evaluation.")
    async_ratio: float = Field(
        2.0,
        ge=0,
        description="alpha: generation may lead training by at most alpha batches; 0 is synchronous.",
    )
    model: ModelConfig = ModelConfig()
    task: TaskConfig = TaskConfig()
    sampling: SamplingConfig = SamplingConfig()
    env: EnvConfig | None = Field(None, description="Set to train on a multi-turn environment instead of single-turn tasks.")
    eval: EvalConfig | None = Field(None, description="Set to evaluate on held-out prompts during training.")
    rollout: RolloutConfig = RolloutConfig()
    reward: RewardConfig = RewardConfig()
    trainer: TrainerConfig = TrainerConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    transport: TransportConfig = TransportConfig()
    sft: SFTConfig = SFTConfig()
    placement: PlacementConfig = PlacementConfig()
    log: LogConfig = LogConfig()
    fault: FaultConfig = FaultConfig()
    ray: RayConfig = RayConfig()
    resume_from: Path | None = Field(None, description="A checkpoint directory to continue from (set by `flashq launch --resume`).")

    @model_validator(mode="after")
    def _check(self) -> FlashqConfig:
        from flashq.placement import check_gpu_placement

        check_gpu_placement(self)
        if self.sampling.max_tokens >= self.rollout.max_model_len:
            raise ValueError(
                f"sampling.max_tokens ({self.sampling.max_tokens}) must be below rollout.max_model_len "
                f"({self.rollout.max_model_len}) to leave room for the prompt"
            )
        if self.sampling.top_p < 1:
            raise ValueError(
                f"sampling.top_p is {self.sampling.top_p}: vLLM would report logprobs of the top-p truncated "
                "distribution, which the trainer does not reproduce, so importance weights would be biased; use top_p 1"
            )
        lc = self.trainer.loss
        if lc.overlong == "penalty" and not 0 < lc.overlong_margin < self.sampling.max_tokens:
            raise ValueError(
                f"trainer.loss.overlong penalty needs 0 < overlong_margin < sampling.max_tokens ({self.sampling.max_tokens}); "
                f"got {lc.overlong_margin}"
            )
        fl = self.sampling.forced_lengths
        if self.rollout.scheduler == "oracle" and fl is None:
            raise ValueError("rollout.scheduler 'oracle' needs sampling.forced_lengths (it must know every length)")
        if fl is not None and not fl.min <= fl.median <= fl.max <= self.sampling.max_tokens:
            raise ValueError("sampling.forced_lengths needs min <= median <= max <= sampling.max_tokens")
        if self.env is not None and self.sft.warm_start and self.sft.stop_at_greedy_accuracy is not None:
            raise ValueError(SFT_STOP_NEEDS_ANSWERS)
        if self.env is not None and (self.rollout.scheduler != "fifo" or self.rollout.chunk_tokens or fl is not None):
            raise ValueError("env episodes run with rollout.scheduler fifo, no rollout.chunk_tokens and no sampling.forced_lengths")
        if self.eval is not None and fl is not None:
            # a config built on one that evaluates (the quickstart's) still runs; the resolved
            # config.yaml shows eval: null, and the launcher says why
            logging.getLogger("flashq.config").warning("eval: off: benchmark replays (sampling.forced_lengths) have no answers")
            object.__setattr__(self, "eval", None)
        if self.eval is not None:
            if self.eval.task is not None and self.eval.task == self.task:
                raise ValueError("eval.task is the training task: its prompts would be trained on; leave eval.task unset to hold out "
                                 "eval.holdout of them instead")
        if self.placement.colocate:
            shared = {"async_ratio": (self.async_ratio, 0), "rollout.num_workers": (self.rollout.num_workers, 1),
                      "rollout.tensor_parallel_size": (self.rollout.tensor_parallel_size, 1),
                      "trainer.world_size": (self.trainer.world_size, 1)}
            if wrong := [f"{k} {v} (needs {want})" for k, (v, want) in shared.items() if v != want]:
                raise ValueError("placement.colocate takes turns on one engine's devices with one trainer rank: "
                                 + ", ".join(wrong))
        if self.trainer.offload_optimizer and not self.placement.colocate:
            raise ValueError("trainer.offload_optimizer frees the device for an engine that shares it: set placement.colocate")
        if self.weight_sync.receive_while_generating and (why := self._blocks_receiving_while_generating(self.placement.colocate)):
            raise ValueError(f"weight_sync.receive_while_generating needs one worker per engine, in its engine core's process, "
                             f"full-weight pushes and no colocation: not {why}")
        lora = self.trainer.lora
        if lora is not None and lora.serve == "auto":  # the resolved config.yaml shows which
            object.__setattr__(lora, "serve", "merged" if self.model.dtype == "float32" else "adapter")
        if lora is not None and self.trainer.world_size > 1:
            raise ValueError("trainer.lora runs on one trainer rank: set trainer.world_size 1 (sharding the frozen base "
                             "with FSDP2 under an adapter is not built yet)")
        return self

    @property
    def staleness_bound(self) -> int:
        """ceil(alpha): the most versions a trained token may lag its trainer."""
        return math.ceil(self.async_ratio)

    @property
    def message_limit_bytes(self) -> int:
        """The largest message a socket accepts: `transport.max_message_mb`, raised to the largest
        batch this config can make (every sequence max_model_len tokens long, 17 bytes a token:
        prompt or response id, logprob, version, loss-mask byte; 128 a sequence for its id, group,
        reward, offsets and finish reason; a split agent episode up to env.max_turns sequences), so
        a batch is never refused for its size."""
        sequences = self.trainer.batch_groups * self.sampling.group_size
        if self.env is not None and self.env.agent is not None and self.env.on_rewrite == "split":
            sequences *= self.env.max_turns  # a split episode is up to one sequence a call
        largest_batch = sequences * (17 * self.rollout.max_model_len + 128) + (64 << 10)
        return max(self.transport.max_message_mb << 20, largest_batch)

    def receives_while_generating(self, backend: str, colocate: bool) -> bool:
        """Whether an engine receives pushes while it generates (`weight_sync.receive_while_generating`;
        unset: with gloo), given the transfer backend chosen and the placement. Only where its
        worker shares the engine core's process; with full-weight pushes; not colocated."""
        wanted = self.weight_sync.receive_while_generating
        return ((backend == "gloo") if wanted is None else wanted) and not self._blocks_receiving_while_generating(colocate)

    def _blocks_receiving_while_generating(self, colocate: bool) -> str:
        """What rules out receiving a push while generating, "" when nothing does: the load-time
        check refuses it when asked for, and `receives_while_generating` turns it off."""
        if colocate:
            return "placement.colocate (generation and training take turns)"
        if self.rollout.tensor_parallel_size > 1:
            return "rollout.tensor_parallel_size > 1 (each engine's workers are other processes)"
        if not self.rollout.worker_in_engine_process:
            executor = self.rollout.engine_kwargs["distributed_executor_backend"]
            return f"rollout.engine_kwargs.distributed_executor_backend {executor!r} (the worker is another process)"
        if self.trainer.lora is not None:
            return "trainer.lora (adapter pushes pause to receive)"
        return ""

    @property
    def total_groups(self) -> int:
        return self.trainer.steps * self.trainer.batch_groups

    def role_names(self) -> list[str]:
        return (
            ["coordinator"]
            + [f"rollout-{i}" for i in range(self.rollout.num_workers)]
            + [f"reward-{i}" for i in range(self.reward.num_workers)]
            + ["trainer"]
        )


ROLE_SECTIONS = {
    "coordinator": ["name", "seed", "async_ratio", "model", "task", "sampling", "env", "eval", "trainer", "rollout", "reward", "transport", "log", "fault", "resume_from"],
    "rollout": ["name", "seed", "model", "env", "rollout", "weight_sync", "transport", "log"],
    "reward": ["name", "model", "reward", "transport", "log"],
    "trainer": ["name", "seed", "async_ratio", "model", "sampling", "env", "trainer", "weight_sync", "transport", "log", "fault", "resume_from"],
}


def role_kind(role: str) -> str:
    kind = role.split("-")[0]
    if kind not in ROLE_SECTIONS:
        raise ConfigError(f"unknown role {role!r}; roles are {', '.join(ROLE_SECTIONS)} (e.g. rollout-0)")
    return kind


def role_view(cfg: FlashqConfig, role: str) -> dict[str, Any]:
    """The part of the resolved config a role reads (what `--dry-run` prints)."""
    full = cfg.model_dump(mode="json")
    return {key: full[key] for key in ROLE_SECTIONS[role_kind(role)]}


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override {dotted}: {key!r} is not a section")
        node = child
    node[keys[-1]] = value


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    parsed = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. async_ratio=2)")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as e:
            raise ConfigError(f"override {item!r}: cannot parse value: {e}") from None
        parsed.append((key.strip(), value))
    return parsed


def did_you_mean(path: list[str]) -> list[str]:
    """The keys an unknown one was probably meant to be: a close spelling in its own section
    (trainer.lrr: trainer.lr), else a key of that name (or close) in another (lr: trainer.lr, sft.lr)."""
    name, section = path[-1], section_at(FlashqConfig, path[:-1])
    near = difflib.get_close_matches(name, list(section.model_fields), n=1, cutoff=0.6) if section is not None else []
    if near:
        return [".".join([*path[:-1], n]) for n in near]
    keys = all_keys(FlashqConfig)
    leaves = difflib.get_close_matches(name, {k.rsplit(".", 1)[-1] for k in keys}, n=1, cutoff=0.8)
    return [k for leaf in leaves for k in keys if k.rsplit(".", 1)[-1] == leaf][:4]


def _unknown_key(path: list[str]) -> str:
    near = did_you_mean(path)
    hint = f"did you mean {' or '.join(near)}? " if near else "check the spelling; "
    return f"unknown field ({hint}every key is in {REFERENCE})"


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = _unknown_key([str(p) for p in e["loc"]])
        lines.append(f"  {where}: {msg}" + (f" (got {e['input']!r})" if e["type"] != "extra_forbidden" and "input" in e and not isinstance(e["input"], dict) else ""))
    return "\n".join(lines)


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> FlashqConfig:
    """Read YAML (or start from defaults when `path` is None), apply overrides, validate."""
    data: dict[str, Any] = {}
    source = "(defaults)"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except OSError as e:
            raise ConfigError(f"cannot read config {path}: {e.strerror}") from None
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config {path} is not valid YAML: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"config {path} must be a mapping of sections, got {type(data).__name__}")
    for key, value in parse_overrides(list(overrides)):
        _set_dotted(data, key, value)
    try:
        return FlashqConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(e, source)) from None


def dump_config(cfg: FlashqConfig, path: Path) -> None:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
