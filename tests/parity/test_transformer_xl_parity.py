"""Transformer-XL against the official code: per-token losses and memories of the fixtures made by
`make_transformer_xl.py` from kimiyoung/transformer-xl `pytorch/mem_transformer.py` (`MemTransformerLM`).

Each fixture's weights are mapped onto our `TransformerXL` through `official_to_ours` (every key of both sides
accounted for), and our model runs the same segments with the same memory settings; losses and memories must
agree to 1e-4 over every segment. The mechanisms are shown to matter: without the memory, or with u and v
(r_w_bias, r_r_bias) swapped, the losses move by far more than the tolerance. The documented differences are
emulated here and then agree: the official in-place accumulation of positions in the absolute model's layer-0
memory, eval.py's lengths with clamp_len and same_length, and train.py's validation memory. Every paper
config's parameter count equals the official model's for the same settings. Training: the gradients that
train.py's step accumulates over 4 segments (`grad_*.pt`, `make_grad_case`) equal ours, parameter by parameter;
without the memory they do not.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import yaml

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.nn.attention import attention_kernel, relative_distances, sinusoid_table
from tests.parity.common import TOLERANCE, load_fixture

FIXTURES = Path(__file__).resolve().parent / "transformer_xl"
CASES = sorted(p.stem for p in FIXTURES.glob("*.pt") if p.stem != "params" and not p.stem.startswith("grad_"))
GRAD_CASES = sorted(p.stem for p in FIXTURES.glob("grad_*.pt"))
ROOT = Path(__file__).resolve().parents[2]

# official state-dict key (regex) → our key; None = not a parameter of ours (checked separately)
NAME_MAP = [
    (r"word_emb\.emb_layers\.(\d+)\.weight", r"word_emb.emb_layers.\1.weight"),
    (r"word_emb\.emb_projs\.(\d+)", r"word_emb.emb_projs.\1"),
    (r"r_w_bias", "r_w_bias"),
    (r"r_r_bias", "r_r_bias"),
    (r"pos_emb\.inv_freq", None),  # a buffer; ours computes the same frequencies (asserted below)
    (r"layers\.(\d+)\.dec_attn\.qkv_net\.weight", r"layers.\1.attn.qkv_net.weight"),
    (r"layers\.(\d+)\.dec_attn\.r_net\.weight", r"layers.\1.attn.r_net.weight"),
    (r"layers\.(\d+)\.dec_attn\.o_net\.weight", r"layers.\1.attn.o_net.weight"),
    (r"layers\.(\d+)\.dec_attn\.layer_norm\.(weight|bias)", r"layers.\1.attn_norm.\2"),
    (r"layers\.(\d+)\.pos_ff\.CoreNet\.(0|3)\.(weight|bias)", r"layers.\1.ff.net.\2.\3"),
    (r"layers\.(\d+)\.pos_ff\.layer_norm\.(weight|bias)", r"layers.\1.ff_norm.\2"),
    # attn_type 2 has separate q_net and kv_net (k rows, then v rows); ours one qkv_net = [q; k; v]
    (r"layers\.(\d+)\.dec_attn\.q_net\.weight", r"layers.\1.attn.qkv_net.weight[q]"),
    (r"layers\.(\d+)\.dec_attn\.kv_net\.weight", r"layers.\1.attn.qkv_net.weight[kv]"),
    (r"crit\.cluster_(weight|bias)", r"crit.cluster_\1"),
    (r"crit\.out_layers\.(\d+)\.(weight|bias)", r"crit.out_layers.\1.\2"),
    (r"crit\.out_projs\.(\d+)", r"crit.out_proj_\1"),
]


def ours_name(key: str) -> str | None:
    for pattern, target in NAME_MAP:
        if re.fullmatch(pattern, key):
            return None if target is None else re.sub(pattern, target, key)
    raise KeyError(f"official key {key!r} has no entry in NAME_MAP: map it onto our TransformerXL")


def official_state(tensors: dict, meta: dict) -> dict[str, torch.Tensor]:
    sd = {k[len("weight."):]: v for k, v in tensors.items() if k.startswith("weight.")}
    for key, source in meta["tied"].items():  # saved once; the official state dict lists both names
        sd[key] = sd[source]
    return sd


def build_ours(meta: dict, sd: dict[str, torch.Tensor]) -> TransformerXL:
    m = meta["model"]
    cfg = TransformerXLConfig(
        n_layer=m["n_layer"], d_model=m["d_model"], n_head=m["n_head"], d_head=m["d_head"], d_inner=m["d_inner"],
        n_token=m["n_token"], dropout=0.0, dropatt=0.0, div_val=m.get("div_val", 1),
        cutoffs=tuple(m.get("cutoffs", ())), tie_weight=True,
        tie_projs=tuple(m["tie_projs"]) if "tie_projs" in m else None,
        attention="absolute" if m["attn_type"] == 2 else "relative",
    )
    model = TransformerXL(cfg).eval()
    ours: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in sd.items():
        name = ours_name(key)
        if name is None:
            continue
        if name.endswith("]"):
            base, part = name[:-1].split("[")
            qkv.setdefault(base, {})[part] = value
        else:
            ours[name] = value
    for base, parts in qkv.items():
        ours[base] = torch.cat([parts["q"], parts["kv"]], dim=0)
    # tie_projs=False where the official proj is None (div_val 1, d_embed = d_model): nothing to map either side
    mine = set(model.state_dict())
    assert set(ours) == mine, f"unmapped: official→{sorted(set(ours) - mine)}, ours {sorted(mine - set(ours))}"
    model.load_state_dict(ours, strict=True)
    if "pos_emb.inv_freq" in sd:  # the official sinusoid frequencies are ours
        d = m["d_model"]
        ref = sinusoid_table(torch.ones(1), d)[0, : d // 2].asin()
        torch.testing.assert_close(ref, sd["pos_emb.inv_freq"], atol=1e-6, rtol=1e-6)
    return model


def segments(tensors: dict, meta: dict):
    stream_TB = tensors["input.stream"]
    t = meta["tgt_len"]
    for s in range(meta["segments"]):
        yield stream_TB[s * t:(s + 1) * t].T.contiguous(), stream_TB[s * t + 1:(s + 1) * t + 1].T.contiguous()


def run_ours(model, tensors, meta, *, memory=True, kv_memory=False, layer0_memory=None):
    """Per-segment losses (T, B) (the official layout) and memories (n_layer, M, B, D).

    `layer0_memory(mems, new_mems, k)` may rewrite the layer-0 memory after each segment (emulations)."""
    losses, mems_out, mems = [], [], None
    with torch.no_grad():
        for x, y in segments(tensors, meta):
            hidden, new = model(x, mems if memory else None, mem_len=meta["mem_len"], clamp_len=meta["clamp_len"],
                                same_length=meta["same_length"], kv_memory=kv_memory)
            if layer0_memory is not None:
                new = layer0_memory(mems, new, x.shape[1])
            mems = new
            losses.append(model.nll(hidden, y).T)
            if not kv_memory:
                mems_out.append(torch.stack([mm.transpose(0, 1) for mm in new]))
    return torch.stack(losses), mems_out


def load(case: str):
    tensors, meta = load_fixture(FIXTURES / f"{case}.pt")
    sd = official_state(tensors, meta)
    return tensors, meta, build_ours(meta, sd)


def official_layer0_accumulation(model: TransformerXL, mem_len: int):
    """attn_type 2: `mems_i += pos_emb[:mlen]` adds the position table to the layer-0 memory in place, and
    `_update_mems` then keeps that modified memory: positions accumulate in it while it stays in the memory."""

    def rewrite(old, new, t):
        if not old or old[0].shape[1] == 0:
            return new
        m = old[0].shape[1]
        pos = sinusoid_table(relative_distances(m + t), model.cfg.d_model)[:m]
        cat = torch.cat([old[0] + pos, new[0][:, -t:]], dim=1)
        return [cat[:, -mem_len:], *new[1:]]

    return rewrite


@contextmanager
def variant(model: TransformerXL, name: str):
    """The attention kernel (`repro.nn.attention`), and with `+compile` the decoder layers compiled as `repro fit
    --run.compile true` compiles them: every variant must give the authors' numbers."""
    kernel, _, compiled = name.partition("+")
    if compiled:
        for layer in model.compile_units():
            layer.compile(dynamic=False)
    try:
        with attention_kernel(model, kernel):
            yield
    finally:
        for layer in model.compile_units():
            layer._compiled_call_impl = None


