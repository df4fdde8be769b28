"""Offline replay of recorded rollouts: how many tokens per target forward could drafts give?

Records real rollouts first: the calculator environment's first turn (a tool call of about 80
tokens) sampled at temperature 1 by the tiny model after SFT (`flashq sft` on
configs/agentic_calculator.yaml, built here if missing), n = 8 responses per prompt, the same
prompts in two epochs. Then decodes them again with drafts (`flashq.drafting.replay`), siblings
in lock step and each sibling's tokens revealed only as they are generated, side by side:
- no drafts;
- own: drafts from the request's own prompt and output only (prompt lookup, the part of
  SuffixDecoding that needs no shared state);
- grouped: plus the sibling responses of the same prompt (Seer);
- grouped + history: plus the prompt's responses in the previous epoch (RhymeRL), epoch 2.
Accepting a draft token while it equals the token the target sampled there is exactly
speculative sampling's acceptance for point-mass drafts, so replaying real samples is unbiased.

    python bench/specdec_replay.py            # writes bench/results/specdec_replay.json
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import print_table, write_result  # noqa: E402
from flashq.config import load_config  # noqa: E402
from flashq.drafting import GroupedDrafter, replay  # noqa: E402
from flashq.envs.calculator import CalculatorMathEnv  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"


class OwnOnly(GroupedDrafter):
    """Drafts from the request's own prompt and output only: every request is a group of one."""

    def start(self, request_id: str, group_id: str, prompt_ids) -> None:
        super().start(request_id, request_id, prompt_ids)

    def finish(self, request_id: str) -> None:
        super().finish(request_id)
        self.groups.pop(request_id, None)
        self.finished.pop(request_id, None)

    def finish_group(self, group_id: str) -> None:
        pass


class NoHistory(GroupedDrafter):
    def finish_group(self, group_id: str) -> None:
        self.groups.pop(group_id, None)
        self.finished.pop(group_id, None)


def record(model_dir: Path, prompts: int, n: int, seed: int) -> list[tuple[list[int], list[list[int]]]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    env, eos = CalculatorMathEnv(max_value=9), tok.convert_tokens_to_ids("<|im_end|>")
    groups = []
    for p in range(prompts):
        text = tok.apply_chat_template(env.reset({}, 10_000 + p), add_generation_prompt=True, tokenize=False)
        ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            out = model.generate(ids.repeat(n, 1), do_sample=True, temperature=1.0, top_k=0, max_new_tokens=96,
                                 eos_token_id=eos, pad_token_id=tok.pad_token_id)
        responses = []
        for row in out[:, ids.shape[1]:].tolist():
            responses.append(row[: row.index(eos) + 1] if eos in row else row)
        groups.append((ids[0].tolist(), responses))
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-draft", type=int, default=8)
    ap.add_argument("--sft", type=Path, default=None, help="an SFT checkpoint (default: build one from the config)")
    args = ap.parse_args()
    model_dir = args.sft
    if model_dir is None:
        from flashq.sft import output_dir

        model_dir = output_dir(load_config(CONFIG))
        if not (model_dir / "flashq_sft.json").exists():
            subprocess.run([sys.executable, "-m", "flashq.cli", "sft", str(CONFIG)], cwd=ROOT, check=True)
    epochs = [record(model_dir, args.prompts, 8, seed) for seed in (0, 1)]
    rows = []
    for name, make in (("no drafts", None), ("own", OwnOnly), ("grouped", NoHistory), ("grouped + history", GroupedDrafter)):
        drafter = (make or GroupedDrafter)()
        t0 = time.perf_counter()
        first = replay(drafter, epochs[0], args.max_draft if make else 0)
        second = replay(drafter, epochs[1], args.max_draft if make else 0)
        seconds = time.perf_counter() - t0
        rows.append({"drafts": name, "epoch1_tokens_per_forward": first["tokens_per_forward"],
                     "epoch2_tokens_per_forward": second["tokens_per_forward"],
                     "epoch2_mean_acceptance_length": second["mean_acceptance_length"],
                     "drafted_share": second["drafted_share"], "drafting_us_per_token": 1e6 * seconds / (first["tokens"] + second["tokens"])})
    print_table("offline replay of recorded rollouts (calculator tool calls, n=8, T=1, two epochs)", rows,
                [("drafts", "drafts", ""), ("epoch1_tokens_per_forward", "epoch 1 tok/fwd", ".2f"),
                 ("epoch2_tokens_per_forward", "epoch 2 tok/fwd", ".2f"), ("epoch2_mean_acceptance_length", "epoch 2 acc. len", ".2f"),
                 ("drafted_share", "steps drafted", ".0%"), ("drafting_us_per_token", "Python us/token", ".0f")])
    figures = {"replay_grouped_history_tokens_per_forward": rows[3]["epoch2_tokens_per_forward"],
               "replay_grouped_vs_own_tokens_per_forward": rows[2]["epoch1_tokens_per_forward"] / rows[1]["epoch1_tokens_per_forward"],
               "replay_grouped_mean_acceptance_length": rows[3]["epoch2_mean_acceptance_length"]}
    path = write_result("specdec_replay", {"rows": rows, "prompts": args.prompts, "n": 8, "max_draft": args.max_draft}, figures,
                        notes="Offline replay only (no engine): tokens per target forward if every draft were verified "
                              "in one forward; mean acceptance length over forwards that had a draft, bonus token included.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
