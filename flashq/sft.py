"""`flashq sft`: supervised warm start on solved examples of the task.

RL needs a policy that earns some reward: a random model never samples a correct answer, so
its advantages are all zero. This trains the configured model on (prompt, answer) pairs from the
same task source, with a different seed so RL prompts are not the ones it memorised, and the
loss only on the answer tokens. With an environment configured, the examples are conversations
from its `demonstration(task, seed)` method, with the loss on the assistant turns. The result is a Hugging Face checkpoint directory; it is cached
by a fingerprint of everything that shaped it, so repeating a quickstart skips the work.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import time
from pathlib import Path

import numpy as np
import torch

from flashq.config import SFT_STOP_NEEDS_ANSWERS, ConfigError, FlashqConfig
from flashq.data import chat_encoder, chat_messages, training_tasks
from flashq.rewards import load_reward_fn
from flashq.trainer.lr_schedule import lr_factor

log = logging.getLogger("flashq.sft")


def output_dir(cfg: FlashqConfig) -> Path:
    if cfg.sft.output_dir is not None:
        return cfg.sft.output_dir
    sft = cfg.sft.model_dump(mode="json")
    if sft["stop_at_greedy_accuracy"] is None:  # keys made before the stop existed stay valid
        del sft["stop_at_greedy_accuracy"], sft["check_every"]
    else:  # where it stops is judged by the reward on answers this long
        sft["judged_by"] = [cfg.reward.function, cfg.sampling.max_tokens, cfg.task.system_prompt]
    key = json.dumps(
        {"model": cfg.model.model_dump(mode="json"), "task": cfg.task.model_dump(mode="json"), "sft": sft,
         **({"tiny_build": cfg.model.tiny.fingerprint()} if cfg.model.name == "tiny" else {}),  # its tokenizer's version
         **({"env": cfg.env.model_dump(mode="json")} if cfg.env is not None else {}),
         **({"holdout": cfg.eval.holdout} if cfg.eval is not None and cfg.eval.task is None else {})},  # SFT never sees held-out prompts
        sort_keys=True,
    )
    return cfg.model.cache_dir / f"sft-{cfg.name}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def encode_example(tokenizer, messages: list[dict], answer: str) -> tuple[list[int], list[int]]:
    """Token ids of the conversation with the answer, and a 0/1 mask over the answer tokens
    (including the end-of-turn token, so the model learns to stop)."""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}], tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("the chat template does not extend the prompt with the answer; cannot mask the prompt")
    p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full.rstrip("\n"), add_special_tokens=False)["input_ids"]
    return full_ids, [0] * len(p_ids) + [1] * (len(full_ids) - len(p_ids))


def encode_conversation(tokenizer, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a multi-turn conversation rendered turn by turn, and a mask over the
    assistant turns (each with its end-of-turn token)."""
    ids, mask, rendered = [], [], ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        for text, trained in ((tokenizer.apply_chat_template(messages[:i], add_generation_prompt=True, tokenize=False), 0),
                              (tokenizer.apply_chat_template(messages[: i + 1], tokenize=False), 1)):
            if not text.startswith(rendered):
                raise ValueError("the chat template rewrites earlier turns; cannot build a multi-turn example")
            piece = tokenizer(text[len(rendered):], add_special_tokens=False)["input_ids"]
            ids += piece
            mask += [trained] * len(piece)
            rendered = text
    return ids, mask


def env_demonstrations(cfg: FlashqConfig):
    """example(k) -> a demonstration conversation of the configured environment."""
    from flashq.envs.base import load_env_class

    source = cfg.env.demonstrations or cfg.env.name
    if source is None:
        raise ValueError("env.agent: an agent has no demonstrations of its own; set env.demonstrations to an environment class "
                         "of the same task, or sft.warm_start false")
    env = load_env_class(source)(**cfg.env.kwargs)
    if not hasattr(env, "demonstration"):
        raise ValueError(f"{source} has no demonstration(task, seed) method, so `flashq sft` cannot warm-start on it")
    seed0 = (cfg.task.seed + 1_000_003 + cfg.sft.seed) * 1_000_003
    return lambda k: env.demonstration({}, (seed0 + k) % 2**31)


