"""WISV (gamma draft tokens per round): channel-aware semantic verification.

- ``labels``: AutoJudge-style mining of which mismatches change the answer (the walk);
  ``mining``: its settings and how a substituted branch is judged.
- ``relabel``: channel-aware relabeling of the mined mismatches (cvxpy), over CSI samples.
- ``head``: the decision head and its training; ``training``: the three heads of rule
  train_head on one shared split, each with its threshold.
- ``acceptance``: the acceptance rules (top-k, decision head with or without CSI).
- ``protocols``: FH and SH upload payloads and round latency.
- ``decode``: decoding one variant under one channel into a per-round table.
- ``evaluate``: pricing a round table under a channel, and the metrics (torch-free).
- ``summary`` and ``report``: the report's tables and its prose and figures (torch-free).

Uses ``edgespec.decoding`` and ``edgespec.wireless``.
"""
