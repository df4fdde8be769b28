"""The coordinator's main loop over real ZeroMQ sockets: a real `Coordinator` (orchestrator,
hub, metrics) in this process, with the rollout, reward and trainer roles played by plain
`Link`s that speak the protocol (no engines, no models)."""

import asyncio
import secrets

import numpy as np
import zmq
import zmq.asyncio

from flashq.config import load_config
from flashq.credentials import RunCredentials
from flashq.roles.common import hello
from flashq.roles.coordinator import Coordinator
from flashq.wire.codec import Encoder, pack
from flashq.wire.fuzz import raw_peer
from flashq.wire.protocol import Fatal, GenerateRequest, Heartbeat, Sample, ScoreRequest, WeightSyncCall
from flashq.wire.transport import Link


async def start_coordinator(tiny_model, tmp_path, *overrides: str) -> tuple[Coordinator, asyncio.Task]:
    """A real coordinator of a small run, running in this event loop, once its hub is bound."""
    cfg = load_config(None, [f"model.name={tiny_model}", f"model.cache_dir={tmp_path / 'cache'}", "sampling.group_size=4",
                             "trainer.batch_groups=2", "trainer.steps=2", *overrides])
    coord = Coordinator(cfg, "tcp://127.0.0.1:*", tmp_path / "run")
    run = asyncio.create_task(coord.run())
    while not hasattr(coord, "hub"):  # bound once run() has made it
        await asyncio.sleep(0.01)
    return coord, run


def role_links(coord: Coordinator, tmp_path, roles=("rollout-0", "reward-0", "trainer")) -> dict[str, Link]:
    """A link per role, each with its own credential, as the launcher gives it."""
    credentials = RunCredentials.load(tmp_path / "run")
    return {role: Link(coord.hub.address, role, token=credentials.token(role)) for role in roles}


def stranger(address: str, name: str, token: str | None = None) -> tuple[zmq.asyncio.Socket, asyncio.Task]:
    """A connection under `name` with `token` (None: no credential), watched from before it
    connects, with a `Fatal` queued as it connects; and a task that ends when its handshake fails."""
    from zmq.utils.monitor import recv_monitor_message

    sock = raw_peer(address, f"{name}#{secrets.token_hex(4)}", user=None if token is None else name, token=token, connect=False)
    monitor = sock.get_monitor_socket()
    sock.connect(address)
    sock.send_multipart(Encoder().encode(Fatal(role="trainer", reason="stop the run")), flags=zmq.NOBLOCK)
    failures = (zmq.EVENT_HANDSHAKE_FAILED_AUTH, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)

    async def refused() -> None:
        try:
            while (await recv_monitor_message(monitor))["event"] not in failures:
                pass
        finally:
            sock.disable_monitor()
            monitor.close(linger=0)

    return sock, asyncio.create_task(refused())


def test_answers_arriving_together_leave_for_the_reward_worker_as_one_message(tiny_model, tmp_path):
    """A rollout worker's answers travel as one bundle; the coordinator handles all of them
    before it pumps, so the score requests they release reach the reward worker as one ZeroMQ
    message, not one per answer (each message costs a send and a wake-up on a busy core)."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        links = role_links(coord, tmp_path)
        score_messages = []  # per ZeroMQ message the reward worker receives: the score requests in it
        real_recv = links["reward-0"].sock.recv_multipart

        async def recv(*args, **kwargs):
            frames = await real_recv(*args, **kwargs)
            score_messages.append(sum(isinstance(m, ScoreRequest) for m in links["reward-0"].codec.decode_all("c", frames)))
            return frames

        links["reward-0"].sock.recv_multipart = recv
        await say_hello(links, tmp_path / "run")
        rollout = links["rollout-0"]
        requests = []
        while not requests:
            msg = await rollout.recv()
            if isinstance(msg, GenerateRequest):
                requests = [msg, *(m for m in rollout.inbox if isinstance(m, GenerateRequest))]
        assert len(requests) >= 4
        tokens = np.arange(3, dtype=np.int32)
        await asyncio.gather(*(rollout.send(Sample(r.request_id, r.group_id, 0, tokens, np.zeros(3, np.float32),
                                                   np.zeros(3, np.int32), "stop", text="3")) for r in requests))
        scored = 0
        while scored < len(requests):
            msg = await links["reward-0"].recv()
            scored += isinstance(msg, ScoreRequest)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for link in links.values():
            link.close()
        return len(requests), [n for n in score_messages if n]

    answered, score_messages = asyncio.run(asyncio.wait_for(main(), 60))
    assert score_messages == [answered]


async def say_hello(links: dict[str, Link], run_dir) -> None:
    """Each role's hello with its credential, as the launcher gives it."""
    credentials = RunCredentials.ensure(run_dir)
    for role, link in links.items():
        kw = {"engine_ranks": 1} if role.startswith("rollout") else {}
        await link.send(hello(role, token=credentials.token(role), **kw))


