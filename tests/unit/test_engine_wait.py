"""The CPU backend's napping reader for vLLM's engine-core <-> worker queue (vllm_plugin): it
must still receive every message, in order, however long the writer takes."""

import threading
import time

from flashq.engine.vllm_plugin import nap_while_waiting_for_queue


def test_a_napping_reader_gets_every_message_in_order(monkeypatch):
    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    for name in ("wait", "record_read"):
        monkeypatch.setattr(cls, name, getattr(cls, name))  # undone after the test
    monkeypatch.setattr(cls, "flashq_naps", False, raising=False)
    nap_while_waiting_for_queue()
    nap_while_waiting_for_queue()  # a second install changes nothing
    assert cls.flashq_naps

    writer = shm_broadcast.MessageQueue(1, 1, max_chunk_bytes=1 << 16, max_chunks=4)
    reader = shm_broadcast.MessageQueue.create_from_handle(writer.export_handle(), 0)
    ready = threading.Thread(target=writer.wait_until_ready)
    ready.start()
    reader.wait_until_ready()
    ready.join()

    # bursts, and waits long enough to nap at the cap (all under vLLM's 1 s idle, where it would poll)
    delays = [0.0, 0.0, 0.002, 0.0, 0.03, 0.0005, 0.0, 0.01] * 5

    naps_while_waiting = []

    def write():
        for i, delay in enumerate(delays):
            time.sleep(delay)
            if delay >= 0.01:  # a long wait: the reader's naps grow to the cap (on a busy host it may take a while to get there)
                deadline = time.monotonic() + 10
                while getattr(reader._spin_condition, "nap_s", None) != 2e-4 and time.monotonic() < deadline:
                    time.sleep(0.001)
                naps_while_waiting.append(getattr(reader._spin_condition, "nap_s", None))
            writer.enqueue({"step": i, "payload": list(range(i))})

    thread = threading.Thread(target=write)
    thread.start()
    got = [reader.dequeue(timeout=10) for _ in delays]
    thread.join()
    assert [m["step"] for m in got] == list(range(len(delays)))
    assert got[7]["payload"] == list(range(7))
    assert naps_while_waiting == [2e-4] * 10  # it napped rather than spun
