"""LaMemo: look-ahead memory with memory interpolation (Ji et al., NAACL 2022) on the Transformer-XL backbone."""