def test_peers_without_a_role_s_token_never_get_a_frame_in(tiny_model, tmp_path):
    """Identities are the peer's choice, but a connection is taken only with a role's token at
    its handshake: strangers with no credential, a made-up one, or another name's, at start-up or
    later, never get a message to the coordinator: no `Fatal` of theirs ends the run, nothing of
    theirs is counted in the books; the authenticator counts the wrong tokens."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        address, trainer_token = coord.hub.address, RunCredentials.load(tmp_path / "run").token("trainer")
        early = [stranger(address, "intruder"), stranger(address, "trainer", "0" * 32), stranger(address, "rollout-0", trainer_token)]
        links = role_links(coord, tmp_path)
        await say_hello(links, tmp_path / "run")
        while not coord.alive:
            await asyncio.sleep(0.01)
        later = [stranger(address, f"x{i}-{i}", trainer_token) for i in range(20)]
        await asyncio.gather(*(refused for _, refused in early + later))
        await links["trainer"].send(Heartbeat(0.0))
        assert not run.done() and not coord.orch.done
        books = dict(coord.hub.rejected), dict(coord.orch.ledger.rejected), set(coord.told_to_restart), set(coord.hub.routes)
        refused = coord.hub.handshakes_refused
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for link in links.values():
            link.close()
        for sock, _ in early + later:
            sock.close(linger=0)
        return books, refused

    books, refused = asyncio.run(asyncio.wait_for(main(), 60))
    assert books == ({}, {}, set(), {"rollout-0", "reward-0", "trainer"})
    assert refused >= 22  # the made-up and the borrowed credentials; "intruder" fails on the mechanism, before the authenticator


def test_no_role_can_take_another_role_s_name(tiny_model, tmp_path):
    """A peer holding reward-0's credential passes the handshake as reward-0 and then speaks as the
    trainer and a rollout worker; another speaks as reward-0 with a hostile token; a second trainer
    holds the trainer's own; a connection that proved reward-0 at its handshake says hello with the
    rollout worker's own token. Their `Fatal`s, hellos and weight-sync calls are refused and the run
    goes on, messages for the names still reach the roles that proved them, and a restarted
    reward-0 with its credential takes its name over (a reward worker may restart; the trainer
    may not)."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        links = role_links(coord, tmp_path)
        await say_hello(links, tmp_path / "run")
        while not coord.alive:
            await asyncio.sleep(0.01)
        credentials = RunCredentials.load(tmp_path / "run")
        stolen = credentials.token("reward-0")
        impostors = {name: as_another(coord.hub.address, name, "reward-0", stolen) for name in ("trainer", "rollout-0", "reward-0")}
        for name, sock in impostors.items():
            await send(sock, hello(name, token=stolen if name != "reward-0" else "é" * 32, engine_ranks=1))
            await send(sock, Fatal(role=name, reason="stop the run"))
            await send(sock, WeightSyncCall(call_id=7, method="init_weight_transfer_engine", payload={"master_address": "evil"}))
        second_trainer = Link(coord.hub.address, "trainer", token=credentials.token("trainer"))  # it cannot restart
        await second_trainer.send(hello("trainer", token=credentials.token("trainer")))
        await second_trainer.send(Fatal(role="trainer", reason="stop the run"))
        crossed = as_another(coord.hub.address, "rollout-0", "reward-0", stolen)  # its handshake proved reward-0
        await send(crossed, hello("rollout-0", token=credentials.token("rollout-0"), engine_ranks=1))
        while sum(coord.hub.rejected.values()) < 12:
            await asyncio.sleep(0.01)
        routes_after_attack = {name: coord.hub.routes[name] for name in links}
        genuine = {name: bytes(link.sock.getsockopt(zmq.IDENTITY)) for name, link in links.items()}
        restarted = Link(coord.hub.address, "reward-0", token=stolen)
        await restarted.send(hello("reward-0", token=stolen))
        while coord.hub.routes["reward-0"] == genuine["reward-0"]:
            await asyncio.sleep(0.01)
        assert not run.done() and not coord.orch.done
        rejected = dict(coord.hub.rejected)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for link in [*links.values(), restarted, second_trainer]:
            link.close()
        for sock in [*impostors.values(), crossed]:
            sock.close(linger=0)
        return rejected, routes_after_attack, genuine

    rejected, routes, genuine = asyncio.run(asyncio.wait_for(main(), 60))
    assert routes == genuine  # every name still routed to the connection that proved it
    assert rejected == {"hello with a wrong credential": 3, "hello on a connection whose handshake proved another name": 1,
                        "from a connection that has not proven its name": 7, "a second connection proving a name that cannot restart": 1}


