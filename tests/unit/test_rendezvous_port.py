"""The trainer's weight-transfer store listens before its port is announced, so a port picked
free earlier and taken since (CI once lost a run to EADDRINUSE between the two) is replaced by
one the system picks; a port the config names is never changed behind the user's back."""

import socket

import pytest

from flashq.engine.gloo_group import close_group, group_on, host_store, open_group


def test_a_taken_port_picked_free_is_replaced_and_a_named_one_refused():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        store = host_store("127.0.0.1", port, 2, 5.0, any_port=True)
        assert store.port not in (0, port)
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            host_store("127.0.0.1", port, 2, 5.0, any_port=False)
    finally:
        taken.close()


def test_the_store_and_the_group_listen_on_the_address_they_are_given_alone():
    """torch's TCPStore listens on every interface whatever host it is given, and gloo on the
    hostname's address: the weight transfer's rendezvous would be open beyond the run's network.
    Both ends of a two-rank group here listen on 127.0.0.1 and nowhere else."""
    import threading

    import psutil

    def listening() -> set[tuple[str, int]]:
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}

    before = listening()  # sockets other tests of this process may have left
    groups = {}
    joined = threading.Thread(target=lambda: groups.setdefault(1, open_group("127.0.0.1", port, 1, 2, 30)))
    store = host_store("127.0.0.1", 0, 2, 30.0, any_port=True)
    port = store.port
    joined.start()
    groups[0] = (group_on(store, 0, 2, 30.0, "127.0.0.1"), store)
    joined.join()
    try:
        opened = listening() - before
        assert len(opened) >= 3 and {ip for ip, _ in opened} == {"127.0.0.1"}, opened  # the store, each rank's gloo
    finally:
        for group, _ in groups.values():
            close_group(group)
