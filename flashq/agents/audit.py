"""Check a run's agent episodes token for token (with `log.token_audit`): what each engine
sampled (sampled-<worker>.jsonl, one line per completion) against what the trainer trained
(trained.jsonl, each request's trained ids)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from flashq.jsonl import read_records


def audit_tokens(run_dir: Path) -> dict[str, int]:
    """A trained episode's completions, in call order, against its trained tokens: positions
    whose id differs, plus any difference in count (`retokenized_tokens`), over every token."""
    sampled: dict[str, list[tuple[tuple[int, ...], list[int]]]] = defaultdict(list)
    for path in Path(run_dir).glob("sampled-*.jsonl"):
        for rec in read_records(path):
            episode, call = rec["request_id"].split("@")
            sampled[episode].append((tuple(int(x) for x in call.split(".")), rec["ids"]))
    checked = differing = episodes = 0
    for rec in read_records(Path(run_dir) / "trained.jsonl"):
        for rid, _vmin, _vmax, _n, trained in rec["requests"]:
            engine = [t for _, ids in sorted(sampled.get(rid, [])) for t in ids]
            episodes += 1
            checked += max(len(engine), len(trained))
            differing += sum(a != b for a, b in zip(engine, trained)) + abs(len(engine) - len(trained))
    return {"episodes_checked": episodes, "tokens_checked": checked, "retokenized_tokens": differing}
