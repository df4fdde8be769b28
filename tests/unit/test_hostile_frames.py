"""Frames built to crash or grow the coordinator: nesting deep enough to exhaust msgspec's
recursion (about 10 KB of nested arrays), a decoder that runs out of memory or fails in a way
nobody foresaw, and floods of reasons that differ only in a number. Each is counted as a
rejected frame; the hub's receive loop goes on, and its books stay bounded. Real ZeroMQ sockets;
the decoder faults are injected (they cannot be provoked on demand)."""

import asyncio

import msgspec
import pytest
import zmq
import zmq.asyncio

from flashq.roles.coordinator import rejection_kind
from flashq.wire.codec import Decoder, Encoder, RejectedFrame
from flashq.wire.fuzz import raw_peer
from flashq.wire.protocol import MAX_NESTING, SCHEMA_VERSION, Envelope, EpisodeRequest, Heartbeat, WeightSyncCall
from flashq.wire.transport import MAX_REJECT_KEYS, Hub


def nested_payload(depth: int) -> bytes:
    """A push_weights call whose payload is `depth` arrays, each holding the next."""
    frame = msgspec.msgpack.encode(Envelope(SCHEMA_VERSION, WeightSyncCall(call_id=1, method="push_weights", payload=None)))
    return frame.replace(b"\xc0", b"\x91" * depth + b"\xc0", 1)


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_nesting_past_the_decoders_recursion_is_a_rejected_frame(depth):
    with pytest.raises(RejectedFrame, match="nested too deep"):
        Decoder().decode([nested_payload(depth)])


def test_free_form_fields_are_refused_past_max_nesting():
    dec = Decoder()
    assert dec.decode([nested_payload(MAX_NESTING)]).method == "push_weights"
    with pytest.raises(RejectedFrame, match=f"payload is nested more than {MAX_NESTING} levels"):
        dec.decode([nested_payload(MAX_NESTING + 1)])
    task: dict = {"answer": "4"}
    for _ in range(MAX_NESTING):
        task = {"inner": task}
    request = EpisodeRequest(request_id="r", group_id="g", task=task, seed=0, max_tokens=8)
    with pytest.raises(RejectedFrame, match="task is nested"):
        dec.decode(Encoder().encode(request))
    assert dec.decode(Encoder().encode(msgspec.structs.replace(request, task=task["inner"]))).task == task["inner"]


def rogue(hub: Hub) -> zmq.asyncio.Socket:
    return raw_peer(hub.address, "rogue")


def test_the_hub_survives_deep_nesting_and_decoder_faults_and_counts_each():
    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        sock = rogue(hub)
        real = hub.codec.decoder._dec
        faults = iter([MemoryError(), KeyError("nobody foresaw this")])

        class Faulty:
            def decode(self, buf):
                fault = next(faults, None)
                if fault is None:
                    return real.decode(buf)
                raise fault

        for depth in (1_000, 100_000):
            await sock.send_multipart([nested_payload(depth)])
        await sock.send_multipart(Encoder().encode(Heartbeat(1.0)))
        assert (await hub.recv())[1].sent_at == 1.0
        hub.codec.decoder._dec = Faulty()
        for t in (2.0, 3.0, 4.0):
            await sock.send_multipart(Encoder().encode(Heartbeat(t)))
        assert (await hub.recv())[1].sent_at == 4.0  # the first two met the faults
        assert sum(hub.rejected.values()) == 4
        assert hub.rejected == {"nested too deep to decode": 2, "no memory to decode a message of N bytes": 1, "decoder error": 1}
        sock.close(linger=0), hub.close()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_a_flood_of_distinct_reasons_keeps_the_books_bounded():
    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        sock = rogue(hub)
        for version in range(2, 2002):  # a schema version each: one reason, a number apart
            await sock.send_multipart([msgspec.msgpack.encode([version, ["heartbeat", 1.0]])])
        for i in range(200):  # ZeroMQ messages of 2 to 51 frames: reasons differing in their numbers
            await sock.send_multipart([b"\xc1flashq-bundle-2"] + [b"x"] * (i % 50 + 1))
        await sock.send_multipart(Encoder().encode(Heartbeat(5.0)))
        assert (await hub.recv())[1].sent_at == 5.0
        assert sum(hub.rejected.values()) == 2200
        assert len(hub.rejected) <= 3 and "schema version N, this build speaks N" in hub.rejected
        sock.close(linger=0), hub.close()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert MAX_REJECT_KEYS <= 64


def test_rejection_kinds_do_not_grow_with_the_names_peers_choose():
    error = ValueError("unknown weight sync method")
    kinds = {rejection_kind(f"x{i}y-{i}", Heartbeat(0.0), error) for i in range(1000)}
    assert kinds == {"Heartbeat from an unknown peer: unknown weight sync method"}
    assert rejection_kind("reward-3", Heartbeat(0.0), error).startswith("Heartbeat from reward:")


def test_the_hub_remembers_a_bounded_number_of_peers(monkeypatch):
    import flashq.wire.transport as transport

    monkeypatch.setattr(transport, "MAX_PEERS_SEEN", 8)

    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        socks = []
        for i in range(20):
            sock = raw_peer(hub.address, f"made-up-{i}")
            await sock.send_multipart(Encoder().encode(Heartbeat(float(i))))
            assert (await hub.recv())[0] == f"made-up-{i}"
            socks.append(sock)
        seen = list(hub.last_seen)
        for sock in socks:
            sock.close(linger=0)
        hub.close()
        return seen

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [f"made-up-{i}" for i in range(12, 20)]
