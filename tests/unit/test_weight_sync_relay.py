"""The coordinator's weight-sync books: one trainer call, one reply after every worker answered."""

import pytest

from flashq.roles.weight_sync_relay import WeightSyncRelay
from flashq.wire.protocol import WeightSyncCall, WeightSyncReply


def push(call_id: int = 7) -> WeightSyncCall:
    return WeightSyncCall(call_id=call_id, method="push_weights", payload={}, version=3)


def test_the_trainer_is_answered_once_every_worker_replied():
    relay = WeightSyncRelay()
    assert relay.open(push(), ["rollout-0", "rollout-1"]) is None
    assert relay.reply("rollout-1", WeightSyncReply(7, ok=True)) is None
    sync = relay.reply("rollout-0", WeightSyncReply(7, ok=True))
    assert sync is not None and sync.ok and sync.recipients == {"rollout-0", "rollout-1"}
    answer = sync.answer()
    assert (answer.call_id, answer.ok, answer.error) == (7, True, "")
    assert relay.pending == {}


def test_no_recipients_finishes_at_once():
    relay = WeightSyncRelay()
    sync = relay.open(push(), [])
    assert sync is not None and sync.ok and relay.pending == {}


def test_errors_and_lost_workers_fail_the_sync_and_are_named():
    relay = WeightSyncRelay()
    relay.open(push(), ["rollout-0", "rollout-1", "rollout-2"])
    assert relay.reply("rollout-0", WeightSyncReply(7, ok=False, error="rollout-0: RuntimeError: nccl")) is None
    assert relay.lose("rollout-1") == []  # rollout-2 is still awaited
    assert relay.lose("rollout-9") == []  # a worker no sync waits on
    sync = relay.reply("rollout-2", WeightSyncReply(7, ok=True))
    assert sync is not None and not sync.ok
    assert sync.answer().error == "rollout-0: RuntimeError: nccl; rollout-1 lost during push_weights"


def test_losing_the_last_awaited_worker_finishes_every_sync_it_held():
    relay = WeightSyncRelay()
    relay.open(push(1), ["rollout-0"])
    relay.open(push(2), ["rollout-0", "rollout-1"])
    finished = relay.lose("rollout-0")
    assert [s.call.call_id for s in finished] == [1]
    assert list(relay.pending) == [2]


def test_wrong_replies_and_calls_are_refused():
    relay = WeightSyncRelay()
    relay.open(push(), ["rollout-0", "rollout-1"])
    with pytest.raises(KeyError, match="matches no pending call"):
        relay.reply("rollout-5", WeightSyncReply(7, ok=True))  # not a recipient
    with pytest.raises(KeyError, match="matches no pending call"):
        relay.reply("rollout-0", WeightSyncReply(8, ok=True))  # no such call
    relay.reply("rollout-0", WeightSyncReply(7, ok=True))
    with pytest.raises(KeyError, match="matches no pending call"):
        relay.reply("rollout-0", WeightSyncReply(7, ok=True))  # replied twice
    with pytest.raises(ValueError, match="already in flight"):
        relay.open(push(), ["rollout-0"])
    assert relay.pending[7].waiting == {"rollout-1"}  # the refused call left the books as they were
