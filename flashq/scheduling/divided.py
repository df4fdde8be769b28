"""Divided rollout (Seer): a long response is generated in chunks of `rollout.chunk_tokens`, and
between chunks it goes back to the scheduler, so it can move to whichever worker has room and be
re-ordered by what its group has revealed.

A continuation is an ordinary request whose prompt is the original prompt plus the tokens so far
(`generated` says how many); the engine's prefix cache spares most of the re-prefill. The pieces
(tokens, behaviour logprobs, per-token versions) are joined here, so the rest of the system sees
one `Sample` per response, exactly as without division.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from msgspec.structs import replace

from flashq.wire.protocol import GenerateRequest, Sample


@dataclass
class Partial:
    prompt_len: int
    budget: int  # the response's max_tokens
    forced: bool  # benchmark replay: exactly `budget` tokens
    samples: list[Sample]

    @property
    def generated(self) -> int:
        return sum(len(s.token_ids) for s in self.samples)


class DividedRollout:
    def __init__(self, chunk_tokens: int):
        self.chunk = chunk_tokens  # 0: undivided
        self.partial: dict[str, Partial] = {}
        self.chunks_sent = 0

    def first(self, req: GenerateRequest) -> GenerateRequest:
        """The first chunk of a response that `req` asks for in full."""
        if not self.chunk or req.max_tokens <= self.chunk:
            return req
        forced = req.min_tokens == req.max_tokens
        self.partial[req.request_id] = Partial(len(req.prompt_ids), req.max_tokens, forced, [])
        self.chunks_sent += 1
        return replace(req, max_tokens=self.chunk, min_tokens=self.chunk if forced else min(req.min_tokens, self.chunk))

    def on_chunk(self, req: GenerateRequest, sample: Sample) -> Sample | GenerateRequest:
        """The finished response, or the request for its next chunk."""
        part = self.partial.get(sample.request_id)
        if part is None:
            return sample
        part.samples.append(sample)
        done = part.generated
        if sample.finish_reason != "length" or done >= part.budget:
            del self.partial[sample.request_id]
            return _join(part.samples)
        step = min(self.chunk, part.budget - done)
        tokens = np.concatenate([req.prompt_ids[: part.prompt_len], *[s.token_ids for s in part.samples]]).astype(np.int32)
        self.chunks_sent += 1
        return replace(
            req, prompt_ids=tokens, generated=done, max_tokens=step, min_tokens=step if part.forced else 0
        )


def _join(pieces: list[Sample]) -> Sample:
    last = pieces[-1]
    return replace(
        last,
        token_ids=np.concatenate([p.token_ids for p in pieces]).astype(np.int32),
        logprobs=np.concatenate([p.logprobs for p in pieces]).astype(np.float32),
        versions=np.concatenate([p.versions for p in pieces]).astype(np.int32),
        gen_seconds=sum(p.gen_seconds for p in pieces),
    )
