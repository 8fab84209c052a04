"""WISV (gamma draft tokens per round): channel-aware semantic verification.

- ``labels``: AutoJudge-style mining of which mismatches change the answer.
- ``relabel``: channel-aware relabeling of the mined mismatches (cvxpy).
- ``head``: the decision head and its training.
- ``acceptance``: the acceptance rules (top-k, decision head with or without CSI).
- ``protocols``: FH and SH upload payloads and round latency.
- ``decode``: decoding one variant under one channel into a per-round table.
- ``evaluate``: pricing a round table under a channel, and the metrics (torch-free).

Uses ``edgespec.decoding`` and ``edgespec.wireless``.
"""
