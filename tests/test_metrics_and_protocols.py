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


def test_sliding_window_scores_every_token_from_its_own_window():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, dropout=0.0,
                              attention="absolute")
    w = 5
    module = TransformerXLLM(cfg, n_token=30, eval_protocol={"kind": "sliding", "window": w, "window_batch": 7}).eval()
    stream = torch.randint(0, 30, (2, 23))
    module._eval_start("valid")
    got = []
    with torch.no_grad():
        for start in range(0, 22, 3):  # segments of 3, the last one shorter
            end = min(start + 3, 22)
            seg = Segment(stream[:, start:end], stream[:, start + 1 : end + 1])
            got.append(module._sliding_nll("valid", seg.input, seg.target))
    got = torch.cat(got, 1)
    expect = torch.empty(2, 22)
    with torch.no_grad():
        for p in range(22):  # predict stream[p+1] from the window ending at stream[p]
            lo = max(0, p - w + 1)
            window = stream[:, lo : p + 1]
            hidden, _ = module.model(window, None, mem_len=0)
            expect[:, p] = module.model.nll(hidden[:, -1:], stream[:, p + 1 : p + 2]).squeeze(1)
    assert_close(got, expect, rtol=1e-5, atol=1e-5)
