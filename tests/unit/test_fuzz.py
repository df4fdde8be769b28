"""Hostile input: random and mutated frames never crash the decoder; each is rejected with a
reason or, when a mutation happens to leave a valid message, passes full validation."""

from flashq.wire import fuzz
from flashq.wire.codec import Decoder, RejectedFrame


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


def test_exhausting_frames_are_rejected_each_for_what_it_is():
    """Deep nesting, huge multi-part messages (over and under the size limit) and other schema
    versions each get a rejection naming the problem, and a flood of them adds no reason keys
    per value (the hub's books count reasons with numbers blanked)."""
    from flashq.wire.transport import _Codec

    dec = Decoder(max_message_bytes=1 << 20)
    reasons = {}
    for name, frames in [("deep", fuzz.deeply_nested(50_000)), ("over", fuzz.huge_multipart(2, 1 << 20)),
                         ("under", fuzz.huge_multipart(64, 1024)), ("schema", fuzz.other_schema(7))]:
        try:
            dec.decode(frames)
        except RejectedFrame as e:
            reasons[name] = e.reason
    assert reasons["deep"] == "nested too deep to decode"
    assert reasons["over"].startswith("message of 2097174 bytes exceeds the 1048576-byte limit")
    assert reasons["under"] == "64 data frames sent, 0 referenced"
    assert reasons["schema"].startswith("schema version 7,")
    assert dec.decode(fuzz.deeply_nested(10)).task == {"x": [[[[[[[[[[None]]]]]]]]]]}  # shallow nesting is a message
    codec, accepted = _Codec(1 << 20), 0
    for frames in fuzz.hostile(3000, seed=3, max_message_bytes=1 << 20):
        accepted += len(codec.decode_all("flood", frames))
    assert sum(codec.rejected.values()) + accepted == 3000 and accepted < 600  # no bundles among them: one verdict a frame
    assert codec.rejected["schema version N, this build speaks N"] >= 200 and len(codec.rejected) <= 40


def test_the_fuzz_blast_reaches_the_decoder_for_every_caller():
    """bench/fuzz.py and bench/chaos.py share `blast`: the mutated messages it sends must arrive as
    a flashq peer sends them (one frame), or the hub refuses them for their frame count and the
    decoder is never fuzzed (chaos.json at 931b40c: 49,843 of 130,000 stopped there)."""
    import asyncio

    from bench.fuzz import blast

    out = asyncio.run(blast(list(fuzz.frames(3_000, seed=7))))
    assert out["rejected"] + out["accepted_valid"] == 3_000
    assert not [r for r in out["top_reasons"] if "a flashq message is one frame" in r], out["top_reasons"]
    assert {"malformed msgpack", "invalid message"} <= set(out["top_reasons"])