def run_sft(cfg: FlashqConfig) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashq.models.sources import model_path
    from flashq.trainer.learner import pick_device

    out = output_dir(cfg)
    if (out / "flashq_sft.json").exists():
        log.info("SFT checkpoint already built: %s", out)
        return out
    sc = cfg.sft
    base = model_path(cfg.model, fetch=True)  # run on its own, `flashq sft` is what starts the run
    device = pick_device(cfg.trainer.device)
    if device.type == "cpu":
        torch.set_num_threads(sc.threads)
    torch.manual_seed(sc.seed)
    tokenizer = AutoTokenizer.from_pretrained(str(base))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).to(device)
    source = training_tasks(cfg, cfg.task.model_copy(update={"seed": cfg.task.seed + 1_000_003 + sc.seed}))
    demo = env_demonstrations(cfg) if cfg.env is not None else None
    if demo is not None and sc.stop_at_greedy_accuracy is not None:
        raise ConfigError(SFT_STOP_NEEDS_ANSWERS)
    system = cfg.task.system_prompt
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr, weight_decay=0.0)
    # annealed: that is what lets a small model settle on the exact answers; at a constant rate its
    # accuracy swings with chance
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, sc.steps, "cosine", sc.warmup_steps))
    reward_fn = load_reward_fn(cfg.reward.function) if demo is None else None
    stop = StopAtAccuracy(cfg, tokenizer, reward_fn, device) if sc.stop_at_greedy_accuracy is not None else None
    t0 = time.monotonic()
    next_task = 0
    for step in range(1, sc.steps + 1):
        ids, masks = [], []
        for _ in range(sc.batch_size):
            if demo is not None:
                i, m = encode_conversation(tokenizer, demo(next_task))
            else:
                task = source.task(next_task)
                i, m = encode_example(tokenizer, chat_messages(task, system), str(task["answer"]))
            next_task += 1
            ids.append(i)
            masks.append(m)
        loss = _loss(model, ids, masks, device)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % max(1, sc.steps // 10) == 0 or step == 1:
            log.info("sft step %d/%d  loss %.4f", step, sc.steps, loss.item())
        if stop is not None and stop.reached(model, step):
            break
    summary = {"steps": step, "examples": next_task, "seconds": time.monotonic() - t0, "final_loss": loss.item()}
    if stop is not None:
        summary["stop_checks"] = stop.checks  # [step, greedy accuracy] of each check
    if demo is None:  # an environment's reward is measured by playing it, in the RL run
        eval_source = training_tasks(cfg, cfg.task.model_copy(update={"seed": cfg.task.seed + 2_000_003 + sc.seed}))
        summary.update(evaluate(model, tokenizer, eval_source, system, reward_fn, sc.eval_prompts, cfg.sampling.max_tokens, device))
        log.info("sft greedy accuracy %.3f, sampled (T=1) accuracy %.3f", summary["greedy_accuracy"], summary["sampled_accuracy"])
    log.info("sft done in %.0fs", summary["seconds"])
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "flashq_sft.json").write_text(json.dumps(summary, indent=2))
    tmp.rename(out)
    chat_encoder.remember(type(tokenizer).from_pretrained(str(out)), out, cfg.model.cache_dir)  # the RL run's coordinator encodes from it
    return out


class StopAtAccuracy:
    """`sft.stop_at_greedy_accuracy`: every `check_every` steps, greedy accuracy on fresh training
    tasks of a draw of their own (neither SFT's examples nor the summary's evaluation prompts)."""

    def __init__(self, cfg: FlashqConfig, tokenizer, reward_fn, device) -> None:
        sc = cfg.sft
        self.target, self.every = sc.stop_at_greedy_accuracy, sc.check_every
        source = training_tasks(cfg, cfg.task.model_copy(update={"seed": cfg.task.seed + 3_000_003 + sc.seed}))
        self.measure = lambda model: evaluate(model, tokenizer, source, cfg.task.system_prompt, reward_fn, sc.eval_prompts,
                                              cfg.sampling.max_tokens, device, modes=("greedy",))["greedy_accuracy"]
        self.checks: list[list[float]] = []
        if self.every > sc.steps:  # a short try of a config that stops (the quickstart's) still runs, and says so
            log.warning("sft.check_every (%d) is past sft.steps (%d): stop_at_greedy_accuracy is never checked", self.every, sc.steps)

    def reached(self, model, step: int) -> bool:
        if step % self.every:
            return False
        accuracy = self.measure(model)
        self.checks.append([step, accuracy])
        if accuracy >= self.target:
            log.info("sft stops at step %d: greedy accuracy %.3f reached sft.stop_at_greedy_accuracy %.3f", step, accuracy, self.target)
            return True
        return False


def _loss(model, ids: list[list[int]], masks: list[list[int]], device) -> torch.Tensor:
    T = max(len(x) for x in ids)
    x = torch.zeros(len(ids), T, dtype=torch.long)
    m = torch.zeros(len(ids), T, dtype=torch.float32)
    a = torch.zeros(len(ids), T, dtype=torch.long)
    for j, (i, mk) in enumerate(zip(ids, masks)):
        x[j, : len(i)] = torch.tensor(i)
        m[j, : len(mk)] = torch.tensor(mk, dtype=torch.float32)
        a[j, : len(i)] = 1
    x, m, a = x.to(device), m.to(device), a.to(device)
    logits = model(input_ids=x, attention_mask=a).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), x[:, 1:], reduction="none")
    return (nll * m[:, 1:]).sum() / m[:, 1:].sum().clamp(min=1)


@torch.no_grad()
def evaluate(model, tokenizer, source, system, reward_fn, n: int, max_tokens: int, device,
             modes: tuple[str, ...] = ("greedy", "sampled")) -> dict[str, float]:
    """Mean reward on n fresh tasks, greedy and sampled at temperature 1 (here, in the main
    thread, so signal-based reward timeouts work)."""
    score = (lambda t, x: asyncio.run(reward_fn(t, x))) if inspect.iscoroutinefunction(reward_fn) else reward_fn
    was_training = model.training
    model.eval()
    tasks = [source.task(i) for i in range(n)]
    prompts = [tokenizer.apply_chat_template(chat_messages(t, system), add_generation_prompt=True, tokenize=False) for t in tasks]
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    out = {}
    decoding = {"greedy": {"do_sample": False}, "sampled": {"do_sample": True, "temperature": 1.0, "top_k": 0}}
    for name, kwargs in ((m, decoding[m]) for m in modes):
        gen = model.generate(**enc, max_new_tokens=max_tokens, pad_token_id=tokenizer.pad_token_id, **kwargs)
        texts = tokenizer.batch_decode(gen[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        out[f"{name}_accuracy"] = float(np.mean([score(t, x) for t, x in zip(tasks, texts)]))
    model.train(was_training)  # as it was: a check must not change how SFT goes on
    return out
