"""The testbed's wire: bit packing, frames and their checks, message sizes against the delay
model's payloads, and the user-space link's shaping (rate, delay, losses) on real sockets."""

from __future__ import annotations

import math
import socket
import threading
import time

import numpy as np
import pytest

from edgespec.testbed.bits import BitError, BitReader, BitWriter, uint_width
from edgespec.testbed.link import Link, LinkPlan, transit
from edgespec.testbed.messages import (
    TokenUpload,
    WireSpec,
    decode_draft,
    decode_hidden,
    decode_request,
    decode_round_verdict,
    decode_token_up,
    encode_draft,
    encode_hidden,
    encode_request,
    encode_round_verdict,
    encode_token_up,
    encode_token_verdict,
    token_up_control_bits,
)
from edgespec.testbed.wire import (
    HEADER_BYTES,
    MAX_PAYLOAD,
    FrameError,
    Kind,
    encode_frame,
    read_frame,
    send_frame,
)
from edgespec.wireless.payload import index_bits, upload_bits
from edgespec.wisv.protocols import fh_payload, sh_payload, vanilla_payload

VOCAB, HIDDEN, GAMMA = 151_936, 896, 4


# --------------------------------------------------------------------------------------------
# Bits
# --------------------------------------------------------------------------------------------


def test_fields_of_any_width_round_trip_in_exactly_their_bits():
    rng = np.random.default_rng(0)
    w = BitWriter()
    ids = rng.integers(0, VOCAB, 13)
    w.uints(ids, 18).uint(5, 3).floats([0.25, -1.5e-3, 7.0], 32).floats([0.5, 3.0], 16)
    assert w.bits == 13 * 18 + 3 + 3 * 32 + 2 * 16
    data = w.to_bytes()
    assert len(data) == math.ceil(w.bits / 8)
    r = BitReader(data)
    np.testing.assert_array_equal(r.uints(13, 18), ids)
    assert r.uint(3) == 5
    np.testing.assert_array_equal(r.floats(3, 32), np.float32([0.25, -1.5e-3, 7.0]))
    np.testing.assert_array_equal(r.floats(2, 16), np.float16([0.5, 3.0]))
    r.finish()


def test_a_field_too_wide_or_a_payload_too_long_or_short_is_an_error():
    with pytest.raises(BitError, match="does not fit in 3 bits"):
        BitWriter().uint(8, 3)
    data = BitWriter().uint(3, 18).to_bytes()
    with pytest.raises(BitError, match="payload too short"):
        BitReader(data).uints(2, 18)
    r = BitReader(data + b"\x00")
    r.uint(18)
    with pytest.raises(BitError, match="bits left"):
        r.finish()
    assert uint_width(VOCAB) == 18 and uint_width(1) == 1 and uint_width(4) == 3


# --------------------------------------------------------------------------------------------
# Messages against the delay model's payloads
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 7, VOCAB])
@pytest.mark.parametrize("prob_bits", [16, 32])
def test_a_token_upload_is_the_models_bits_plus_its_control_fields(k, prob_bits):
    spec = WireSpec(VOCAB, prob_bits)
    rng = np.random.default_rng(k)
    upload = TokenUpload(
        draft_token=42,
        indices=rng.permutation(VOCAB)[:k],
        values=rng.random(k).astype(np.float32),
        resync=[3, 99, 151_935],
    )
    encoded = encode_token_up(spec, upload)
    assert encoded.model_bits == upload_bits(k, VOCAB, prob_bits)
    assert encoded.control_bits == token_up_control_bits(spec, 3) == 18 + 18 + 16 + 3 * 18
    assert len(encoded.payload) == math.ceil((encoded.model_bits + encoded.control_bits) / 8)
    back = decode_token_up(spec, encoded.payload)
    assert back.draft_token == 42 and back.resync == [3, 99, 151_935]
    np.testing.assert_array_equal(back.indices, upload.indices)
    sent = upload.values.astype(np.float16) if prob_bits == 16 else upload.values
    np.testing.assert_array_equal(back.values, sent)


