"""Send a request's sampled-token logprobs once, when it finishes, not with every step's tokens.

flashq asks vLLM for the sampled token's logprob on every request (the trainer's off-policy
corrections need it) and reads each request's output once, at its end (`FINAL_ONLY`). vLLM's
engine core still sends every step's logprobs to the front end: three small numpy arrays per
request per step, each a msgpack extension the front end decodes into an array of its own. For a
256-request step that decoding took 1.03 ms against 0.045 ms without logprobs, and it was a
quarter of the agent rollout worker's busy thread (docs/benchmarks/openai_agent.md).

Here the engine core's scheduler keeps each such request's per-step logprobs (views of the step's
arrays) and attaches them, joined, to the output that finishes the request: three arrays per
request instead of three per step, and the front end's per-request state receives the same
positions in the same order (as it does when speculative decoding emits several tokens at once).

Only requests whose output nobody reads before the end are held back: `FINAL_ONLY`, and no stop
strings (those are matched in the front end, which can end a request the engine core still
runs). A request aborted in the engine core drops what was held for it. Imported only in the
engine core's process, where vLLM is loaded already.
"""

import numpy as np
from vllm.sampling_params import RequestOutputKind
from vllm.v1.outputs import LogprobsLists


def install() -> None:
    """Wrap vLLM's `Scheduler.update_from_output` and `finish_requests` (once per process)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    if getattr(Scheduler, "flashq_final_logprobs", False):
        return
    step_outputs, finish = Scheduler.update_from_output, Scheduler.finish_requests

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = step_outputs(self, scheduler_output, model_runner_output)
        hold_until_finished(self, outputs)
        return outputs

    def finish_requests(self, request_ids, finished_status):
        finished = finish(self, request_ids, finished_status)
        held = getattr(self, "flashq_held_logprobs", None)
        if held:
            for request in finished:
                held.pop(request.request_id, None)
        return finished

    Scheduler.update_from_output, Scheduler.finish_requests = update_from_output, finish_requests
    Scheduler.flashq_final_logprobs = True


def read_only_at_the_end(sampling_params) -> bool:
    """True when the front end reads the request's output once, as it finishes."""
    return (sampling_params is not None and sampling_params.output_kind == RequestOutputKind.FINAL_ONLY
            and not sampling_params.stop)


def hold_until_finished(scheduler, outputs: dict) -> None:
    """Take the step's logprobs off the outputs of unfinished requests that are read only at
    the end, and give each finishing request everything held for it."""
    held: dict[str, list] = scheduler.__dict__.setdefault("flashq_held_logprobs", {})
    for engine_outputs in outputs.values():
        for out in engine_outputs.outputs:
            logprobs = out.new_logprobs
            if out.finish_reason is not None:
                parts = held.pop(out.request_id, None)
                if parts is not None:
                    if logprobs is not None:
                        parts.append(logprobs)
                    out.new_logprobs = joined(parts)
            elif logprobs is not None:
                parts = held.get(out.request_id)
                if parts is None:
                    request = scheduler.requests.get(out.request_id)
                    if request is None or not read_only_at_the_end(request.sampling_params):
                        continue
                    parts = held[out.request_id] = []
                parts.append(logprobs)
                out.new_logprobs = None
    if len(held) > len(scheduler.requests):  # a request that ended without an output for it: nothing will read its logprobs
        for request_id in [r for r in held if r not in scheduler.requests]:
            del held[request_id]


def joined(parts: list):
    """One `LogprobsLists` holding every position of `parts`, in order."""
    if len(parts) == 1:
        return parts[0]
    return LogprobsLists(np.concatenate([p.logprob_token_ids for p in parts]),
                         np.concatenate([p.logprobs for p in parts]),
                         np.concatenate([p.sampled_token_ranks for p in parts]), None)
