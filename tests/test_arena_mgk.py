"""MGK inside Transformer-XL (`papers/arena/mgk.py`) against a direct computation of its definition in float64 (the
attention computes its mixture scores in float32, as MGK's, hence 1e-5):
per (query, key) the mixture's log-density plus Transformer-XL's position terms, a masked softmax, the values; and
LaMemo's look-ahead with the same score, interpolated with the carried vectors."""

import math

import pytest
import torch

from papers.arena.mgk import LookAheadMGKAttention, RelativeMGKAttention
from papers.lamemo.model import look_ahead_window, mask_bias
from repro.nn.attention import causal_mask, relative_distances, sinusoid_table

D, H, E, R = 16, 2, 8, 2


def _attention(cls=RelativeMGKAttention, **kw):
    torch.manual_seed(0)
    att = cls(d_model=D, n_head=H, d_head=E, dropatt=0.0, n_components=R, **kw).double()
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0, 0.4)  # large enough that every term moves the output far beyond the tolerance
    return att.eval()


def _score(att, q_E, keys_RE, h):
    """logsumexp_r(log π_r − ‖q − k_r‖² / 2σ_r²) for head h."""
    log_pi = torch.log_softmax(att.weights.logits[h], -1)
    inv = 0.5 * torch.exp(-att.log_sigma2[h])
    return torch.logsumexp(log_pi - ((q_E - keys_RE) ** 2).sum(-1) * inv, 0)


def _naive_causal(att, x_KD, m, r_table, v_HE, rows):
    """Outputs (vectors per head) of query rows `rows` (indices into x) over keys 0 … row (causal), with the
    position term of distance row − j from `r_table(d)`."""
    q, k, v = att.proj(x_KD[None], x_KD[None])
    out = torch.zeros(len(rows), H, E, dtype=x_KD.dtype)
    for n, i in enumerate(rows):
        for h in range(H):
            keys = list(range(0, i + 1))
            s = torch.stack([_score(att, q[0, h, i], k[0, h, :, j], h) +
                             ((q[0, h, i] + v_HE[h]) @ att.r_net(r_table(i - j))[h * E:(h + 1) * E]) / math.sqrt(E)
                             for j in keys])
            out[n, h] = torch.softmax(s, 0) @ v[0, h, keys]
    return out


def test_relative_mgk_with_memory_is_its_definition():
    att = _attention()
    m, t = 5, 4
    x = torch.randn(m + t, D, dtype=torch.float64)
    v_HE = torch.randn(H, E, dtype=torch.float64)
    r_KD = sinusoid_table(relative_distances(m + t), D).double()
    out, _ = att(x[None, m:], mem_BMD=x[None, :m], mask_TK=causal_mask(t, m + t), pos=(r_KD, None, v_HE))

    def r_table(d):
        return sinusoid_table(torch.tensor([d]), D).double()[0]

    vec = _naive_causal(att, x, m, r_table, v_HE, list(range(m, m + t)))
    expected = att.o_net(vec.reshape(t, H * E))
    torch.testing.assert_close(out[0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m,t", [(6, 4), (3, 5)])
def test_look_ahead_mgk_refreshes_memory_rows_by_its_definition(m, t):
    """Memory row i attends to the window keys on its right (LaMemo's window: up to the segment's first row),
    with the future position table and v₊, and is interpolated with its carried vector by the log-normalisers."""
    att = _attention(LookAheadMGKAttention)
    x = torch.randn(m + t, D, dtype=torch.float64)
    v_HE, v_fut = torch.randn(H, E, dtype=torch.float64), torch.randn(H, E, dtype=torch.float64)
    r_KD = sinusoid_table(relative_distances(m + t), D).double()
    r_fut = sinusoid_table(torch.arange(1, m + 1), D).double()
    window = look_ahead_window(m, t, full=False)
    window = (window[0], window[1], window[2].double())
    pos = (r_KD, None, v_HE, r_fut, None, v_fut, window)
    recur = torch.randn(1, m, H, E, dtype=torch.float64)
    lse_old = torch.randn(1, m, H, dtype=torch.float64)
    out_cur, out_mem, vec_mem, lse_mem, vec_cur, _ = att.look_ahead(
        x[None], m, bias_TK=mask_bias(causal_mask(t, m + t), dtype=torch.float64), pos=pos, recur_BMHE=recur,
        lse_BMH=lse_old)
    q, k, v = att.proj(x[None], x[None])
    start = window[0]
    for i in range(m):
        for h in range(H):
            keys = [j for j in range(start, m + 1) if j > i]
            s = torch.stack([_score(att, q[0, h, i], k[0, h, :, j], h) +
                             ((q[0, h, i] + v_fut[h]) @ att.r_net(r_fut[j - i - 1])[h * E:(h + 1) * E]) / math.sqrt(E)
                             for j in keys])
            lse_new = torch.logsumexp(s, 0)
            new = torch.softmax(s, 0) @ v[0, h, keys]
            alpha = torch.sigmoid(lse_old[0, i, h] - lse_new)
            torch.testing.assert_close(vec_mem[0, i, h].double(), alpha * recur[0, i, h] + (1 - alpha) * new,
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(lse_mem[0, i, h].double(), torch.logaddexp(lse_old[0, i, h], lse_new),
                                       rtol=1e-5, atol=1e-5)
    # the current rows: the causal MGK attention over [memory; segment]
    def r_table(d):
        return sinusoid_table(torch.tensor([d]), D).double()[0]

    vec = _naive_causal(att, x, m, r_table, v_HE, list(range(m, m + t)))
    torch.testing.assert_close(vec_cur[0].double(), vec, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_cur[0], att.o_net(vec.reshape(t, H * E)), rtol=1e-5, atol=1e-5)
    assert out_mem.shape == (1, m, D)
