"""Offline replay of recorded rollouts: how many tokens per target forward could drafts give?

Records real rollouts first: the calculator environment's first turn (a tool call of about 80
tokens) sampled at temperature 1 by the tiny model after SFT (`flashq sft` on
configs/agentic_calculator.yaml, built here if missing), n = 8 responses per prompt, the same
prompts in two epochs. Then decodes them again with drafts (`flashq.drafting.drafter.replay`), siblings
in lock step and each sibling's tokens revealed only as they are generated, side by side:
- no drafts;
- own: drafts from the request's own prompt and output only (prompt lookup, the part of
  SuffixDecoding that needs no shared state);
- grouped: plus the sibling responses of the same prompt (Seer);
- grouped + other prompts: plus the latest responses to other prompts (SuffixDecoding's global
  tree: what prompts share, such as a tool call's syntax);
- grouped + other prompts + history: plus the prompt's responses in the previous epoch (RhymeRL).
Then where a prompt's requests run when there are two engines (each drafts only from what it served).
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
from flashq.drafting.drafter import GroupedDrafter, replay  # noqa: E402
from flashq.envs.calculator import CalculatorMathEnv  # noqa: E402

CONFIG = ROOT / "configs" / "agentic_calculator.yaml"


class OwnOnly(GroupedDrafter):
    """Drafts from the request's own prompt and output only: every request is a group of one."""

    def __init__(self):
        super().__init__(history_epochs=0, recent_responses=0)

    def start(self, request_id: str, group_id: str, prompt_ids) -> None:
        super().start(request_id, request_id, prompt_ids)

    def finish(self, request_id: str) -> None:
        super().finish(request_id)
        self.finish_group(request_id)


def no_history() -> GroupedDrafter:
    """Siblings only: no earlier epochs of the prompt, no other prompts' responses."""
    return GroupedDrafter(history_epochs=0, recent_responses=0)


def recent_only() -> GroupedDrafter:
    """Siblings and the latest responses to other prompts, no earlier epochs of the prompt."""
    return GroupedDrafter(history_epochs=0)


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


def place(epochs, max_draft: int) -> list[dict]:
    """Each engine drafts only from what it served. Three placements of a prompt's 8 requests over
    2 engines: all on one engine in both epochs (flashq's prompt affinity with grouped drafts);
    siblings alternating between the engines (least-loaded spreading), so each sees half the
    siblings and half the history; all on one engine, but the other one next epoch (group
    affinity without a prompt home), so no history."""
    layouts = {"one engine per prompt (prompt affinity)": lambda e, k: 0,
               "siblings spread over both": lambda e, k: k % 2,
               "prompt on the other engine next epoch": lambda e, k: e}
    rows = []
    for name, engine_of in layouts.items():
        drafters = [GroupedDrafter(), GroupedDrafter()]
        for e, groups in enumerate(epochs):
            totals = {"tokens": 0, "forwards": 0, "drafted_forwards": 0.0, "drafted_tokens": 0.0}
            for w, drafter in enumerate(drafters):
                share = [(prompt, [r for k, r in enumerate(responses) if engine_of(e, k) == w]) for prompt, responses in groups]
                share = [(p, rs) for p, rs in share if rs]
                if not share:
                    continue
                out = replay(drafter, share, max_draft)
                totals["tokens"] += out["tokens"]
                totals["forwards"] += out["forwards"]
                drafted = out["drafted_share"] * out["forwards"]
                totals["drafted_forwards"] += drafted
                totals["drafted_tokens"] += out["mean_acceptance_length"] * drafted
        rows.append({"placement": name, "epoch2_tokens_per_forward": totals["tokens"] / totals["forwards"],
                     "epoch2_mean_acceptance_length": totals["drafted_tokens"] / max(totals["drafted_forwards"], 1.0)})
    return rows


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
    for name, make in (("no drafts", None), ("own", OwnOnly), ("grouped", no_history), ("grouped + other prompts", recent_only),
                       ("grouped + other prompts + history", GroupedDrafter)):
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
    placement = place(epochs, args.max_draft)
    print_table("where a prompt's requests run: 2 rollout engines, epoch 2 (grouped + history)", placement,
                [("placement", "placement", ""), ("epoch2_tokens_per_forward", "epoch 2 tok/fwd", ".2f"),
                 ("epoch2_mean_acceptance_length", "epoch 2 acc. len", ".2f")])
    figures = {"replay_grouped_history_tokens_per_forward": rows[4]["epoch2_tokens_per_forward"],
               "replay_grouped_other_prompts_epoch1_tokens_per_forward": rows[3]["epoch1_tokens_per_forward"],
               "replay_prompt_affinity_vs_spread_tokens_per_forward": placement[0]["epoch2_tokens_per_forward"] / placement[1]["epoch2_tokens_per_forward"],
               "replay_prompt_affinity_vs_moved_tokens_per_forward": placement[0]["epoch2_tokens_per_forward"] / placement[2]["epoch2_tokens_per_forward"],
               "replay_grouped_vs_own_tokens_per_forward": rows[2]["epoch1_tokens_per_forward"] / rows[1]["epoch1_tokens_per_forward"],
               "replay_grouped_mean_acceptance_length": rows[4]["epoch2_mean_acceptance_length"]}
    path = write_result("specdec_replay", {"rows": rows, "placement": placement, "prompts": args.prompts, "n": 8,
                                           "max_draft": args.max_draft}, figures,
                        notes="Offline replay only (no engine): tokens per target forward if every draft were verified "
                              "in one forward; mean acceptance length over forwards that had a draft, bonus token included.")
    print(f"figures: {figures}\nwrote {path}")


if __name__ == "__main__":
    main()
