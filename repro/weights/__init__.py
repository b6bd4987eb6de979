"""Weights in and out: readers of the formats trained models are released in, and the exports of ours."""