def test_a_full_hlm_upload_of_qwen_is_950_kilobytes_at_32_bits():
    """B(|V|) = 151,936 x (32 + 18) bits: the payload is 949,600 bytes, and the frame adds
    the 16-byte header and 10 bytes of control fields (d, k, r = 0)."""
    spec = WireSpec(VOCAB, 32)
    upload = TokenUpload(0, np.arange(VOCAB), np.full(VOCAB, 1 / VOCAB, np.float32), [])
    encoded = encode_token_up(spec, upload)
    assert len(encoded.payload) == 949_600 + math.ceil((18 + 18 + 16) / 8)
    assert len(encode_frame(Kind.TOKEN_UP, 0, encoded.payload)) == HEADER_BYTES + 949_607


def test_round_messages_carry_exactly_the_wisv_protocols_payloads():
    spec = WireSpec(VOCAB, 32, HIDDEN, 16, GAMMA)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, VOCAB, GAMMA)
    hidden = rng.standard_normal((GAMMA, HIDDEN)).astype(np.float32)
    ids_only = encode_draft(spec, ids)
    fh = encode_draft(spec, ids, hidden)
    assert ids_only.model_bits == vanilla_payload(GAMMA, VOCAB).uplink_bits
    assert fh.model_bits == fh_payload(GAMMA, VOCAB, HIDDEN, 16).uplink_bits
    assert len(fh.payload) == math.ceil(fh.model_bits / 8) and fh.control_bits == 0
    got_ids, got_hidden = decode_draft(spec, fh.payload, True)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_array_equal(got_hidden, hidden.astype(np.float16).astype(np.float32))
    mask = np.array([False, True, False, True])
    sh = sh_payload(GAMMA, 2, VOCAB, HIDDEN, 16)
    request, extra = encode_request(spec, mask), encode_hidden(spec, hidden[mask])
    verdict = encode_round_verdict(spec, 3, 151_000)
    assert ids_only.model_bits == sh.uplink_bits and extra.model_bits == sh.extra_uplink_bits
    assert request.model_bits + verdict.model_bits == sh.downlink_bits
    assert verdict.model_bits == vanilla_payload(GAMMA, VOCAB).downlink_bits
    np.testing.assert_array_equal(decode_request(spec, request.payload), mask)
    assert decode_hidden(spec, extra.payload, 2).shape == (2, HIDDEN)
    assert decode_round_verdict(spec, verdict.payload) == (3, 151_000)
    assert encode_token_verdict(spec, 7).model_bits == index_bits(VOCAB)


# --------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_a_frame_round_trips_with_a_16_byte_header(pair):
    a, b = pair
    assert send_frame(a, Kind.DRAFT_IDS, 3, b"\x01\x02\x03") == HEADER_BYTES + 3 == 19
    frame = read_frame(b, 1.0, 1.0)
    assert (frame.kind, frame.block, frame.payload, frame.nbytes) == (
        Kind.DRAFT_IDS,
        3,
        b"\x01\x02\x03",
        19,
    )


@pytest.mark.parametrize(
    ("damage", "problem"),
    [
        (lambda f: f[:-1] + bytes([f[-1] ^ 1]), "checksum"),  # a payload bit
        (lambda f: f[:8] + bytes([f[8] ^ 0x80]) + f[9:], "length"),  # length above the limit
        (lambda f: f[:11] + bytes([f[11] ^ 2]) + f[12:], "truncated"),  # 13 -> 15 bytes
        (lambda f: f[:11] + bytes([f[11] ^ 1]) + f[12:], "checksum"),  # 13 -> 12 bytes
        (lambda f: b"XS" + f[2:], "magic"),
        (lambda f: f[:4] + bytes([f[4] ^ 1]) + f[5:], "checksum"),  # the block field
    ],
)
def test_a_damaged_frame_is_detected_and_named(pair, damage, problem):
    a, b = pair
    a.sendall(damage(encode_frame(Kind.TOKEN_UP, 2, b"payload bytes")))
    with pytest.raises(FrameError, match=problem) as err:
        read_frame(b, 1.0, 0.3)
    assert err.value.problem == problem
    assert MAX_PAYLOAD == 64 * 1024 * 1024


def test_a_closed_or_silent_peer_is_named_not_waited_for(pair):
    a, b = pair
    start = time.monotonic()
    with pytest.raises(FrameError, match="timeout"):
        read_frame(b, 0.2, 0.2)
    assert time.monotonic() - start < 1.0
    a.close()
    with pytest.raises(FrameError, match="closed"):
        read_frame(b, 1.0, 1.0)


# --------------------------------------------------------------------------------------------
# The link
# --------------------------------------------------------------------------------------------


