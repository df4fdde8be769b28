"""Real ZeroMQ sockets on loopback: round trips, garbage rejection, backpressure without loss."""

import asyncio
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.asyncio

from flashq.wire.codec import Encoder
from flashq.wire.fuzz import raw_peer
from flashq.wire.protocol import Heartbeat, Sample
from flashq.wire.transport import Hub, Link, PeerLost

ROOT = Path(__file__).resolve().parents[2]


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


def sample(i, n=1000):
    return Sample(f"g/{i}", "g", 0, np.full(n, i, np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32), "stop")


def rogue_peer(hub):
    """A raw DEALER named "rogue": sends whatever frames a test gives it."""
    return raw_peer(hub.address, "rogue")


def record_arrivals(hub, measure) -> list:
    """measure(frames) of every ZeroMQ message the hub receives from now on."""
    seen, real_recv = [], hub.sock.recv_multipart

    async def recv(*args, **kwargs):
        frames = await real_recv(*args, **kwargs)
        seen.append(measure(frames))
        return frames

    hub.sock.recv_multipart = recv
    return seen


def test_round_trip_both_ways():
    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        link = Link(hub.address, "rollout-0")
        await link.send(sample(1))
        peer, msg = await hub.recv()
        assert peer == "rollout-0" and msg.token_ids[0] == 1
        await hub.send("rollout-0", Heartbeat(2.0))
        assert (await link.recv()).sent_at == 2.0
        with pytest.raises(PeerLost, match="not connected"):
            await hub.send("nobody", Heartbeat(0.0))
        hub.close(), link.close()

    run(main())


def test_garbage_is_counted_and_the_socket_keeps_working():
    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        rogue = rogue_peer(hub)
        for junk in ([b"\x00\x01garbage"], [b"\x92\x01\xc1"], [b""], [b"\x93", b"x", b"y"]):
            await rogue.send_multipart(junk)
        await rogue.send_multipart(Encoder().encode(Heartbeat(1.0)))  # same peer: arrives after the junk
        peer, msg = await hub.recv()
        assert peer == "rogue" and isinstance(msg, Heartbeat)
        assert sum(hub.rejected.values()) == 4
        rogue.close(linger=0), hub.close()

    run(main())


def test_slow_consumer_slows_the_producer_and_loses_nothing():
    """With tiny high-water marks the sender must wait for the receiver instead of dropping."""

    async def main():
        hub = Hub("tcp://127.0.0.1:*", hwm=2)
        link = Link(hub.address, "rollout-0", hwm=2)
        n = 300
        sent = 0

        async def produce():
            nonlocal sent
            for i in range(n):
                await link.send(sample(i, n=20_000))
                sent += 1

        producer = asyncio.create_task(produce())
        await asyncio.sleep(0.3)
        assert sent < n  # blocked by backpressure, not buffered without bound
        got = []
        while len(got) < n:
            _, msg = await hub.recv()
            got.append(int(msg.token_ids[0]))
            await asyncio.sleep(0)
        await producer
        assert got == list(range(n))
        hub.close(), link.close()

    run(main())


def test_a_peer_that_stops_reading_is_lost_and_never_blocks_the_hub():
    """Waiting on a full peer would stop the coordinator serving everyone (and deadlock with a
    peer that waits to send to it): the send fails at once, naming the peer."""

    async def main():
        hub = Hub("tcp://127.0.0.1:*", hwm=4)
        deaf, other = Link(hub.address, "reward-0", hwm=4), Link(hub.address, "reward-1")
        await deaf.send(Heartbeat(0.0)), await other.send(Heartbeat(0.0))
        await hub.recv(), await hub.recv()  # both connected
        with pytest.raises(PeerLost, match="reward-0 is not reading"):
            for i in range(100_000):  # fills the queues and the socket buffers between them
                await hub.send("reward-0", sample(i, n=20_000))
        await hub.send("reward-1", Heartbeat(3.0))  # everyone else is still served
        assert (await other.recv()).sent_at == 3.0
        hub.close(), deaf.close(), other.close()

    run(main())


