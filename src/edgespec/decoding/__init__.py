"""The exact speculative-decoding core, free of paper-specific code.

- ``sampling``: verification as pure functions of probability tensors and a generator
  (accepted, recovered and bonus tokens; greedy, rejection-sampled and rule-based).
- ``engine``: batched, KV-cached decoding of a draft/target pair in per-token rounds (under a
  ``TokenPolicy``) or gamma-token rounds (under an ``AcceptanceRule``).
- ``prefill_store``: prompt prefills computed once and read by every decoding job of the
  same prompts.
- ``compression``: top-k reconstruction x_hat of a distribution and its errors.
- ``uncertainty``: the draft's uncertainty by temperature perturbation.

The paper wings (``edgespec.cuhlm``, ``edgespec.wisv``) build on this package; it imports
nothing from them.
"""
