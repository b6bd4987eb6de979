"""The memory arena's model (`papers/arena/model.py`) against the papers' own models: with one mechanism, the
same weights and the same tokens, a contestant computes what that paper's model computes — outputs, memories and
auxiliary losses over several segments in float32 — so the papers' parity with the authors' code carries over to
the arena. Compositions are checked against their parts; a toy mechanism shows the interface from outside."""

import pytest
import torch
from torch import nn

from papers.arena.model import Arena
from papers.infinity_former.compressive import CompressiveConfig, CompressiveTransformer
from papers.infinity_former.ltm import LTMConfig
from papers.infinity_former.model import InfinityFormer
from papers.lamemo.model import LaMemo, LaMemoConfig
from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.memory import MemoryMechanism, register
from repro.nn.attention import causal_mask, relative_distances, sinusoid_table

from arena_models import MEM, SEGMENTS, SMALL, T, _copy, _run, _tokens


def _close(a, b):
    for x, y in zip(a, b, strict=True):
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def _assert_it_matters(arena: Arena, outs) -> None:
    """The mechanism moves the last segment's output far beyond the tolerance: the backbone alone, same weights."""
    plain = Arena(arena.cfg)
    plain.load_state_dict(
        {k: v for k, v in arena.state_dict().items() if not k.startswith("mechanisms.")}, strict=False)
    base, _, _ = _run(plain, _tokens(), mem_len=MEM)
    assert (outs[-1] - base[-1]).abs().max() > 1e-2


def test_without_mechanisms_it_is_transformer_xl():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    txl, arena = TransformerXL(cfg), Arena(cfg)
    assert txl.state_dict().keys() == arena.state_dict().keys()
    _copy(txl, arena)
    a, ma, _ = _run(txl, _tokens())
    b, mb, _ = _run(arena, _tokens())
    _close(a, b)
    _close(ma, mb)
    assert arena.supports_kv_memory


