"""The coordinator's main loop over real ZeroMQ sockets: a real `Coordinator` (orchestrator,
hub, metrics) in this process, with the rollout, reward and trainer roles played by plain
`Link`s that speak the protocol (no engines, no models)."""

import asyncio

import numpy as np
import zmq

from flashq.config import load_config
from flashq.credentials import RunCredentials
from flashq.protocol import Fatal, GenerateRequest, Heartbeat, Sample, ScoreRequest, WeightSyncCall
from flashq.roles.common import hello
from flashq.roles.coordinator import Coordinator
from flashq.transport import Link


async def start_coordinator(tiny_model, tmp_path) -> tuple[Coordinator, asyncio.Task]:
    """A real coordinator of a small run, running in this event loop, once its hub is bound."""
    cfg = load_config(None, [f"model.name={tiny_model}", f"model.cache_dir={tmp_path / 'cache'}", "sampling.group_size=4",
                             "trainer.batch_groups=2", "trainer.steps=2"])
    coord = Coordinator(cfg, "tcp://127.0.0.1:*", tmp_path / "run")
    run = asyncio.create_task(coord.run())
    while not hasattr(coord, "hub"):  # bound once run() has made it
        await asyncio.sleep(0.01)
    return coord, run


def test_answers_arriving_together_leave_for_the_reward_worker_as_one_message(tiny_model, tmp_path):
    """A rollout worker's answers travel as one bundle; the coordinator handles all of them
    before it pumps, so the score requests they release reach the reward worker as one ZeroMQ
    message, not one per answer (each message costs a send and a wake-up on a busy core)."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        links = {role: Link(coord.hub.address, role) for role in ("rollout-0", "reward-0", "trainer")}
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


def test_peers_outside_the_run_cannot_stop_it_or_grow_its_books(tiny_model, tmp_path):
    """Identities are the peer's choice: a `Fatal` from a name that is none of the run's roles
    no longer ends the run (at start-up or later), and neither it nor the other messages of a
    hundred made-up names add restart orders or rejection keys per name: without a credential
    they are refused at the hub, under one reason."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        early = Link(coord.hub.address, "intruder")
        await early.send(Fatal(role="trainer", reason="stop the run"))  # during start-up
        links = {role: Link(coord.hub.address, role) for role in ("rollout-0", "reward-0", "trainer")}
        await say_hello(links, tmp_path / "run")
        while not coord.alive:
            await asyncio.sleep(0.01)
        rogues = [Link(coord.hub.address, f"x{i}-{i}") for i in range(100)]
        for i, rogue in enumerate(rogues):
            await rogue.send(Fatal(role="trainer", reason="stop the run"))
            await rogue.send(Heartbeat(float(i)))
        await links["trainer"].send(Heartbeat(0.0))  # after the rogues': handled once they all are
        while sum(coord.hub.rejected.values()) < 201:
            await asyncio.sleep(0.01)
        assert not run.done() and not coord.orch.done and not coord.orch.ledger.rejected
        rejected = dict(coord.hub.rejected)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for link in [early, *links.values(), *rogues]:
            link.close()
        return rejected, set(coord.told_to_restart)

    rejected, told = asyncio.run(asyncio.wait_for(main(), 60))
    assert told == set()
    assert rejected == {"from a connection that has not proven its name": 201}


def test_no_role_can_take_another_role_s_name(tiny_model, tmp_path):
    """A peer holding reward-0's credential (or a hostile one) speaks as the trainer, a rollout worker
    and reward-0's restarted self, and a second trainer holds the trainer's own: their `Fatal`s,
    hellos and weight-sync calls are refused and the run goes on, messages for the names still
    reach the roles that proved them, and a restarted reward-0 with its credential takes its name
    over (a reward worker may restart; the trainer may not)."""

    async def main():
        coord, run = await start_coordinator(tiny_model, tmp_path)
        links = {role: Link(coord.hub.address, role) for role in ("rollout-0", "reward-0", "trainer")}
        await say_hello(links, tmp_path / "run")
        while not coord.alive:
            await asyncio.sleep(0.01)
        credentials = RunCredentials.load(tmp_path / "run")
        stolen = credentials.token("reward-0")
        impostors = {name: Link(coord.hub.address, name) for name in ("trainer", "rollout-0", "reward-0")}
        for name, link in impostors.items():
            await link.send(hello(name, token=stolen if name != "reward-0" else "é" * 32, engine_ranks=1))
            await link.send(Fatal(role=name, reason="stop the run"))
            await link.send(WeightSyncCall(call_id=7, method="init_weight_transfer_engine", payload={"master_address": "evil"}))
        second_trainer = Link(coord.hub.address, "trainer")  # the trainer's own credential, a second time: it cannot restart
        await second_trainer.send(hello("trainer", token=credentials.token("trainer")))
        await second_trainer.send(Fatal(role="trainer", reason="stop the run"))
        while sum(coord.hub.rejected.values()) < 11:
            await asyncio.sleep(0.01)
        routes_after_attack = {name: coord.hub.routes[name] for name in links}
        genuine = {name: bytes(link.sock.getsockopt(zmq.IDENTITY)) for name, link in links.items()}
        restarted = Link(coord.hub.address, "reward-0")
        await restarted.send(hello("reward-0", token=stolen))
        while coord.hub.routes["reward-0"] == genuine["reward-0"]:
            await asyncio.sleep(0.01)
        assert not run.done() and not coord.orch.done
        rejected = dict(coord.hub.rejected)
        run.cancel()
        await asyncio.gather(run, return_exceptions=True)
        for link in [*links.values(), *impostors.values(), restarted, second_trainer]:
            link.close()
        return rejected, routes_after_attack, genuine

    rejected, routes, genuine = asyncio.run(asyncio.wait_for(main(), 60))
    assert routes == genuine  # every name still routed to the connection that proved it
    assert rejected == {"hello with a wrong credential": 3, "from a connection that has not proven its name": 7,
                        "a second connection proving a name that cannot restart": 1}
