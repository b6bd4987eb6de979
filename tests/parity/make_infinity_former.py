"""Regenerate the ∞-former parity fixtures from a checkout of deep-spin/infinite-former:
`python tests/parity/make_infinity_former.py CHECKOUT`.

Follows the shared convention of `tests/parity/common.py`. The authors' three copies of `LongTermAttention` are
imported from CHECKOUT with run-time shims only (none of their code is copied here):
- `sorting/long_term_attention.py` (the sorting model's LTM), from the `sorting/` folder as their script does;
- `finetune_gpt2/src/transformers/models/gpt2/long_term_attention.py` (GPT-2 language modelling, Table 1) and
  `document_grounded_generation/transformers/src/transformers/models/gpt2/long_term_attention.py` (dialogue,
  Table 2): each folder is loaded as a stand-alone package (its relative imports `.basis_functions`, ... resolve
  inside it) without importing their patched `transformers`.
Shims: a stub `entmax` module (imported, used only by sparsemax, which no case runs); `self.device = 'cuda'` is
honoured on CPU by mapping the device 'cuda' to 'cpu' in `Tensor.to` while their constructor runs, then setting
the module's `device` to 'cpu'; the sorting module's `share_mask` (read, never set: the official defect) is set
to False, so that its CNN gate (`mask_type='cnn'`) is built as the sorting settings intend.

Each case builds their module with small shapes (d = H·E = 8, N = 16 basis functions, 16 vectors per update;
their hard-coded 512 samples of the old signal and τ, ridge and RBF widths of each copy), re-draws every weight
large (`enlarge_` with std 0.3: at 0.2, swapping two of the gate's biases moved the sorting output by only 98×
the tolerance), and runs fp32 over 4 steps (a first fit, then 3 unbounded-memory updates) with fixed random
memory vectors and queries. Saved per case (`tests/parity/infinity_former/<case>.pt`): their state dict
(`weight.*`), the inputs (`input.k`: (steps, B, L, d) batch-first; `input.q`: (steps, B, H, T, E)), and after each
step the output (`output.context`: (steps, B, T, d)), their KL term (`output.kl`: (steps, B, H·T)) and the carried
coefficients B (`output.B`: (steps, B, N, d), their `B_past`). Sticky cases also hold the sample points their
update drew (`output.sample_points`: (steps − 1, B, 512), recorded from their `batch_evaluate` calls) and the
bin probabilities they drew them from (`output.bin_probs`: (steps − 1, B, 128), recorded from the `Categorical`
they build), so that the test can feed the same points to our module.

The whole sorting model (`tests/parity/infinity_former/model_sorting.pt`, `make_sorting_model`): their
`sorting/mem_transformer.py` `MemTransformerLM` with the LTM at small sizes over 6 segments (logits, losses, KL
terms, gradients); shims as for the parameter counts below, and `augment = True` (read by their `_update_mems`,
never set). The whole GPT-2 models (`model_gpt2_lm.pt`, `model_gpt2_dialogue.pt`, `make_gpt2_model`): each copy's
`GPT2LMHeadModel` with the LTM (`finetune_gpt2`, `document_grounded_generation`) at tiny sizes over 7 blocks of
512 (per-token NLL, KL terms, gradients); shims as for the GPT-2 parameter counts below, and `get_head_mask` (gone
from the installed transformers). With sticky memories (`model_gpt2_lm_sticky.pt`, `model_gpt2_dialogue_sticky.pt`,
`make_gpt2_model(..., sticky=True)`): the same weights and blocks with their sticky configs; recorded through
`torch.distributions.Categorical` and their `update_inf` (`_record_sticky_draws`): the bins each update drew and
the probabilities it drew them from.

Parameter counts (`tests/parity/infinity_former/param_counts.pt`, `count_parameters`): the whole official models
built at the paper configs' settings, on the meta device (their `LongTermAttention` constructors, which iterate
over tensors, run on the CPU inside it). Sorting: `sorting/mem_transformer.py` `MemTransformerLM` with the
arguments of `run_sort_inftyformer.sh` (22 tokens, 3 layers, d_model 300, 6 × 50 heads, d_inner 300, segments and
augment_len 1024; N = 256 … 2048; without `long_term_attention` for Transformer-XL), called with its own signature
(their `train.py` passes `continuous_attention=` and `nfinite_memory=`, which the constructor does not accept);
shims: `torch.version.cuda` set while their `utils/proj_adaptive_softmax.py` is imported (it parses it), stub
modules `attention` and `long_term_attention_transformer` (imported by `mem_transformer.py`, absent
from the release, used by no setting here), `share_mask` as above. GPT-2: each copy's `modeling_gpt2.py`
`GPT2LMHeadModel` imported from the checkout as a package whose `...` imports (`activations`, `file_utils`,
`modeling_outputs`, `modeling_utils`, `utils`) are the installed `transformers`' modules (the docstring decorators
no-ops; `SequenceSummary`, `prune_conv1d_layer` & co., `model_parallel_utils`: stand-ins no GPT2LMHeadModel uses);
`init_weights` only ties the output layer to the input embedding (what it did in their transformers 4.5, without
drawing weights); `add_cross_attention=False` (a 4.5 config default). Language modelling: their config files
`finetune_gpt2/infinite_memory_transformer{,_sticky_mem}/config.json` (`run_clm.py --config_name`), the GPT-2
baseline the same without `long_term_attention` (= the hub's `gpt2`). Dialogue: `GPT2ConfigInftyFormer{,Sticky}`
(the `config_class` lines of their `modeling_gpt2.py`) with GPT-2 small's sizes and the 6 special tokens their
`train.py` adds (vocabulary 50,263). Also stored per model: the parameters it builds but never reads (checked on
the source: their name occurs once, at the definition): `qkv_net_` in every sorting layer, `proj_query` in every
`LongTermAttention`. The official code has no compressive transformer (sorting or GPT-2) and no sticky memories in
its sorting code.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from copy import deepcopy
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
# the shims the ∞-former benchmark uses too (`repro bench-infinity-former-authors`)
from papers.infinity_former.bench_authors import GPT2_DIRS, gpt2_shims
from papers.infinity_former.bench_authors import cuda_on_cpu as _cuda_on_cpu
from papers.infinity_former.bench_authors import load_official_gpt2 as _load_official_gpt2
from papers.infinity_former.bench_authors import sorting_modules as _sorting_modules
from papers.infinity_former.bench_authors import stub_entmax as _stub_entmax
from tests.parity.common import HERE, checkout_commit, enlarge_, on_path, save_fixture

OUT = HERE / "infinity_former"
H, E, N, L, T, STEPS = 2, 4, 16, 16, 5, 4
D = H * E

CASES = {
    # the sorting LTM: σ² ≥ 1e-6, widths (.01, .05), ridge 1, τ 0.75, KL without a μ term (mu_0 None)
    "sorting": dict(copy="sorting", batch=2, sticky=False),
    # GPT-2 language modelling (Table 1): σ² ≥ 1e-4, widths (.005, .01), ridge .5, τ .5, KL with mu_0 = −1
    "gpt2_lm": dict(copy="finetune_gpt2", batch=2, sticky=False, mu_0=-1.0),
    "gpt2_lm_sticky": dict(copy="finetune_gpt2", batch=2, sticky=True, mu_0=-1.0),
    # the σ² floor: the σ² affine scaled ×50 so that many queries fall below 1e-4 (clamped) and others do not
    "gpt2_lm_floor": dict(copy="finetune_gpt2", batch=2, sticky=False, mu_0=-1.0, sigma_scale=50.0),
    # document-grounded dialogue (Table 2): batch 1 (hard-coded there), KL without a μ term
    "dialogue": dict(copy="document_grounded_generation", batch=1, sticky=False),
    "dialogue_sticky": dict(copy="document_grounded_generation", batch=1, sticky=True),
}


def _load_gpt2_copy(checkout: Path, copy: str):
    """Their gpt2 model folder as a stand-alone package `_official_<copy>` (its long_term_attention module)."""
    folder = checkout / GPT2_DIRS[copy]
    name = f"_official_{copy}"
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(folder)]
    sys.modules[name] = pkg
    spec = importlib.util.spec_from_file_location(f"{name}.long_term_attention", folder / "long_term_attention.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _build(checkout: Path, case: dict):
    _stub_entmax()
    common = dict(head_size=E, length=L, target_len=L, attn_func="softmax", attn_num_basis=N, n_layers=1,
                  n_heads=H, kl_regularizer=True, sigma_0=0.05)
    if case["copy"] == "sorting":
        with on_path(checkout / "sorting"):
            import long_term_attention as lta

            lta.LongTermAttention.share_mask = False  # read by their constructor, never set (official defect)
            with _cuda_on_cpu():
                m = lta.LongTermAttention(**common, attn_drop=0.0, infinite_memory=True, d_model=D, mask=True,
                                          mask_type="cnn", mu_0=None)
            dist = None
    else:
        lta = _load_gpt2_copy(checkout, case["copy"])
        extra = dict(mask=True, sticky_memories=case["sticky"])
        if case["copy"] == "finetune_gpt2":
            extra.update(continuous=True, attn_drop=0.0, infinite_memory=True, affines=True, mask_type="cnn",
                         mask_dropout=0.0, mu_0=case["mu_0"])
        with _cuda_on_cpu():
            m = lta.LongTermAttention(**common, **extra)
        dist = lta.dist if case["sticky"] else None
    m.device = "cpu"
    return m, dist


def make_case(checkout: Path, name: str, case: dict, commit: str) -> None:
    torch.manual_seed(0)
    m, dist = _build(checkout, case)
    m.eval()
    enlarge_(m, std=0.3, seed=1)
    if "sigma_scale" in case:
        with torch.no_grad():
            m.sigma.weight.mul_(case["sigma_scale"])
    b = case["batch"]
    g = torch.Generator().manual_seed(2)
    k_all = torch.randn(STEPS, b, L, D, generator=g)
    q_all = torch.randn(STEPS, b, H, T, E, generator=g)

    points, probs = [], []
    if case["sticky"]:  # record the sample points and the bin probabilities their update draws from
        basis = m.psi[m.length][0]
        original_eval = basis.batch_evaluate
        basis.batch_evaluate = lambda t: (points[-1].append(t.clone()), original_eval(t))[1]
        original_cat = dist.Categorical

        class Recording(original_cat):
            def __init__(self, p=None, *args, **kwargs):
                if p is not None and p.dim() == 2 and p.shape[-1] == 128:
                    probs.append(p.detach().clone())
                super().__init__(p, *args, **kwargs)

        dist.Categorical = Recording
    contexts, kls, coefs = [], [], []
    torch.manual_seed(3)  # their sticky sampling draws from torch's global generator
    try:
        with torch.no_grad():
            for s in range(STEPS):
                if case["sticky"] and s:
                    points.append([])
                if case["copy"] == "sorting":  # time-first inputs, queries (qlen, B, H·E)
                    k = k_all[s].transpose(0, 1)
                    q = q_all[s].permute(2, 0, 1, 3).reshape(T, b, D)
                    context, kl = m(k, q, new_doc=(s == 0))
                    context = context.transpose(0, 1)
                elif case["copy"] == "finetune_gpt2":
                    context, kl = m(k_all[s], q_all[s])
                else:
                    context, kl = m(k_all[s], q_all[s], new_doc=(s == 0))
                contexts.append(context)
                kls.append(kl)
                coefs.append(m.B_past.clone())
    finally:
        if case["sticky"]:
            dist.Categorical = original_cat
            basis.batch_evaluate = original_eval
    tensors = {f"weight.{k}": v for k, v in m.state_dict().items()}
    tensors.update({"input.k": k_all, "input.q": q_all, "output.context": torch.stack(contexts),
                    "output.kl": torch.stack(kls), "output.B": torch.stack(coefs)})
    if case["sticky"]:
        tensors["output.sample_points"] = torch.stack([torch.stack(p) for p in points])
        tensors["output.bin_probs"] = torch.stack(probs)
    meta = {"repo": "deep-spin/infinite-former", "commit": commit, "case": name, "copy": case["copy"],
            "n_head": H, "d_head": E, "n_basis": N, "length": L, "queries": T, "steps": STEPS,
            "n_samples": m.nb_samples, "tau": m.tau, "ridge": m.ridge_penalty, "mu_0": case.get("mu_0"),
            "sticky": case["sticky"]}
    save_fixture(OUT / f"{name}.pt", tensors, meta)
    print(f"{name}: {sum(v.numel() for v in tensors.values())} numbers")


# ------------------------------------------------------------------------------------------ parameter counts

SORT_N_BASIS = (256, 512, 1024, 2048)
# parameters the official code builds and never reads: (source file, attribute) — checked to occur once
UNREAD = {
    "sorting": [("sorting/mem_transformer.py", "qkv_net_"), ("sorting/long_term_attention.py", "proj_query")],
    "finetune_gpt2": [(GPT2_DIRS["finetune_gpt2"] + "/long_term_attention.py", "proj_query")],
    "document_grounded_generation": [(GPT2_DIRS["document_grounded_generation"] + "/long_term_attention.py",
                                      "proj_query")],
}
GPT2_SIZES = ("vocab_size", "n_positions", "n_ctx", "n_embd", "n_layer", "n_head", "n_inner",
              "activation_function", "layer_norm_epsilon")


def _ltm_on_cpu(cls):
    """Their LTM constructor iterates over tensors (impossible on the meta device): run it on the CPU, once per
    argument set (seconds each on a loaded CPU); the other layers get a copy of that module's state."""
    if not getattr(cls.__init__, "_on_cpu", False):
        original = cls.__init__
        built = {}

        def init(self, *args, **kwargs):
            key = repr((args, sorted(kwargs.items())))
            if key not in built:
                with torch.device("cpu"):
                    original(self, *args, **kwargs)
                built[key] = self
            else:
                nn_init = torch.nn.Module.__init__
                nn_init(self)
                self.__dict__.update(deepcopy(built[key]).__dict__)

        init._on_cpu = True
        cls.__init__ = init