def test_compressive_is_the_compressive_transformer():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    comp = CompressiveConfig(rate=2, cmem_len=6)
    ref = CompressiveTransformer(cfg, comp)
    arena = Arena(cfg, [{"name": "compressive", "rate": 2, "cmem_len": 6}])
    _copy(ref, arena)
    a, ma, aux_a = _run(ref, _tokens())
    b, mb, aux_b = _run(arena, _tokens())
    _close(a, b)
    _close(ma, mb)
    assert ma[len(ma) // 2].shape[1] == 6  # the compressed memory filled
    for x, y in zip(aux_a, aux_b, strict=True):
        assert x.keys() == y.keys() == {"attn_recon"}
        torch.testing.assert_close(x["attn_recon"], y["attn_recon"])
    _assert_it_matters(arena, b)


@pytest.mark.parametrize("sampling", ["linear", "sticky"])
def test_ltm_is_the_infinity_former(sampling):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    opts = dict(n_basis=16, n_samples=8, sampling=sampling, n_bins=4, kl_weight=0.1)
    ref = InfinityFormer(cfg, LTMConfig(**opts))
    arena = Arena(cfg, [{"name": "ltm", **opts}])
    _copy(ref, arena)
    a, ma, aux_a = _run(ref, _tokens())
    b, mb, aux_b = _run(arena, _tokens())
    _close(a, b)
    _close(ma, mb)
    _assert_it_matters(arena, b)
    assert ma[2 * cfg.n_layer].shape[1] == 16  # the long-term memory was fitted
    for x, y in zip(aux_a, aux_b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            torch.testing.assert_close(x[key], y[key])


@pytest.mark.parametrize("variant", ["disentangled", "txl", "full"])
def test_look_ahead_is_lamemo(variant):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    ref = LaMemo(cfg, LaMemoConfig(variant=variant))
    arena = Arena(cfg, [{"name": "look_ahead", "variant": variant}])
    _copy(ref, arena)
    a, ma, _ = _run(ref, _tokens())
    b, mb, _ = _run(arena, _tokens())
    _close(a, b)
    _assert_it_matters(arena, b)
    _close(ma, mb)


def test_look_ahead_with_a_silent_long_term_memory_is_lamemo():
    """The composition adds the long-term memory's read to LaMemo's layers and nothing else: with the read's
    output map at zero it computes LaMemo's outputs and memory; the long-term memory receives, per layer, the rows
    that leave LaMemo's memory (for layer 0, their embeddings)."""
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    ltm = dict(n_basis=16, n_samples=8)
    ref = LaMemo(cfg, LaMemoConfig())
    arena = Arena(cfg, [{"name": "look_ahead"}, {"name": "ltm", **ltm}])
    missing, unexpected = arena.load_state_dict(ref.state_dict(), strict=False)
    assert not unexpected and missing and all(".attn.ltm." in k for k in missing)
    heard = _run(arena, _tokens())[0]
    with torch.no_grad():
        for layer in arena.layers:
            layer.attn.ltm.out.weight.zero_()  # the read's output map
    a, ma, _ = _run(ref, _tokens())
    b, mb, _ = _run(arena, _tokens())
    _close(a, b)
    _close(ma, mb[: len(ma)])  # the short memory, then LaMemo's (vectors, lse) layer by layer, then the LTM's
    assert (heard[-1] - b[-1]).abs().max() > 1e-2  # with its weights, the long-term memory moves the output
    # the pending rows of layer 0: the embeddings of the segment-before-last's tokens that left the memory
    pending0 = mb[1 + 2 * cfg.n_layer]
    tokens = _tokens()
    stream = torch.cat(list(tokens), dim=1)  # (B, SEGMENTS · T)
    total, keep_from = SEGMENTS * T, SEGMENTS * T - MEM
    left = stream[:, total - T - MEM : keep_from]  # rows that left at the last segment
    arena.eval()
    torch.testing.assert_close(pending0, arena.word_emb(left))


def test_every_paper_model_is_the_backbone_with_its_mechanism():
    """One layer loop: no paper's model (nor the arena's) defines a forward pass of its own; each is the backbone
    with its mechanism, of the class the arena composes under the mechanism's registered name."""
    from papers.infinity_former.compressive import CompressiveMemory
    from papers.infinity_former.model import LongTermMemory
    from papers.lamemo.model import LookAhead
    from papers.mgk.model import MGKLM

    for cls in (CompressiveTransformer, InfinityFormer, LaMemo, MGKLM, Arena):
        assert issubclass(cls, TransformerXL) and "forward" not in vars(cls), cls.__name__
    cfg = TransformerXLConfig(**SMALL)
    for model, mechanism, name in [
        (CompressiveTransformer(cfg, CompressiveConfig(rate=2, cmem_len=6)), CompressiveMemory, "compressive"),
        (InfinityFormer(cfg, LTMConfig(n_basis=16, n_samples=8)), LongTermMemory, "ltm"),
        (LaMemo(cfg, LaMemoConfig()), LookAhead, "look_ahead"),
    ]:
        assert [type(m) for m in model.mechanisms] == [mechanism]
        assert [type(m) for m in Arena(cfg, [{"name": name}]).mechanisms] == [mechanism]


@pytest.mark.parametrize("name", ["compressive", "ltm", "look_ahead"])
def test_a_contestant_with_one_mechanism_is_drawn_as_that_papers_model(name):
    """From the same seed, the arena's contestant and the paper's model hold the same weights under the same names:
    one mechanism, built and initialised in one place."""
    cfg = TransformerXLConfig(**SMALL)
    opts = {"compressive": {"rate": 2, "cmem_len": 6}, "ltm": {"n_basis": 16, "n_samples": 8}, "look_ahead": {}}[name]
    paper = {"compressive": lambda: CompressiveTransformer(cfg, CompressiveConfig(**opts)),
             "ltm": lambda: InfinityFormer(cfg, LTMConfig(**opts)), "look_ahead": lambda: LaMemo(cfg, LaMemoConfig())}
    torch.manual_seed(0)
    theirs = paper[name]().state_dict()
    torch.manual_seed(0)
    ours = Arena(cfg, [{"name": name, **opts}]).state_dict()
    assert theirs.keys() == ours.keys()
    for key in theirs:
        assert torch.equal(theirs[key], ours[key]), key


def test_mechanisms_that_conflict_are_refused_in_one_line():
    cfg = TransformerXLConfig(**SMALL)
    with pytest.raises(ValueError, match="at most one memory mechanism may own the layer step"):
        Arena(cfg, [{"name": "look_ahead"}, {"name": "look_ahead"}])
    with pytest.raises(ValueError, match="attends to no extra context"):
        Arena(cfg, [{"name": "look_ahead"}, {"name": "compressive", "cmem_len": 4}])
    with pytest.raises(ValueError, match="unknown memory mechanism 'nope': known are .*ltm"):
        Arena(cfg, [{"name": "nope"}])


@register("toy_summary")
class ToySummary(MemoryMechanism):
    """A contestant from outside the repository: per layer a running mean of every row that ever left the short
    memory, read through a learned map and added to the attention output."""

    slots = ("mean", "count")

    def __init__(self, cfg, scale: float = 1.0):
        super().__init__()
        self.maps = nn.ModuleList(nn.Linear(cfg.d_model, cfg.d_model, bias=False) for _ in range(cfg.n_layer))
        self.scale = scale

    def empty(self, batch, like):
        return like.new_zeros(batch, 1, like.shape[-1]), like.new_zeros(batch, 1)

    def read(self, i, layer, x_BTD, state):
        return self.scale * self.maps[i](state[0].to(x_BTD.dtype)).expand_as(x_BTD)

    def write(self, i, layer, state, evicted_BOD, inputs_BTD):
        mean, count = state
        n = evicted_BOD.shape[1]
        if not n:
            return state
        total = count + n
        mean = (mean * count[..., None] + evicted_BOD.sum(1, keepdim=True).to(mean.dtype)) / total[..., None]
        return mean.detach(), total


def test_a_new_mechanism_is_one_class_and_one_config_entry():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    arena = Arena(cfg, [{"name": "toy_summary", "module": __name__, "scale": 2.0}])
    outs, mems, _ = _run(arena, _tokens())
    n = cfg.n_layer
    assert len(mems) == n + 2 * n and mems[n + n].shape == (2, 1)
    # every row that left layer 0's memory is in its mean: all but the last MEM embeddings of the stream
    stream = torch.cat(list(_tokens()), dim=1)
    arena.eval()
    expected = arena.word_emb(stream[:, : SEGMENTS * T - MEM]).mean(1, keepdim=True)
    torch.testing.assert_close(mems[n], expected)
    assert float(mems[2 * n][0, 0]) == SEGMENTS * T - MEM
    _assert_it_matters(arena, outs)


class SharedEmbeddingMemory(MemoryMechanism):
    """An owner of the layer step from outside the repository: every layer attends to the embedding memory (the
    layer-0 input of the memory rows) instead of its own layer's; its state counts the segments it has seen."""

    slots = ("segments",)
    owns_layer_step = True

    def __init__(self, cfg):
        super().__init__()

    def empty(self, batch, like):
        return (like.new_zeros(batch, 1),)

    def layer_inputs(self, model, *, emb_BTD, memory_BMD, mem_len, clamp_len, same_length):
        k = memory_BMD.shape[1] + emb_BTD.shape[1]
        mask = causal_mask(emb_BTD.shape[1], k, same_length=same_length, span=mem_len, device=emb_BTD.device)
        pos_KD = sinusoid_table(relative_distances(k, clamp_len=clamp_len, device=emb_BTD.device),
                                model.cfg.d_model)
        return model.drop(emb_BTD), (mask, (pos_KD, model.r_w_bias, model.r_r_bias), memory_BMD)

    def layer_step(self, i, layer, h_BTD, memory_BMD, *, shared, state, read):
        mask, pos, embeddings = shared
        h, _ = layer(h_BTD, mem_BMD=embeddings, mask_TK=mask, pos=pos, read=read)
        return h, memory_BMD, (state[0] + 1,)


def test_a_mechanism_outside_the_repository_may_own_the_layer_step():
    torch.manual_seed(0)
    cfg = TransformerXLConfig(**SMALL)
    model = TransformerXL(cfg, [(SharedEmbeddingMemory, {})])
    outs, mems, _ = _run(model, _tokens(), train=False)
    # the same computation written out: each layer attends to the last MEM embeddings of the stream before it
    stream = torch.cat(list(_tokens()), dim=1)
    with torch.no_grad():
        emb = model.word_emb(stream)
        for s, out in enumerate(outs):
            lo = max(0, s * T - MEM)
            mem, h = emb[:, lo : s * T], emb[:, s * T : (s + 1) * T]
            k = mem.shape[1] + T
            mask = causal_mask(T, k, same_length=False, span=MEM, device=h.device)
            pos = (sinusoid_table(relative_distances(k, clamp_len=-1, device=h.device), cfg.d_model),
                   model.r_w_bias, model.r_r_bias)
            for layer in model.layers:
                h, _ = layer(h, mem_BMD=mem, mask_TK=mask, pos=pos)
            torch.testing.assert_close(out, h)
    assert len(mems) == 1 + cfg.n_layer
    torch.testing.assert_close(mems[0], emb[:, -MEM:])
    assert all(float(x[0, 0]) == SEGMENTS for x in mems[1:])
    # the memory matters: without it every segment's output moves far beyond the tolerance
    alone = model(_tokens()[-1], None, mem_len=MEM)[0]
    assert (alone - outs[-1]).abs().max() > 1e-2
