"""How a checkpoint's calculator episodes end: a diagnostic for the agentic examples, not a benchmark.

Plays `--episodes` episodes of the calculator environment (configs/agentic_calculator.yaml's
task, sampling and limits) with one checkpoint on a vLLM engine, turn by turn as flashq's
episodes are played (the same chat rendering and splicing, `flashq.episode.ChatRenderer`), and
counts how each ended: right or wrong, with or without a tool call, or out of turns. Prints the
counts and a few wrong episodes; writes nothing. Used to see where RL on the calculator stops
gaining (docs/benchmarks/agentic.md).

    python bench/calculator_outcomes.py runs/agentic-calculator-*/checkpoints/step-000100/trainer
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flashq.config import load_config  # noqa: E402
from flashq.envs.calculator import CalculatorMathEnv  # noqa: E402
from flashq.episode import ChatRenderer  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"


def play(model_dir: Path, episodes: int, first_seed: int) -> tuple[collections.Counter, list]:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    cfg = load_config(CONFIG)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    llm = LLM(str(model_dir), max_model_len=cfg.rollout.max_model_len, enforce_eager=True, dtype="float32",
              kv_cache_memory_bytes=1 << 30)
    params = SamplingParams(temperature=cfg.sampling.temperature, max_tokens=cfg.sampling.max_tokens)
    envs = [CalculatorMathEnv(**cfg.env.kwargs) for _ in range(episodes)]
    renderer = ChatRenderer(tok, envs[0].tools())
    messages = [env.reset({}, first_seed + i) for i, env in enumerate(envs)]
    context = [renderer.prompt(m) for m in messages]
    outcome: list[str | None] = [None] * episodes
    for turn in range(cfg.env.max_turns):
        live = [i for i in range(episodes) if outcome[i] is None]
        if not live:
            break
        replies = llm.generate([{"prompt_token_ids": context[i]} for i in live], params, use_tqdm=False)
        for i, reply in zip(live, replies):
            sampled = np.asarray(reply.outputs[0].token_ids, np.int32)
            messages[i].append({"role": "assistant", "content": renderer.assistant_content(sampled)})
            result = asyncio.run(envs[i].step(messages[i][-1]))
            if result.terminated:
                tool = "after a tool call" if turn else "without the tool"
                outcome[i] = f"{'right' if result.reward == 1 else 'wrong'} {tool}"
                continue
            if result.truncated:
                outcome[i] = "out of turns"
                continue
            context[i] = [*context[i], *sampled.tolist(), *renderer.continuation(messages[i], sampled, result.messages)]
            messages[i] += result.messages
    wrong = [m for o, m in zip(outcome, messages) if o and o.startswith("wrong")]
    return collections.Counter(outcome), wrong


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path, help="a checkpoint's model folder (e.g. .../checkpoints/step-000100/trainer) or an SFT output")
    ap.add_argument("--episodes", type=int, default=512)
    ap.add_argument("--first-seed", type=int, default=10_000, help="episode seeds from here on")
    ap.add_argument("--show", type=int, default=8, help="wrong episodes to print")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    counts, wrong = play(args.model, args.episodes, args.first_seed)
    print(f"\n{args.model}: {args.episodes} episodes")
    for outcome, n in counts.most_common():
        print(f"  {outcome:<24} {n:5d}  {n / args.episodes:6.1%}")
    for conversation in wrong[: args.show]:
        print("  wrong:", " | ".join(str(m.get("content")) for m in conversation))


if __name__ == "__main__":
    main()