def test_a_hub_closed_mid_send_to_a_peer_closing_too_does_not_abort_the_process():
    """libzmq 4.3.5 aborts the sending process when a socket closes while part of a multi-part
    message is written and the peer drops the connection (codec's docstring): a role ending a
    run with its peers could die of it. Two thousand rounds of it, in a process of their own
    (an abort ends that process, not pytest's); with multi-frame messages it aborted within ~100."""
    done = subprocess.run([sys.executable, "-m", "tests.unit.close_mid_send", "2000"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert (done.returncode, done.stdout.strip()) == (0, "2000 rounds"), done.stderr[-3000:]


def test_curve_keys_encrypt_and_refuse_peers_without_the_client_key(tmp_path):
    """With transport.curve_keys the hub talks to a link holding the run's keys; a plain socket
    and one with a key of its own are refused at the handshake: not a frame gets through."""
    import zmq.auth

    from flashq.cli import main
    from flashq.wire.protocol import Heartbeat
    from flashq.wire.transport import Hub, Link

    assert main(["keys", str(tmp_path / "keys")]) == 0
    assert main(["keys", str(tmp_path / "keys")]) == 2  # never overwritten
    keys = tmp_path / "keys"
    assert oct((keys / "server.key_secret").stat().st_mode & 0o777) == "0o600"
    zmq.auth.create_certificates(tmp_path, "intruder")

    async def scenario():
        hub = Hub("tcp://127.0.0.1:0", curve_keys=keys)
        friend = Link(hub.address, "rollout-0", curve_keys=keys)
        plain = Link(hub.address, "plain")
        intruder = Link(hub.address, "intruder")
        intruder.sock.curve_serverkey = zmq.auth.load_certificate(keys / "server.key")[0]
        intruder.sock.curve_publickey, intruder.sock.curve_secretkey = zmq.auth.load_certificate(tmp_path / "intruder.key_secret")
        try:
            for link in (plain, intruder):
                await link.send(Heartbeat(1.0))
            await friend.send(Heartbeat(2.0))
            peer, msg = await asyncio.wait_for(hub.recv(), 10)
            assert (peer, msg) == ("rollout-0", Heartbeat(2.0))
            await hub.send("rollout-0", Heartbeat(3.0))
            assert await asyncio.wait_for(friend.recv(), 10) == Heartbeat(3.0)
            with pytest.raises(asyncio.TimeoutError):  # nothing from the other two, ever
                await asyncio.wait_for(hub.recv(), 1.5)
        finally:
            for s in (friend, plain, intruder, hub):
                s.close()

    asyncio.run(scenario())


def test_messages_sent_together_travel_as_one_bundle_and_arrive_in_order():
    """A link's sends in one turn of the event loop (a rollout worker's answers to one engine
    step) and a hub's `send_all` each go as one ZeroMQ message; the receiver gets every message,
    in order, one at a time."""

    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        link = Link(hub.address, "rollout-0")
        await link.send(Heartbeat(0.0))
        await hub.recv()
        raw_counts = record_arrivals(hub, len)
        await asyncio.gather(*(link.send(sample(i, n=10 + i)) for i in range(50)))
        got = [await hub.recv() for _ in range(50)]
        assert [int(m.token_ids[0]) for _, m in got] == list(range(50))
        assert {p for p, _ in got} == {"rollout-0"}
        assert raw_counts == [2]  # one ZeroMQ message for all fifty: the sender's name and one frame

        await hub.send_all("rollout-0", [Heartbeat(float(i)) for i in range(20)])
        assert [(await link.recv()).sent_at for _ in range(20)] == [float(i) for i in range(20)]
        assert not link.inbox
        hub.close(), link.close()

    run(main())


def test_recv_ready_returns_what_is_already_here_and_never_waits():
    """`Hub.recv_ready` gives the rest of a bundle, then messages the socket already holds, in
    order, and None (at once) when nothing is there."""

    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        a, b = Link(hub.address, "rollout-0"), Link(hub.address, "reward-0")
        assert await hub.recv_ready() is None
        await asyncio.gather(*(a.send(sample(i, n=5)) for i in range(3)))
        first = await hub.recv()
        await b.send(Heartbeat(7.0))  # after a's bundle is in: ROUTER takes its peers in turns
        rest = [await hub.recv_ready() for _ in range(2)]
        assert [int(m.token_ids[0]) for _, m in [first, *rest]] == [0, 1, 2]
        while (ready := await hub.recv_ready()) is None:  # b's message may still be on its way
            await asyncio.sleep(0.01)
        assert ready[0] == "reward-0" and ready[1].sent_at == 7.0
        assert await hub.recv_ready() is None and not hub.inbox
        hub.close(), a.close(), b.close()

    run(main())


def test_a_bad_message_inside_a_bundle_costs_only_itself():
    from flashq.wire.codec import BUNDLE_MARK, pack

    def bundle(table: bytes, joined: bytes, length: int | None = None) -> bytes:
        return BUNDLE_MARK + (len(table) if length is None else length).to_bytes(4, "little") + table + joined

    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        rogue = rogue_peer(hub)
        enc = Encoder()
        await rogue.send(pack([enc.encode(Heartbeat(1.0)), [b"\x92\x01\xc1"], enc.encode(Heartbeat(2.0))]))
        one = enc.encode(Heartbeat(9.0))[0]
        await rogue.send(bundle(b"\x92\x91\x01\x91\x05", one + one))  # sizes do not add up
        await rogue.send(bundle(b"\x92\x01\x05", one + one))  # not a list of lists
        await rogue.send(bundle(b"\x91\x91\x01", one, length=1 << 20))  # a table longer than the bundle
        await rogue.send(BUNDLE_MARK)
        await rogue.send_multipart([*enc.encode(Heartbeat(8.0)), one])  # two frames
        await rogue.send_multipart(enc.encode(Heartbeat(3.0)))
        got = [(await hub.recv())[1].sent_at for _ in range(3)]
        assert got == [1.0, 2.0, 3.0]
        assert sum(hub.rejected.values()) == 6
        reasons = " ".join(hub.rejected)
        assert "do not split its" in reasons and "unreadable" in reasons and "table of N bytes in a bundle" in reasons
        assert "too short" in reasons and "a ZeroMQ message of N frames" in reasons
        rogue.close(linger=0), hub.close()

    run(main())


def test_when_a_bundle_cannot_be_sent_every_sender_in_it_hears_why():
    async def main():
        hub = Hub("tcp://127.0.0.1:*")
        link = Link(hub.address, "reward-0")
        link.sock.close(linger=0)
        results = await asyncio.gather(*(link.send(Heartbeat(float(i))) for i in range(3)), return_exceptions=True)
        assert isinstance(results[0], zmq.ZMQError)
        assert all(isinstance(r, PeerLost) and "the send carrying 3 messages failed" in str(r) for r in results[1:])
        hub.close()

    run(main())


def test_bundles_stay_under_the_receivers_message_limit():
    """A bundle joins its messages into one frame, which ZeroMQ refuses past the receiver's
    limit (dropping the peer): bundles close before they would pass it, both ways."""

    async def main():
        limit = 200_000
        hub = Hub("tcp://127.0.0.1:*", max_message_bytes=limit)
        link = Link(hub.address, "rollout-0", max_message_bytes=limit)
        await link.send(Heartbeat(0.0))
        await hub.recv()
        sizes = record_arrivals(hub, lambda frames: [len(f.buffer) for f in frames[1:]])  # after the sender's name
        await asyncio.gather(*(link.send(sample(i, n=10_000)) for i in range(12)))  # ~80 kB each
        got = [int((await hub.recv())[1].token_ids[0]) for _ in range(12)]
        assert got == list(range(12)) and len(sizes) > 1
        assert all(len(frames) == 1 for frames in sizes) and max(n for (n,) in sizes) <= limit  # one frame each, under the limit

        await hub.send_all("rollout-0", [sample(i, n=10_000) for i in range(12)])
        assert [int((await link.recv()).token_ids[0]) for _ in range(12)] == list(range(12))
        hub.close(), link.close()

    run(main())
