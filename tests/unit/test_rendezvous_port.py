"""The trainer's weight-transfer store listens before its port is announced, so a port picked
free earlier and taken since (CI once lost a run to EADDRINUSE between the two) is replaced by
one the system picks; a port the config names is never changed behind the user's back."""

import socket

import pytest
import torch.distributed as dist

from flashq.engine.gloo_group import host_store


def test_a_taken_port_picked_free_is_replaced_and_a_named_one_refused():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        store = host_store("127.0.0.1", port, 2, 5.0, any_port=True)
        assert store.port not in (0, port)
        with pytest.raises(dist.DistNetworkError, match="EADDRINUSE"):
            host_store("127.0.0.1", port, 2, 5.0, any_port=False)
    finally:
        taken.close()
