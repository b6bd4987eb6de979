from repro.metrics.lm import TokenNLL, bpc, perplexity, scored

__all__ = ["TokenNLL", "bpc", "perplexity", "scored"]