def test_transit_charges_rate_propagation_and_each_lost_packet():
    plan = LinkPlan((1e6,), rtt_s=0.04, packet_error_rate=0.0, packet_bytes=1000)
    t = transit(2500, 1e6, plan, np.random.default_rng(0))
    assert (t.tx_s, t.retx_s, t.prop_s, t.packets, t.lost) == (0.02, 0.0, 0.02, 3, 0)
    lossy = LinkPlan((1e6,), rtt_s=0.04, packet_error_rate=0.5, packet_bytes=1000)
    rng = np.random.default_rng(3)
    draws = np.random.default_rng(3).random(64)
    t = transit(2500, 1e6, lossy, rng)
    # the same draws by hand: each packet is resent while its draw is below the PER
    lost, retx, i = 0, 0.0, 0
    for size in (1000, 1000, 500):
        while draws[i] < 0.5:
            lost, retx, i = lost + 1, retx + 0.04 + 8 * size / 1e6, i + 1
        i += 1
    assert t.lost == lost > 0 and t.retx_s == pytest.approx(retx)
    assert transit(100, None, lossy, np.random.default_rng(3)).tx_s == 0.0


@pytest.fixture
def link():
    device, device_side = socket.socketpair()
    edge_side, edge = socket.socketpair()
    emulator = Link(device_side, edge_side)
    yield device, edge, emulator
    emulator.close()
    device.close()
    edge.close()


def _timed_transfer(sender, receiver, kind, payload):
    start = time.perf_counter()
    send_frame(sender, kind, 0, payload)
    frame = read_frame(receiver, 30.0, 30.0)
    return time.perf_counter() - start, frame


def test_the_link_holds_a_frame_for_its_rate_and_half_the_rtt_within_ten_percent(link):
    """A 100,000-byte uplink frame at 1 Mbit/s with a 0.2 s RTT arrives after
    8 x 100,016 / 1e6 + 0.1 = 0.9001 s; a downlink frame after RTT / 2 = 0.1 s (no rate)."""
    device, edge, emulator = link
    emulator.set_plan(LinkPlan((1e6,), rtt_s=0.2))
    up, frame = _timed_transfer(device, edge, Kind.DRAFT_FH, bytes(100_000))
    assert len(frame.payload) == 100_000
    assert up == pytest.approx(8 * 100_016 / 1e6 + 0.1, rel=0.1)
    down, _ = _timed_transfer(edge, device, Kind.ROUND_VERDICT, b"\x07")
    assert down == pytest.approx(0.1, rel=0.1)
    records = emulator.take_records()
    assert [(r["direction"], r["bytes"]) for r in records] == [("up", 100_016), ("down", 17)]
    assert records[0]["tx_s"] == pytest.approx(0.800128)


def test_the_link_retransmits_lost_packets_after_the_arq_timeout(link):
    device, edge, emulator = link
    plan = LinkPlan((1e6,), 0.02, packet_error_rate=0.3, packet_bytes=500, loss_seed=11)
    emulator.set_plan(plan)
    elapsed, _ = _timed_transfer(device, edge, Kind.DRAFT_IDS, bytes(4000))
    record = emulator.take_records()[0]
    expected = transit(4016, 1e6, plan, np.random.default_rng(11))
    assert record["lost"] == expected.lost > 0 and record["packets"] == 9
    assert record["retx_s"] == pytest.approx(expected.retx_s)
    assert elapsed == pytest.approx(expected.tx_s + expected.retx_s + 0.01, rel=0.1)


def test_the_link_damages_a_frame_on_request_and_the_receiver_names_it(link):
    device, edge, emulator = link
    emulator.set_plan(LinkPlan((1e8,), 0.0, corrupt=(("up", 1, "payload"),)))
    send_frame(device, Kind.DRAFT_IDS, 0, b"first")
    assert read_frame(edge, 5.0, 5.0).payload == b"first"
    send_frame(device, Kind.DRAFT_IDS, 0, b"second")
    with pytest.raises(FrameError, match="checksum"):
        read_frame(edge, 5.0, 5.0)


def test_a_peer_closing_reaches_the_other_side_at_once(link):
    device, edge, emulator = link
    emulator.set_plan(LinkPlan((1e6,), 0.0))
    edge.close()
    threading.Event().wait(0.1)
    start = time.monotonic()
    with pytest.raises(FrameError, match="closed|truncated"):
        read_frame(device, 5.0, 5.0)
    assert time.monotonic() - start < 1.0