def _counts(model: torch.nn.Module, copy: str, checkout: Path) -> dict:
    unread = {}
    for path, attr in UNREAD[copy]:
        source = (checkout / path).read_text()
        if source.count(f".{attr}") != 1:
            raise SystemExit(f"{path}: `{attr}` is read somewhere now; recheck UNREAD")
        unread[attr] = sum(p.numel() for n, p in model.named_parameters() if f".{attr}." in f".{n}")
    total = sum(p.numel() for p in model.parameters())
    return {"total": total, "unread": unread, "used": total - sum(unread.values())}


# ------------------------------------------------------------------------------- the whole sorting model

# their `sorting/` MemTransformerLM with the LTM, at small sizes, in the official setting (segment = STM =
# augment_len = T): the LTM's first fit comes at segment 3, then one update per segment
MODEL = dict(n_token=22, n_layer=3, n_head=2, d_head=4, d_inner=16, tgt_len=8, n_basis=16, batch=2, segments=6,
             kl_weight=0.01, sigma_scale=5.0)


def make_sorting_model(checkout: Path, commit: str) -> None:
    """Their whole sorting model over MODEL["segments"] segments: logits, KL and the loss's gradients.

    Shims beyond `_sorting_modules`: `augment = True` (read by their `_update_mems`, never set: the official
    defect; True is the only reading under which their LTM receives anything), and their constructor called with
    its own signature. Every segment runs with `doc_final=True` (their output projection, which their loop applies
    to the last segment only; the memory does not depend on it), fp32, in eval mode (no dropout). The weights are
    drawn large (`enlarge_`), the σ² affines ×5 on top, so that σ² spans narrow and wide Gaussians. The gradient
    is that of Σ over segments of (their loss + kl_weight × their KL term's mean: 0.01 instead of their 1e-6, so
    that the KL's gradient is of the loss's size), each segment's graph ending at the detached memory, as in their
    loop."""
    m = MODEL
    t, d = m["tgt_len"], m["n_head"] * m["d_head"]
    with _sorting_modules(checkout) as (lta, mt):
        torch.manual_seed(0)
        with _cuda_on_cpu():
            model = mt.MemTransformerLM(
                m["n_token"], m["n_layer"], m["n_head"], d, m["d_head"], m["d_inner"], 0.0, 0.0, tie_weight=True,
                tgt_len=t, eval_tgt_len=t, ext_len=0, mem_len=t, attn_type=0, long_term_attention=True,
                long_term_attention_basis=m["n_basis"], long_term_attention_norm="softmax", infinite_memory=True,
                n_layers=m["n_layer"], augment_len=t, affines=True, mask=True, mask_type="cnn",
                kl_regularizer=True, sigma_0=0.05, mu_0=None)
        for module in model.modules():
            if isinstance(module, lta.LongTermAttention):
                module.device = "cpu"
        model.augment = True
        model.eval()
        enlarge_(model, std=0.2, seed=1)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, lta.LongTermAttention):
                    module.sigma.weight.mul_(m["sigma_scale"])
        g = torch.Generator().manual_seed(2)
        stream = torch.randint(0, m["n_token"], (m["segments"] * t, m["batch"]), generator=g)
        target = torch.randint(0, m["n_token"], (m["segments"] * t, m["batch"]), generator=g)  # 21 = pad: ignored
        logits, kls, losses, mems, total = [], [], [], [], 0.0
        for s in range(m["segments"]):
            x, y = stream[s * t:(s + 1) * t], target[s * t:(s + 1) * t]
            ret, pred, _, kl = model(x, y, *mems, doc_final=True)
            loss, mems = ret[0], ret[1:]
            logits.append(pred.detach().view(t, m["batch"], -1).transpose(0, 1))
            losses.append(loss.detach())
            kls.append(kl.detach() if kl is not None else torch.zeros(m["batch"], m["n_head"] * t))
            total = total + loss + (m["kl_weight"] * kl.mean() if kl is not None else 0.0)
        total.backward()
    tensors = {f"weight.{k}": v for k, v in model.state_dict().items()}
    tensors.update({f"grad.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    tensors.update({"input.stream": stream, "input.target": target, "output.logits": torch.stack(logits),
                    "output.loss": torch.stack(losses), "output.kl": torch.stack(kls)})
    meta = {"repo": "deep-spin/infinite-former", "commit": commit, "case": "model_sorting", **m,
            "d_model": d, "n_samples": 512, "tau": 0.75, "ridge": 1.0, "widths": [0.01, 0.05], "sigma_0": 0.05,
            "min_var": 1e-6, "pad": 21, "ltm_first_segment": 2}
    save_fixture(OUT / "model_sorting.pt", tensors, meta)
    print(f"model_sorting: {sum(v.numel() for v in tensors.values())} numbers")


