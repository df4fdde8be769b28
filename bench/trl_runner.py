"""TRL's side of bench/vs_trl.py: one `GRPOTrainer` run, in its own process so each system starts
cold, configured from the same flashq config as the flashq run beside it.

The prompts are flashq's task source in order (task k of the seed), the reward is flashq's
reward function, and every setting both systems share (group size, prompts a step, optimizer,
schedule, max new tokens, temperature, loss) is read from the flashq config. What differs is
TRL's own machinery, named by a setting (`SETTINGS`), each a way TRL's docs offer to run it;
bench/vs_trl.py picks TRL's best on calibration seeds as it picks flashq's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

# TRL's ways of running on a CPU, as GRPOConfig fields. "default": TRL's own defaults (transformers'
# generate, bf16 autocast, gradient checkpointing); "paged": transformers' paged continuous
# batching for generation (`use_transformers_paged`; its weights kept in float32 between steps:
# `float32_masters`); "no_checkpointing": activations kept.
SETTINGS = {
    "default": {},
    "paged": {"use_transformers_paged": True},
    "no_checkpointing": {"gradient_checkpointing": False},
    "paged_no_checkpointing": {"use_transformers_paged": True, "gradient_checkpointing": False},
}


def trl_schedule(tc) -> dict:
    """flashq's learning-rate schedule as transformers' scheduler names it (the same shapes:
    linear warm-up, then constant, or cosine or linear decay to lr x lr_min_ratio by the last step;
    a warm-up's rates run one step apart: transformers starts it at 0, flashq at lr / warm-up steps)."""
    if tc.lr_schedule == "constant":
        return {"lr_scheduler_type": "constant_with_warmup" if tc.lr_warmup_steps else "constant", "warmup_steps": tc.lr_warmup_steps}
    if tc.lr_schedule == "cosine" and tc.lr_min_ratio > 0:
        return {"lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": tc.lr_min_ratio},
                "warmup_steps": tc.lr_warmup_steps}
    if tc.lr_min_ratio > 0:
        raise SystemExit(f"trainer.lr_min_ratio {tc.lr_min_ratio} with a {tc.lr_schedule} decay has no transformers scheduler to match")
    return {"lr_scheduler_type": tc.lr_schedule, "warmup_steps": tc.lr_warmup_steps}


def precision(tc) -> dict:
    """flashq's compute dtype as TRL's mixed precision: bf16 autocast over float32 weights is
    what flashq's compute_dtype bfloat16 does with its float32 masters. (Gradient checkpointing
    changes no number, only speed and memory: a setting of each system's own.)"""
    return {"bf16": tc.compute_dtype == "bfloat16"}


def float32_masters(model):
    """A callback that keeps TRL's paged setting on float32 weights, as its other settings are.

    TRL 1.16 casts the policy to bf16 in place before paged generation (`unwrapped_model.to(
    torch.bfloat16)` in `GRPOTrainer`, since huggingface/trl#3471) and never casts it back, so
    from the first step on it trains bf16 weights, where an update below bf16's resolution is
    lost: on job R's calibration seeds it ended at reward 0.10 and 0.075 against 0.425 and 0.175
    without paging. The callback holds each step's float32 weights aside when the step begins
    and puts them back, with the gradients in float32, before the optimizer steps: generation
    and the loss run on the bf16 copy (bf16 compute either way), the update lands on float32."""
    from transformers import TrainerCallback

    params = list(model.parameters())
    held: list = []

    class Float32Masters(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            held[:] = [p.data for p in params]

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            for p, master in zip(params, held):
                if p.dtype != master.dtype:
                    grad, p.data = p.grad, master
                    p.grad = None if grad is None else grad.to(master.dtype)

    return Float32Masters()


def trl_main(config: str, overrides: list[str], model: str, steps: int, seed: int, setting: str, out: str) -> None:
    """One TRL run of `steps` steps from `model`; writes its wall time and reward curve to `out`."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from flashq.config import load_config
    from flashq.data import chat_messages, make_task_source
    from flashq.rewards import load_reward_fn

    torch.set_num_threads(2)
    cfg = load_config(config, [*overrides, f"task.seed={seed}"])
    per_step, group = cfg.trainer.batch_groups, cfg.sampling.group_size
    source = make_task_source(cfg.task)
    tasks = [source.task(k) for k in range(steps * per_step)]
    data = Dataset.from_list([{"prompt": chat_messages(t, cfg.task.system_prompt), "task": json.dumps(t)} for t in tasks])
    score = load_reward_fn(cfg.reward.function)

    def reward(completions, task, **_):
        return [float(score(json.loads(t), c[0]["content"])) for c, t in zip(completions, task)]

    reward.__name__ = cfg.reward.function.rpartition(":")[2]
    curve: list[tuple[float, float]] = []
    t0 = time.time()

    class Clock(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                curve.append((time.time() - t0, float(logs["reward"])))

    # Every shared setting from flashq's config. Weight decay follows transformers' own rule: it
    # leaves biases and norm weights undecayed (flashq runs trainer.weight_decay_scope=matrices).
    config_args = dict(
        output_dir=str(Path(out).parent / "trl-out"), seed=seed, use_cpu=True, report_to="none",
        save_strategy="no", logging_steps=1, max_steps=steps, shuffle_dataset=False,
        per_device_train_batch_size=per_step * group, gradient_accumulation_steps=1, num_generations=group,
        max_completion_length=cfg.sampling.max_tokens, temperature=cfg.sampling.temperature, top_k=0, top_p=1.0, beta=0.0,
        epsilon=cfg.trainer.loss.clip_eps_low, learning_rate=cfg.trainer.lr, **trl_schedule(cfg.trainer),
        weight_decay=cfg.trainer.weight_decay, max_grad_norm=cfg.trainer.grad_clip,
        loss_type="dapo", scale_rewards="group", dataloader_num_workers=0, **precision(cfg.trainer),
    )
    config_args.update(SETTINGS[setting])
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**config_args), train_dataset=data, callbacks=[Clock()])
    if config_args.get("use_transformers_paged") and config_args.get("bf16"):
        trainer.add_callback(float32_masters(trainer.model))
    generating: list[float] = []  # seconds each step spent generating and scoring its completions (timed, not changed)
    generate = trainer._generate_and_score_completions

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return generate(*args, **kwargs)
        finally:
            generating.append(time.perf_counter() - started)

    trainer._generate_and_score_completions = timed
    trainer.train()
    Path(out).write_text(json.dumps({"wall_s": time.time() - t0, "curve": curve, "setting": setting, "generate_s": generating}))
