"""edgespec: device-edge hybrid language-model inference by speculative decoding over a
simulated wireless link, reproducing CU-HLM and WISV (docs/methods.md has the formulas).

The package reads as the system does:

- ``edgespec.decoding``: the exact speculative-decoding core (sampler, batched engine, top-k
  compression, uncertainty); nothing paper-specific.
- ``edgespec.wireless``: the uplink channel, the delay model and payload sizes (torch-free).
- ``edgespec.cuhlm``: the CU-HLM / U-HLM wing (calibration, k selection, policies, decoding,
  evaluation).
- ``edgespec.wisv``: the WISV wing (label mining, relabeling, decision head, protocols,
  decoding, evaluation).
- ``edgespec.models``: model pairs (presets, fetching, loading, tiny test models).
- ``edgespec.data``: prompt sets (schema, answers, generators, hub adapters, splits).
- Cross-cutting helpers: ``config`` (schema validation), ``artifacts`` (atomic writes, logs),
  ``checks`` (number checks), ``intervals`` (spreads and their format), ``seeding``,
  ``variants`` (variant ids), ``runconfig`` (objects the stages build alike), ``scoring`` (text
  similarity and answers), ``profiling`` (the measured latency profile), ``report`` and ``plots``.

Imports run one way, down the layers that ``tests/test_layout.py`` lists for every folder and
top-level module: the wings use ``decoding`` and ``wireless``, never the reverse.
"""
