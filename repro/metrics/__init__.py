from repro.metrics.lm import TokenNLL, bpc, perplexity

__all__ = ["TokenNLL", "bpc", "perplexity"]
