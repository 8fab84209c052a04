"""The exact speculative-decoding core, free of paper-specific code.

- ``sampling``: verification as pure functions of probability tensors and a generator
  (accepted, recovered and bonus tokens; greedy, rejection-sampled and rule-based).
- The engine: batched, KV-cached decoding of a draft/target pair (a ``config.DecodingConfig``),
  in per-token rounds under a ``TokenPolicy`` (``tokenwise``) or gamma-token rounds under an
  ``AcceptanceRule`` (``rounds``). Both run on ``cache`` (the ragged KV cache and its one feed),
  start from ``prefill`` (prompt prefill, shared prefixes computed once) and batch continuously
  under ``schedule``.
- ``prefill_store``: prompt prefills computed once and read by every decoding job of the
  same prompts.
- ``branching``: per-row caches cut to a prefix and re-batched, for label mining's branches.
- ``compression``: top-k reconstruction x_hat of a distribution and its errors.
- ``uncertainty``: the draft's uncertainty by temperature perturbation.

The paper wings (``edgespec.cuhlm``, ``edgespec.wisv``) build on this package; it imports
nothing from them.
"""
