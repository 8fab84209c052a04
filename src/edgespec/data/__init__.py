"""Prompt sets.

- ``records``: the prompt schema and its JSONL I/O.
- ``answers``: final answers and exact matching (torch-free).
- ``arithmetic``: the seeded arithmetic word-problem generator.
- ``hub``: adapters from public datasets to the schema.
- ``prepare``: loading one configured set and splitting it into calibration and evaluation.
- ``chat``: prompt tokenisation with the chat template.
"""
