"""CU-HLM and U-HLM (one draft token per round): uncertainty-aware skipping and top-k uploads.

- ``traces``: per-token traces of standard HLM, the raw material of calibration.
- ``calibration``: the linear fit beta ~ a u + b and the skip thresholds.
- ``bounds``: the bounds on the resampling distortion and the online k(t).
- ``kselect``: the offline k* (cvxpy) and the per-k table of how the bounds fare.
- ``policies``: the device's per-token decisions of each variant.
- ``decode``: decoding one variant into a per-token table.
- ``evaluate``: pricing a token table under a channel, and the metrics (torch-free).
- ``scores``: text-level scores of the completions.
- ``profile``: the device's vocabulary work (online k(t), top-k extraction) timed.

Uses ``edgespec.decoding`` and ``edgespec.wireless``.
"""
