"""The wireless link and the delay model; torch-free.

- ``channel``: block-fading uplink rate R = W log2(1 + SNR |h|^2) and CSI features.
- ``delay``: compute-time profiles and the per-token delay model.
- ``payload``: bits of a top-k distribution upload.
"""
