"""A device-edge testbed: the draft in a device process and the target in an edge process, one
core each, talking over loopback TCP through a user-space link emulator, so that the delay
model's payloads and latencies are checked against bytes on a socket and a wall clock
(methods §11).

``bits`` and ``messages`` (the bit-packed payloads and what of them the model prices), ``wire``
(frames, checksums), ``link`` (the emulated channel: rate per fading block, RTT, packet loss
with retransmission), ``endpoint`` (a side's socket and clocks), ``answer`` (what both sides
agree on per answer), ``tokenwise`` and ``rounds`` (the device's and the edge's halves of the
CU-HLM and WISV protocols), ``workers`` and ``session`` (the three processes), ``stage`` and
``reference`` (the rule's answers and their single-process decodes), ``predict`` (the
simulator's prediction from the project's pricing functions) and ``summary`` (measured against
modelled, term by term).
"""