# their GPT2LMHeadModel with the LTM, tiny: the LTM's length 512 is hard-coded there, so blocks of 512 tokens;
# 7 blocks = no memory, a first fit, 3 updates, then (language modelling) their memory threshold of 2,048 tokens
# empties the memory: a first fit again and an update
GPT2_MODEL = dict(n_layer=2, n_embd=8, n_head=2, vocab_size=64, n_basis=16, block=512, blocks=7, kl_weight=1e-3,
                  out_scale=100.0)


def make_gpt2_model(checkout: Path, commit: str, copy: str, sticky: bool = False) -> None:
    """Their whole GPT-2 with the LTM at tiny sizes, no dropout, over GPT2_MODEL["blocks"] blocks fed one after the
    other as their training loops do (each `Block` keeps its input, or ln_1 of it, as `self.mem`; each LTM its
    coefficients): per block the per-token NLL and their KL terms, then the gradients of Σ over blocks of (their
    loss + kl_weight × their KL's mean). `copy`: `finetune_gpt2` (language modelling, Table 1: their
    `infinite_memory_transformer/config.json`) or `document_grounded_generation` (dialogue, Table 2: their
    `GPT2ConfigInftyFormer`; the blocks are one conversation's pieces, with their `train.py`'s flags: `new_doc` on the
    second piece, the first to read the memory, `last_doc` on the last). Shims beyond `_load_official_gpt2`
    (`gpt2_shims`): `init_weights` ties the output layer only, `get_head_mask` gives no mask (both gone from the
    installed transformers). Weights large (`enlarge_`),
    the LTM's output projection ×out_scale on top, so that the memory moves the NLL far beyond the tolerance.

    `sticky`: the same model and blocks with their sticky memories (their `infinite_memory_transformer_sticky_mem`
    config / `GPT2ConfigInftyFormerSticky`; sticky memories add no parameter, and the weights are asserted equal to
    the linear fixture's, which the test reads). Recorded per layer and update: the bins their update drew (their
    points are the bins' left edges, stored as bin numbers) and the bin probabilities they drew from; the outputs,
    no gradients (the draws are not differentiable; the linear fixture checks the backward pass)."""
    import json

    m = GPT2_MODEL
    _stub_entmax()
    modeling, root = _load_official_gpt2(checkout, copy)
    lm = copy == "finetune_gpt2"
    if lm:
        config_class = importlib.import_module(f"{root}.models.gpt2.configuration_gpt2").GPT2Config
        folder = "infinite_memory_transformer_sticky_mem" if sticky else "infinite_memory_transformer"
        settings = json.loads((checkout / "finetune_gpt2" / folder / "config.json").read_text())
        for key in ("architectures", "_name_or_path", "transformers_version", "task_specific_params", "model_type"):
            settings.pop(key, None)
        settings.update(attn_drop=0.0)
    else:
        config_class = importlib.import_module(
            f"{root}.models.gpt2.configuration_gpt2_inftyformer_sticky").GPT2ConfigInftyFormerSticky if sticky else \
            importlib.import_module(f"{root}.models.gpt2.configuration_gpt2_inftyformer").GPT2ConfigInftyFormer
        settings = {}
    settings.update(n_layer=m["n_layer"], n_embd=m["n_embd"], n_head=m["n_head"], vocab_size=m["vocab_size"],
                    n_positions=m["block"], n_ctx=m["block"], long_term_attention_basis=m["n_basis"],
                    attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    try:
        with gpt2_shims():
            torch.manual_seed(0)
            with _cuda_on_cpu():
                model = modeling.GPT2LMHeadModel(config_class(add_cross_attention=False, **settings))
            for module in model.modules():
                if isinstance(module, modeling.LongTermAttention):
                    module.device = "cpu"
            model.eval()
            enlarge_(model, std=0.2, seed=1)
            with torch.no_grad():  # the LTM's output ×out_scale: at std 0.2 it moved the NLL by only ~1e-3
                for module in model.modules():
                    if isinstance(module, modeling.LongTermAttention):
                        module.attn_out.weight.mul_(m["out_scale"])
            g = torch.Generator().manual_seed(2)
            tokens = torch.randint(0, m["vocab_size"], (m["blocks"], 1, m["block"]), generator=g)
            ltms = [x for x in model.modules() if isinstance(x, modeling.LongTermAttention)]
            assert all(x.sticky_memories == sticky for x in ltms)
            bins, probs = [[] for _ in ltms], [[] for _ in ltms]
            if sticky:
                _record_sticky_draws(ltms, bins, probs)
                torch.manual_seed(3)  # their sticky sampling draws from torch's global generator
            nlls, kls, total = [], [], 0.0
            for s in range(m["blocks"]):
                flags = {} if lm else dict(new_doc=s == 1, last_doc=s == m["blocks"] - 1)
                out, kl = model(input_ids=tokens[s], labels=tokens[s], return_dict=True, **flags)
                logp = torch.log_softmax(out.logits[:, :-1].float(), -1)
                nlls.append(-logp.gather(-1, tokens[s][:, 1:, None])[..., 0].detach())
                kls.append(kl.detach() if kl is not None else torch.zeros(1, m["n_head"] * m["block"]))
                total = total + out.loss + (m["kl_weight"] * kl.mean() if kl is not None else 0.0)
            if not sticky:
                total.backward()
    finally:
        torch.distributions.Categorical = _CATEGORICAL
    tensors = {f"weight.{k}": v for k, v in model.state_dict().items()
               if k != "lm_head.weight" and not k.endswith((".attn.bias", ".attn.masked_bias"))}  # tied; buffers
    tensors.update({f"grad.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None})
    tensors.update({"input.tokens": tokens, "output.nll": torch.stack(nlls), "output.kl": torch.stack(kls)})
    name = "model_gpt2_lm" if lm else "model_gpt2_dialogue"
    if sticky:  # the linear fixture's weights and tokens (written first, by the same draws)
        from tests.parity.common import load_fixture

        linear, _ = load_fixture(OUT / f"{name}.pt")
        for key, value in tensors.items():
            if key.startswith(("weight.", "input.")):
                assert torch.equal(value, linear[key]), key
        tensors = {"output.nll": tensors["output.nll"], "output.kl_mean": tensors["output.kl"].mean(dim=(1, 2))}
        for i, (b, p) in enumerate(zip(bins, probs)):
            assert len(b) == len(p) and b, f"layer {i}: {len(b)} draws recorded, {len(p)} histograms"
            tensors[f"output.bins.{i}"] = torch.stack(b).to(torch.uint8)  # (updates, B, samples): bin numbers
            tensors[f"output.bin_probs.{i}"] = torch.stack(p)  # (updates, B, 128)
        name += "_sticky"
    meta = {"repo": "deep-spin/infinite-former", "commit": commit, "case": name, "copy": copy, **m,
            "mu_0": settings["mu_0"] if lm else None, "sigma_0": 0.05, "stores": "block_input" if lm else "ln_1",
            "threshold": next(x.mem_threshold for x in model.modules() if isinstance(x, modeling.LongTermAttention))
            if lm else None,  # their hard-coded mem_threshold (the dialogue copy has none: reset per conversation)
            "n_samples": 512, "tau": 0.5, "ridge": 0.5, "widths": [0.005, 0.01], "min_var": 1e-4}
    save_fixture(OUT / f"{name}.pt", tensors, meta)
    print(f"{name}: {sum(v.numel() for v in tensors.values())} numbers")


_CATEGORICAL = torch.distributions.Categorical


def _record_sticky_draws(ltms: list, bins: list, probs: list) -> None:
    """Record, per LTM (layer) and update, the bins their `update_inf` draws (`p.sample`: (samples, B)) and the bin
    probabilities it draws them from, through `torch.distributions.Categorical` (restored by the caller)."""
    current = [None]

    class Recording(_CATEGORICAL):
        def __init__(self, probs_=None, *args, **kwargs):
            super().__init__(probs_, *args, **kwargs)
            self.record = current[0] is not None and probs_ is not None and probs_.shape[-1] == 128

        def sample(self, shape=torch.Size()):
            out = super().sample(shape)
            if self.record:
                probs[current[0]].append(self.probs.detach().clone())
                bins[current[0]].append(out.T.clone())  # (B, samples)
            return out

    torch.distributions.Categorical = Recording
    for i, x in enumerate(ltms):
        def update_inf(inp, i=i, original=x.update_inf):
            current[0] = i
            try:
                return original(inp)
            finally:
                current[0] = None

        x.update_inf = update_inf


def _sorting_counts(checkout: Path) -> dict:
    out = {}
    with _sorting_modules(checkout) as (lta, mt):
        _ltm_on_cpu(lta.LongTermAttention)
        base = dict(n_token=22, n_layer=3, n_head=6, d_model=300, d_head=50, d_inner=300, dropout=0.1, dropatt=0.0,
                    tie_weight=True, tgt_len=1024, eval_tgt_len=1024, ext_len=0, attn_type=0)
        settings = {"sorting_txl": dict(mem_len=2048)}
        for n in SORT_N_BASIS:
            settings[f"sorting_infty_n{n}"] = dict(
                mem_len=1024, long_term_attention=True, long_term_attention_basis=n, long_term_attention_norm="softmax",
                infinite_memory=True, n_layers=3, augment_len=1024, affines=True, mask=True, mask_type="cnn",
                kl_regularizer=True, sigma_0=0.05)
        for key, extra in settings.items():
            with _cuda_on_cpu(), torch.device("meta"):
                model = mt.MemTransformerLM(**base, **extra)
            out[key] = _counts(model, "sorting", checkout)
    return out


def _gpt2_counts(checkout: Path) -> dict:
    import json

    _stub_entmax()
    lm_json = {name: json.loads((checkout / "finetune_gpt2" / name / "config.json").read_text())
               for name in ("infinite_memory_transformer", "infinite_memory_transformer_sticky_mem")}
    small = {k: lm_json["infinite_memory_transformer"][k] for k in GPT2_SIZES}  # the hub's gpt2 sizes
    out = {}
    with gpt2_shims():  # init_weights draws nothing (not needed for a count) and ties the output layer
        for copy in ("finetune_gpt2", "document_grounded_generation"):
            modeling, root = _load_official_gpt2(checkout, copy)
            _ltm_on_cpu(modeling.LongTermAttention)

            def config(module_name, cls, **kwargs):
                return getattr(importlib.import_module(f"{root}.models.gpt2.{module_name}"), cls)(
                    add_cross_attention=False, **kwargs)

            if copy == "finetune_gpt2":
                configs = {
                    "lm_gpt2": config("configuration_gpt2", "GPT2Config",
                                      **dict(lm_json["infinite_memory_transformer"], long_term_attention=False)),
                    "lm_inftyformer": config("configuration_gpt2", "GPT2Config",
                                             **lm_json["infinite_memory_transformer"]),
                    "lm_inftyformer_sticky": config("configuration_gpt2", "GPT2Config",
                                                    **lm_json["infinite_memory_transformer_sticky_mem"]),
                }
            else:
                dialogue = dict(small, vocab_size=small["vocab_size"] + 6)  # train.py's 6 special tokens
                configs = {
                    "dialogue_gpt2": config("configuration_gpt2", "GPT2Config", **dialogue),
                    "dialogue_inftyformer": config("configuration_gpt2_inftyformer", "GPT2ConfigInftyFormer",
                                                   **dialogue),
                    "dialogue_inftyformer_sticky": config("configuration_gpt2_inftyformer_sticky",
                                                          "GPT2ConfigInftyFormerSticky", **dialogue),
                }
            for key, cfg in configs.items():
                with _cuda_on_cpu(), torch.device("meta"):
                    model = modeling.GPT2LMHeadModel(cfg)
                out[key] = _counts(model, copy, checkout)
    return out


def count_parameters(checkout: Path, commit: str) -> None:
    counts = _sorting_counts(checkout) | _gpt2_counts(checkout)
    tensors = {f"count.{k}.{part}": torch.tensor(v[part]) for k, v in counts.items() for part in ("total", "used")}
    meta = {"repo": "deep-spin/infinite-former", "commit": commit, "counts": counts,
            "unread": {copy: [attr for _, attr in pairs] for copy, pairs in UNREAD.items()}}
    save_fixture(OUT / "param_counts.pt", tensors, meta)
    for key, v in counts.items():
        print(f"{key}: {v['total']:,} built, {v['used']:,} used")


def main() -> None:
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--counts-only"):
        raise SystemExit("usage: python tests/parity/make_infinity_former.py /path/to/infinite-former [--counts-only]")
    checkout = Path(sys.argv[1]).resolve()
    commit = checkout_commit(checkout)
    if len(sys.argv) == 2:
        for name, case in CASES.items():
            make_case(checkout, name, case, commit)
        make_sorting_model(checkout, commit)
        make_gpt2_model(checkout, commit, "finetune_gpt2")
        make_gpt2_model(checkout, commit, "document_grounded_generation")
        make_gpt2_model(checkout, commit, "finetune_gpt2", sticky=True)
        make_gpt2_model(checkout, commit, "document_grounded_generation", sticky=True)
    count_parameters(checkout, commit)


if __name__ == "__main__":
    main()
