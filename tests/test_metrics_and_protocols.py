"""Token-weighted metrics and the sliding-window evaluation protocol against direct computations."""

import math

import pytest
import torch
from torch.testing import assert_close

from papers.transformer_xl.model import TransformerXLConfig
from papers.transformer_xl.module import TransformerXLLM
from repro.data.lm import Segment
from repro.metrics import TokenNLL, bpc, perplexity


def test_token_nll_weights_by_tokens_not_by_batches():
    m = TokenNLL()
    m.update(torch.full((4, 10), 2.0))  # 40 tokens at 2 nats
    m.update(torch.full((4, 1), 5.0))  # a short last segment: 4 tokens at 5 nats
    out = m.compute()
    assert out["tokens"] == 44
    assert_close(out["mean_nll"], torch.tensor((80 + 20) / 44, dtype=torch.float64))
    assert out["mean_nll"] != pytest.approx((2.0 + 5.0) / 2)  # not a mean of batch means


def test_perplexity_and_bpc():
    assert perplexity(math.log(20.0)) == pytest.approx(20.0)
    assert bpc(math.log(2) * 1.5) == pytest.approx(1.5)


@pytest.mark.parametrize("attention", ["absolute", "relative"])
@pytest.mark.parametrize("stride", [1, 2])
def test_sliding_window_scores_every_token_from_its_own_window(stride, attention):
    """Against one forward per scored window, computed here: absolute positions (counted from the window's end)
    take the per-position path near the stream's start, relative ones the single causal forward."""
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                              attention=attention)
    w = 5
    module = TransformerXLLM(cfg, n_token=30, eval_protocol={"kind": "sliding", "window": w, "window_batch": 7,
                                                             "stride": stride}).eval()
    stream = torch.randint(0, 30, (2, 23))
    module._eval_start("valid")
    got = []
    with torch.no_grad():
        for start in range(0, 22, 3):  # segments of 3, the last one shorter
            end = min(start + 3, 22)
            seg = Segment(stream[:, start:end], stream[:, start + 1 : end + 1])
            got.append(module._sliding_nll("valid", seg.input, seg.target))
    got = torch.cat(got, 1)
    # which window scores position p: its own near the stream start (p < w − 1); then, within each segment of 3,
    # blocks of `stride` positions scored from the window that ends at the block's last position
    window_end = {}
    for start in range(0, 22, 3):
        positions = [p for p in range(start, min(start + 3, 22)) if p >= w - 1]
        for p in range(start, min(start + 3, 22)):
            if p < w - 1:
                window_end[p] = p
        for i in range(0, len(positions), stride):
            block = positions[i : i + stride]
            for p in block:
                window_end[p] = block[-1]
    expect = torch.empty(2, 22)
    with torch.no_grad():
        for p in range(22):  # predict stream[p+1]
            end = window_end[p]
            window = stream[:, max(0, end - w + 1) : end + 1]
            hidden, _ = module.model(window, None, mem_len=0)
            pos = window.shape[1] - 1 - (end - p)
            expect[:, p] = module.model.nll(hidden[:, pos : pos + 1], stream[:, p + 1 : p + 2]).squeeze(1)
    assert_close(got, expect, rtol=1e-5, atol=1e-5)