KERNELS = ["eager", "sdpa"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("case", CASES)
def test_losses_and_memories_match_official(case, kernel):
    tensors, meta, model = load(case)
    with variant(model, kernel):
        _losses_and_memories_match(tensors, meta, model)


def _losses_and_memories_match(tensors, meta, model):
    emulate = None
    if meta["model"]["attn_type"] == 2 and meta["mem_len"] > meta["tgt_len"]:
        emulate = official_layer0_accumulation(model, meta["mem_len"])  # README: absolute-position baseline
    losses, mems = run_ours(model, tensors, meta, layer0_memory=emulate)
    torch.testing.assert_close(losses, tensors["output.loss"], atol=TOLERANCE, rtol=TOLERANCE)
    for s, got in enumerate(mems):
        if meta["mem_len"] > 0:
            torch.testing.assert_close(got, tensors[f"output.mems.{s}"], atol=TOLERANCE, rtol=TOLERANCE)
    assert len(mems) == meta["segments"] >= 3
    if model.supports_kv_memory and meta["mem_len"] > 0:  # the evaluation key/value memory: the same losses
        kv_losses, _ = run_ours(model, tensors, meta, kv_memory=True)
        torch.testing.assert_close(kv_losses, tensors["output.loss"], atol=TOLERANCE, rtol=TOLERANCE)


def test_absolute_memory_deviation_is_the_only_difference():
    """Without the emulation our out-of-place positions differ from the official in-place accumulation from the
    second segment on, where the memory holds earlier memory (mem_len > tgt_len); the first segment agrees."""
    tensors, meta, model = load("abs_mem")
    losses, _ = run_ours(model, tensors, meta)
    ref = tensors["output.loss"]
    torch.testing.assert_close(losses[:2], ref[:2], atol=TOLERANCE, rtol=TOLERANCE)
    gap = (losses[2:] - ref[2:]).abs().flatten(1).amax(1)  # per segment, in nats (the deviation table's effect)
    assert gap.tolist() == pytest.approx([0.045, 0.073], abs=1e-3)


@pytest.mark.parametrize("case", [c for c in CASES if c != "abs_nomem"])
def test_dropping_the_memory_moves_the_loss(case):
    tensors, meta, model = load(case)
    losses, _ = run_ours(model, tensors, meta, memory=False)
    ref = tensors["output.loss"]
    torch.testing.assert_close(losses[0], ref[0], atol=TOLERANCE, rtol=TOLERANCE)  # no memory yet
    assert (losses[1:] - ref[1:]).abs().max() > 100 * TOLERANCE


@pytest.mark.parametrize("case", [c for c in CASES if c.startswith(("rel", "adaptive"))])
def test_swapping_u_and_v_moves_the_loss(case):
    tensors, meta, model = load(case)
    with torch.no_grad():
        u = model.r_w_bias.clone()
        model.r_w_bias.copy_(model.r_r_bias)
        model.r_r_bias.copy_(u)
    losses, _ = run_ours(model, tensors, meta)
    assert (losses - tensors["output.loss"]).abs().max() > 100 * TOLERANCE


def test_eval_protocol_is_eval_py():
    """rel_eval: the model was built with the training lengths (tgt 4, mem 4), then eval.py's
    `reset_length(tgt, 0, mem)`, `clamp_len` and `same_length`; ours takes the same three from `eval_memory`.
    Without same_length, or without the clamp, the result differs."""
    tensors, meta, model = load("rel_eval")
    assert (meta["train_mem_len"], meta["mem_len"], meta["clamp_len"], meta["same_length"]) == (4, 7, 3, True)
    for change in ({"same_length": False}, {"clamp_len": -1}):
        losses, _ = run_ours(model, tensors, meta | change)
        assert (losses - tensors["output.loss"]).abs().max() > 100 * TOLERANCE, change


def _paper_configs():
    return sorted(p for p in (ROOT / "configs/transformer_xl/paper").glob("*.yaml")
                  if not p.name.endswith(".eval.yaml"))


@pytest.mark.parametrize("path", _paper_configs(), ids=lambda p: p.stem)
def test_validation_memory_is_train_py(path):
    """train.py `evaluate`: with memory, validation uses eval_tgt_len and mem_len + tgt_len - eval_tgt_len; without
    (mem_len 0) the official lengthens ext_len instead, which eval_tgt_len = tgt_len makes 0."""
    cfg = yaml.safe_load(path.read_text())
    init, data = cfg["model"]["init_args"], cfg["data"]["init_args"]
    mem, tgt, eval_tgt = init["memory"]["mem_len"], data["tgt_len"], data["eval_tgt_len"]
    if mem == 0:
        assert eval_tgt == tgt and init["eval_memory"]["mem_len"] == 0
    else:
        assert init["eval_memory"]["mem_len"] == mem + tgt - eval_tgt
    assert init["eval_memory"]["clamp_len"] == -1 and init["eval_memory"]["same_length"] is False


def test_paper_parameter_counts_equal_official():
    """Every paper config builds (on the meta device) exactly as many parameters as the official
    `MemTransformerLM` with train.py's arguments for the same shape and vocabulary."""
    from repro.data.corpora import spec

    _, meta = load_fixture(FIXTURES / "params.pt")
    counts = meta["paper_param_counts"]
    assert sorted(counts) == [p.stem for p in _paper_configs()]
    for path in _paper_configs():
        cfg = yaml.safe_load(path.read_text())
        m = dict(cfg["model"]["init_args"]["model"])
        corpus = cfg["data"]["init_args"]["corpus"]
        n_token = spec(corpus).vocab_size
        assert n_token == counts[path.stem]["n_token"], path.stem
        if "cutoffs" in m:
            m["cutoffs"] = tuple(m["cutoffs"])
            assert [False, *m.get("tie_projs", [False] * len(m["cutoffs"]))[1:]] == counts[path.stem]["tie_projs"]
        if "tie_projs" in m:
            m["tie_projs"] = tuple(m["tie_projs"])
        with torch.device("meta"):
            model = TransformerXL(TransformerXLConfig(**m, n_token=n_token))
        assert sum(p.numel() for p in model.parameters()) == counts[path.stem]["official"], path.stem


def test_fixture_cases_parameter_counts():
    for case in CASES:
        tensors, meta, model = load(case)
        assert sum(p.numel() for p in model.parameters()) == meta["official_param_count"], case


def run_training(model: TransformerXL, tensors, meta, *, memory: bool = True):
    """Ours trained as our module steps it (`repro/lm.py`): per segment, forward with the memory carried, the mean
    NLL backward, the gradients accumulating (no optimizer step). The per-segment mean losses."""
    model.train()  # dropout 0 (build_ours)
    model.zero_grad(set_to_none=True)
    losses, mems = [], None
    for x, y in segments(tensors, meta):
        hidden, mems = model(x, mems if memory else None, mem_len=meta["mem_len"], clamp_len=meta["clamp_len"],
                             same_length=meta["same_length"])
        loss = model.nll(hidden, y).mean()
        loss.backward()
        losses.append(loss.detach())
    return torch.stack(losses)


def _gradient_pairs(model: TransformerXL, tensors) -> list[tuple[str, torch.Tensor | None, torch.Tensor]]:
    """(official name, our gradient, theirs) for every official parameter that got a gradient; asserts that every
    parameter of ours with a gradient is among them (tied parameters: theirs listed once, under either name)."""
    ours = dict(model.named_parameters(remove_duplicate=False))
    pairs, covered = [], set()
    for key in (k[len("grad."):] for k in tensors if k.startswith("grad.")):
        p = ours[ours_name(key)]
        pairs.append((key, p.grad, tensors[f"grad.{key}"]))
        covered.add(id(p))
    assert covered == {id(p) for p in model.parameters() if p.grad is not None}
    return pairs


@pytest.mark.parametrize("kernel", [*KERNELS, pytest.param("sdpa+compile", marks=pytest.mark.slow)])
@pytest.mark.parametrize("case", GRAD_CASES)
def test_training_gradients_equal_the_authors(case, kernel):
    """train.py's step (`loss = ret[0].float().mean(); loss.backward()`, the memory carried) over 4 segments against
    ours: every segment's mean loss and every parameter's accumulated gradient (relative to its largest entry where
    that exceeds 1) agree to 1e-4, and the parameters that get no gradient there get none here either; with either
    attention kernel, and compiled."""
    tensors, meta, model = load(case)
    with variant(model, kernel):
        losses = run_training(model, tensors, meta)
    torch.testing.assert_close(losses, tensors["output.loss_mean"], atol=TOLERANCE, rtol=TOLERANCE)
    pairs = _gradient_pairs(model, tensors)
    assert len(pairs) >= 20
    for key, ours, theirs in pairs:
        assert ours is not None, key
        scale = max(1.0, float(theirs.abs().max()))
        torch.testing.assert_close(ours / scale, theirs / scale, atol=TOLERANCE, rtol=TOLERANCE,
                                   msg=lambda m, key=key: f"{key}: {m}")
    named = dict(model.named_parameters(remove_duplicate=False))
    for key in meta["unused_parameters"]:
        name = ours_name(key)
        assert name is None or named[name].grad is None or not named[name].grad.any(), key


@pytest.mark.parametrize("case", GRAD_CASES)
def test_training_gradients_detect_a_forgotten_memory(case):
    """Without the memory carried between segments the gradients move far beyond the tolerance."""
    tensors, meta, model = load(case)
    run_training(model, tensors, meta, memory=False)
    moved = max(float(((torch.zeros_like(t) if o is None else o) - t).abs().max()) / max(1.0, float(t.abs().max()))
                for _, o, t in _gradient_pairs(model, tensors))
    assert moved > 100 * TOLERANCE, moved
