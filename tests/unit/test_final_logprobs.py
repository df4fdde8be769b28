"""The engine core holds a request's logprobs until it finishes (flashq/engine/final_logprobs.py).

vLLM's own output structs (EngineCoreOutput(s), LogprobsLists, SamplingParams); the scheduler is
a stand-in holding only the live requests, since `hold_until_finished` reads nothing else of it.
The real engine's path (its logprobs against the trainer's, token for token, with and without
speculative decoding) is tests/integration/test_weight_transfer.py and test_speculation.py."""

from types import SimpleNamespace

import numpy as np
from vllm.sampling_params import RequestOutputKind, SamplingParams
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.outputs import LogprobsLists

from flashq.engine.final_logprobs import hold_until_finished


def step_logprobs(values: list[float], first_token: int) -> LogprobsLists:
    n = len(values)
    return LogprobsLists(np.arange(first_token, first_token + n, dtype=np.int32).reshape(n, 1),
                         np.asarray(values, dtype=np.float32).reshape(n, 1), np.zeros(n, dtype=np.int32), None)


def scheduler_with(**requests: SamplingParams) -> SimpleNamespace:
    return SimpleNamespace(requests={rid: SimpleNamespace(sampling_params=sp) for rid, sp in requests.items()})


def step(scheduler, *outputs: EngineCoreOutput) -> list[EngineCoreOutput]:
    for out in outputs:
        if out.finish_reason is not None:
            scheduler.requests.pop(out.request_id, None)  # vLLM frees a finished request before returning its output
    batch = {0: EngineCoreOutputs(outputs=list(outputs))}
    hold_until_finished(scheduler, batch)
    return batch[0].outputs


def out(rid: str, values: list[float], first_token: int, finished: bool = False) -> EngineCoreOutput:
    return EngineCoreOutput(request_id=rid, new_token_ids=list(range(first_token, first_token + len(values))),
                            new_logprobs=step_logprobs(values, first_token), finish_reason=0 if finished else None)


FINAL = dict(logprobs=0, output_kind=RequestOutputKind.FINAL_ONLY)


def test_a_final_only_request_gets_every_positions_logprobs_in_order_with_its_last_output():
    scheduler = scheduler_with(a=SamplingParams(**FINAL))
    first = step(scheduler, out("a", [-0.1], 10))
    second = step(scheduler, out("a", [-0.2, -0.3], 11))  # two tokens in one step (a draft accepted)
    assert first[0].new_logprobs is None and second[0].new_logprobs is None
    last = step(scheduler, out("a", [-0.4], 13, finished=True))[0].new_logprobs
    np.testing.assert_array_equal(last.logprobs[:, 0], np.float32([-0.1, -0.2, -0.3, -0.4]))
    np.testing.assert_array_equal(last.logprob_token_ids[:, 0], [10, 11, 12, 13])
    assert len(last.sampled_token_ranks) == 4 and scheduler.flashq_held_logprobs == {}


def test_streamed_requests_and_requests_with_stop_strings_get_theirs_every_step():
    scheduler = scheduler_with(streamed=SamplingParams(logprobs=0, output_kind=RequestOutputKind.DELTA),
                               stops=SamplingParams(stop=["</tool>"], **FINAL))
    outputs = step(scheduler, out("streamed", [-0.5], 1), out("stops", [-0.6], 2))
    assert [o.new_logprobs.logprobs[0, 0] for o in outputs] == [np.float32(-0.5), np.float32(-0.6)]
    assert scheduler.flashq_held_logprobs == {}


def test_a_request_that_ends_without_an_output_for_it_leaves_nothing_held():
    scheduler = scheduler_with(a=SamplingParams(**FINAL), b=SamplingParams(**FINAL))
    step(scheduler, out("a", [-0.1], 1), out("b", [-0.2], 2))
    assert set(scheduler.flashq_held_logprobs) == {"a", "b"}
    del scheduler.requests["a"]  # aborted: vLLM's finish_requests (wrapped by install) or any other way out
    step(scheduler, out("b", [-0.3], 3))
    assert set(scheduler.flashq_held_logprobs) == {"b"}