def as_another(address: str, name: str, user: str, token: str) -> zmq.asyncio.Socket:
    """A connection named `name` whose handshake proves `user` (with `user`'s token)."""
    return raw_peer(address, f"{name}#{secrets.token_hex(4)}", user=user, token=token)


async def send(sock: zmq.asyncio.Socket, msg) -> None:
    await sock.send(pack([Encoder().encode(msg)]))


def test_a_role_with_a_wrong_token_is_told_so_at_its_handshake(tiny_model, tmp_path):
    """A refused connection is never tried again, and a send on it would wait for ever: the role
    learns at once why it cannot join."""
    import pytest

    from flashq.wire.transport import PeerLost

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        wrong = Link(coord.hub.address, "trainer", token="0" * 32)
        none = Link(coord.hub.address, "reward-0")
        right = role_links(coord, tmp_path, ["rollout-0"])["rollout-0"]
        try:
            with pytest.raises(PeerLost, match="refused this connection at its handshake: not this name's token"):
                await wrong.handshake(30)
            with pytest.raises(PeerLost, match="refused this connection at its handshake: no credential"):
                await none.handshake(30)
            await right.handshake(30)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            for link in (wrong, none, right):
                link.close()

    asyncio.run(asyncio.wait_for(main(), 60))


def test_with_authentication_turned_off_a_role_without_a_token_is_heard(tiny_model, tmp_path):
    """`transport.authenticate: false`, the explicit opt-out: the hub takes connections with no
    credential and hears each under the name it claims (a tool that cannot carry a token)."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path, "transport.authenticate=false")
        links = {role: Link(coord.hub.address, role) for role in ("rollout-0", "reward-0", "trainer")}
        try:
            for role, link in links.items():
                await link.handshake(30)
                await link.send(hello(role, token="", **({"engine_ranks": 1} if role.startswith("rollout") else {})))
            while not coord.alive:
                await asyncio.sleep(0.01)
            return set(coord.alive), dict(coord.hub.rejected)
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            for link in links.values():
                link.close()

    alive, rejected = asyncio.run(asyncio.wait_for(main(), 60))
    assert alive == {"rollout-0", "reward-0", "trainer"} and rejected == {}
