"""Hostile input: random and mutated frames never crash the decoder; each is rejected with a
reason or, when a mutation happens to leave a valid message, passes full validation."""

from flashq import fuzz
from flashq.codec import Decoder, RejectedFrame


def test_twenty_thousand_hostile_frames_are_rejected_with_reasons_or_valid():
    dec, rejected, accepted, reasons = Decoder(max_message_bytes=1 << 20), 0, 0, set()
    for frames in fuzz.frames(20_000, seed=1):
        try:
            msg = dec.decode(frames)
        except RejectedFrame as e:
            assert e.reason
            rejected += 1
            reasons.add(e.reason.split(":")[0][:40])
            continue
        msg.validate()
        accepted += 1
    assert rejected + accepted == 20_000 and rejected > 15_000
    assert len(reasons) >= 5  # malformed msgpack, invalid message, frame counts, array sizes, ...
