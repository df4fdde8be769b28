"""Closes a hub mid-send, over and over, in its own process (a libzmq abort would end pytest's):
`python close_mid_send.py ROUNDS` sends 20,000-token samples from a hub to a link that never
reads until its queue is full, then closes both ends at once, and prints the rounds done. While
a flashq message was several ZeroMQ frames, libzmq 4.3.5 aborted this process within ~100 rounds
(test_transport.py's test of it; codec's docstring says why)."""

import asyncio
import sys

import numpy as np

from flashq.wire.protocol import Heartbeat, Sample
from flashq.wire.transport import Hub, Link, PeerLost


def sample(i: int, n: int = 20_000) -> Sample:
    return Sample(f"g/{i}", "g", 0, np.full(n, i, np.int32), np.zeros(n, np.float32), np.zeros(n, np.int32), "stop")


async def hub_to_deaf_link() -> None:
    hub = Hub("tcp://127.0.0.1:*", hwm=4)
    link = Link(hub.address, "deaf", hwm=4)
    await link.send(Heartbeat(0.0))
    await hub.recv()
    try:
        for i in range(100_000):
            await hub.send("deaf", sample(i))
    except PeerLost:
        pass
    hub.close()
    link.close()


if __name__ == "__main__":
    rounds = int(sys.argv[1])
    for _ in range(rounds):
        asyncio.run(hub_to_deaf_link())
    print(f"{rounds} rounds")
