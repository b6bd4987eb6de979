"""Subword text for the GPT-2 experiments: tokenizers, document streams (WikiText-103 raw, PG-19) and grounded
dialogue (CMU-DoG and the tiny generated set). Nothing here imports `transformers`."""
