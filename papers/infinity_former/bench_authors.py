"""The ∞-former's cost against the authors' code, whole models side by side: `repro bench-infinity-former-authors`.

Follows `repro.ops.sidebyside` (the codes in one process, taking turns within each round, tokens/s per round), as
`repro bench-mgk-authors` does, with the whole model of Figure 3: the official `MemTransformerLM` with the long-term
memory (deep-spin/infinite-former `sorting/mem_transformer.py` and `long_term_attention.py`, imported from a
checkout) and ours (`papers.infinity_former.model.InfinityFormer`), both built from one sorting config (`--config`;
default the paper's `sort_8000_infty`: 3 layers of 300, 6 heads of 50, inner 300, dropout 0.1, segment = short-term
memory = 1,024, N = 1,024 basis functions, 512 update samples, batch 8). Theirs takes N from the config; its other
LTM settings are hard-coded (τ 0.75, ridge 1, widths 0.01/0.05, 512 samples: the paper config's values).

One timed step is one training sequence as the official loop (`sorting/train.py`) runs it: an example of L symbols,
the separator and the sorted output (L + 20 tokens) cut into segments; every segment but the last forward under
`no_grad` with the memory carried (the LTM absorbing each), the last forward with gradients and the loss over the
20 sorted outputs + λ_KL × the KL term backward. Not timed: the optimizer (theirs steps after every segment, ours
once per sequence: README) and the data. Tokens/s counts every token of the sequence. Same random tokens for both.

`--model gpt2_lm`: Table 1's model instead, the official `finetune_gpt2` `GPT2LMHeadModel` with the LTM (their
`infinite_memory_transformer/config.json`: GPT-2 small, N = 512 in every layer, their 2,048-token threshold) and
ours (`GPT2WithMemory` behind the memory hook, from `--config`, default `gpt2_wt103_inftyformer.yaml`), both at
random weights (GPT-2 small's shapes; their `_init_weights`), blocks of 512 tokens, batch 1 (the paper's); one
step = one block forward and backward (loss + λ_KL × KL), the memory carried from block to block as their
`run_clm.py` and our module carry it.

Three codes take turns: theirs as released, which runs with autograd's anomaly detection (their
`continuous_softmax.py` and `continuous_sparsemax.py` turn it on at import), theirs without it, and ours.

Run-time shims only (`sorting_modules`, `official_sorting_model`, `load_official_gpt2`, `gpt2_shims`;
tests/parity/make_infinity_former.py uses the same): `entmax` and two modules that `mem_transformer.py` imports but
the release lacks are stand-ins; `torch.version.cuda` is set while importing (read by their adaptive softmax,
`sidebyside.checkout_on_path`); `LongTermAttention.share_mask = False` and the model's `augment = True` (read, never
set: the official defects the README lists); on a CPU their constructors' `.to('cuda')` is mapped to the CPU and
their LTM's `device` attribute set to it. GPT-2: their `modeling_gpt2.py` (transformers 4.5) with its relative
imports answered by the installed `transformers`, `init_weights` tying the output layer only (their `_init_weights`
applied after) and `get_head_mask` giving no mask (both gone from the installed library). `--device cuda` puts both
models on a GPU (the clock read with its queue drained; peak memory per code).
"""

from __future__ import annotations

import importlib
import itertools
import json
import statistics
import sys
import types
import warnings
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
import yaml

from papers.infinity_former.gpt2 import PRETRAINED_SHAPES, GPT2Settings, GPT2WithMemory
from papers.infinity_former.hooks import MemoryHook
from papers.infinity_former.ltm import LTMConfig
from papers.infinity_former.model import InfinityFormer
from papers.transformer_xl.model import TransformerXLConfig
from repro.ops import sidebyside
from repro.ops.sidebyside import per_round
from repro.ops.timing import autocast

PROG = "repro bench-infinity-former-authors"

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "configs" / "infinity_former" / "paper" / "sort_8000_infty.yaml"
N_TOKEN, PAD, N_SYMBOLS = 22, 21, 20  # 20 symbols, the separator, the pad (repro.data.sorting)


@contextmanager
def cuda_on_cpu():
    """Their constructors move tensors `.to('cuda')`: map that device to the CPU while they run."""
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)
        if isinstance(kwargs.get("device"), str) and kwargs["device"].startswith("cuda"):
            kwargs["device"] = "cpu"
        return original(self, *args, **kwargs)

    torch.Tensor.to = to
    try:
        yield
    finally:
        torch.Tensor.to = original


def stub_entmax() -> None:
    """`entmax` (imported by their continuous attention, used only by the sparsemax settings) as a stand-in."""
    if "entmax" not in sys.modules:
        stub = types.ModuleType("entmax")
        for name in ("Sparsemax", "Entmax15", "EntmaxBisect"):
            setattr(stub, name, type(name, (), {}))
        sys.modules["entmax"] = stub


@contextmanager
def sorting_modules(checkout: Path):
    """Their `sorting/` modules (`long_term_attention`, `mem_transformer`) importable inside the block, forgotten
    after it (`sidebyside.checkout_on_path`: a Transformer-XL or LaMemo checkout has modules of the same names),
    with stand-ins for `entmax` and for the two modules `mem_transformer.py` imports but the release lacks."""
    with sidebyside.checkout_on_path(PROG, checkout, repository="deep-spin/infinite-former",
                                     folders=("sorting", "sorting/utils"), module="mem_transformer"):
        stub_entmax()
        stubs = ("attention", "long_term_attention_transformer")
        for name in stubs:
            stub = types.ModuleType(name)
            stub.ContinuousAttention = stub.LongTermAttentionTransformer = None
            sys.modules[name] = stub
        anomaly = torch.is_anomaly_enabled()  # their continuous_softmax.py turns anomaly detection on at import
        try:
            lta = importlib.import_module("long_term_attention")
            mt = importlib.import_module("mem_transformer")
            lta.LongTermAttention.share_mask = False  # read by their constructor, never set (official defect)
            yield lta, mt
        finally:
            torch.autograd.set_detect_anomaly(anomaly)
            for name in stubs:
                sys.modules.pop(name, None)


def official_sorting_model(lta, mt, *, n_layer: int, n_head: int, d_head: int, d_inner: int, dropout: float,
                           dropatt: float, tgt_len: int, mem_len: int, n_basis: int, device: str = "cpu"):
    """Their `MemTransformerLM` with the LTM as `sorting/run_sort_inftyformer.sh` builds it (affines, CNN mask,
    KL regulariser, σ₀ 0.05, augment_len = segment, unbounded memory), with N = `n_basis`, on `device`."""
    d_model = n_head * d_head
    building = cuda_on_cpu() if torch.device(device).type == "cpu" else nullcontext()
    with building, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.meshgrid", category=UserWarning)  # their basis grid
        model = mt.MemTransformerLM(
            N_TOKEN, n_layer, n_head, d_model, d_head, d_inner, dropout, dropatt, tie_weight=True, tgt_len=tgt_len,
            eval_tgt_len=tgt_len, ext_len=0, mem_len=mem_len, attn_type=0, long_term_attention=True,
            long_term_attention_basis=n_basis, long_term_attention_norm="softmax", infinite_memory=True,
            n_layers=n_layer, augment_len=tgt_len, affines=True, mask=True, mask_type="cnn", kl_regularizer=True,
            sigma_0=0.05, mu_0=None)
    for module in model.modules():
        if isinstance(module, lta.LongTermAttention):
            module.device = str(device)
    model.augment = True  # read by their `_update_mems`, never set (official defect)
    init_as_train_py(model)
    return model.to(device)


def init_as_train_py(model: torch.nn.Module, std: float = 0.02, proj_std: float = 0.01) -> None:
    """The initialisation `sorting/train.py` applies (`model.apply(weights_init)`, its defaults `--init normal
    --init_std 0.02 --proj_init_std 0.01`): their constructor leaves some tensors uninitialised (`torch.Tensor(...)`
    biases). By module class name, as theirs: Linear weights N(0, std) and biases 0; embeddings N(0, std) (adaptive
    ones' projections N(0, proj_std)); the adaptive softmax's cluster weights N(0, std), biases 0, projections
    N(0, proj_std); LayerNorm weights N(1, std), biases 0; the model's relative-position biases N(0, std). Other
    modules (their LTM's convolution) keep PyTorch's defaults."""
    nn = torch.nn.init
    with torch.no_grad():
        for m in model.modules():
            kind = type(m).__name__
            if "Linear" in kind:
                if getattr(m, "weight", None) is not None:
                    nn.normal_(m.weight, 0.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.zeros_(m.bias)
            elif "AdaptiveEmbedding" in kind:
                for proj in getattr(m, "emb_projs", []):
                    if proj is not None:
                        nn.normal_(proj, 0.0, proj_std)
            elif "Embedding" in kind:
                if getattr(m, "weight", None) is not None:
                    nn.normal_(m.weight, 0.0, std)
            elif "ProjectedAdaptiveLogSoftmax" in kind:
                if getattr(m, "cluster_weight", None) is not None:
                    nn.normal_(m.cluster_weight, 0.0, std)
                if getattr(m, "cluster_bias", None) is not None:
                    nn.zeros_(m.cluster_bias)
                for proj in getattr(m, "out_projs", []):
                    if proj is not None:
                        nn.normal_(proj, 0.0, proj_std)
            elif "LayerNorm" in kind:
                if getattr(m, "weight", None) is not None:
                    nn.normal_(m.weight, 1.0, std)
                if getattr(m, "bias", None) is not None:
                    nn.zeros_(m.bias)
            elif "TransformerLM" in kind:
                for name in ("r_emb", "r_w_bias", "r_r_bias"):
                    if getattr(m, name, None) is not None:
                        nn.normal_(getattr(m, name), 0.0, std)
                if getattr(m, "r_bias", None) is not None:
                    nn.zeros_(m.r_bias)


GPT2_DIRS = {  # the two copies of their modified transformers 4.5 GPT-2 (Table 1, Table 2)
    "finetune_gpt2": "finetune_gpt2/src/transformers/models/gpt2",
    "document_grounded_generation": "document_grounded_generation/transformers/src/transformers/models/gpt2",
}
DEFAULT_GPT2_CONFIG = ROOT / "configs" / "infinity_former" / "paper" / "gpt2_wt103_inftyformer.yaml"


def load_official_gpt2(checkout: Path, copy: str):
    """Their `modeling_gpt2.py` (`copy`: a key of GPT2_DIRS) with its `...` imports answered by the installed
    `transformers`; returns (the module, the package root it was imported under)."""
    # transformers is imported for --model gpt2_lm only: seconds that the sorting model does not need
    import transformers.activations  # heavy: transformers
    import transformers.configuration_utils  # heavy: transformers
    import transformers.modeling_outputs  # heavy: transformers
    import transformers.modeling_utils  # heavy: transformers
    import transformers.pytorch_utils  # heavy: transformers
    import transformers.utils  # heavy: transformers

    folder = Path(checkout) / GPT2_DIRS[copy]
    if not (folder / "modeling_gpt2.py").is_file():
        raise SystemExit(f"{PROG}: {checkout} has no {GPT2_DIRS[copy]}/modeling_gpt2.py; "
                         "pass a checkout of deep-spin/infinite-former with --checkout")

    def decorator(*args, **kwargs):
        return lambda f: f

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        m.__path__ = []
        sys.modules[name] = m
        return m

    stub_entmax()
    transformers.utils.logging.set_verbosity_error()  # their 4.5 code against today's library: deprecation chatter
    root = f"_official_hf_{copy}"
    module(root)
    module(f"{root}.activations", ACT2FN=transformers.activations.ACT2FN)
    module(f"{root}.file_utils", ModelOutput=transformers.utils.ModelOutput, add_code_sample_docstrings=decorator,
           add_start_docstrings=decorator, add_start_docstrings_to_model_forward=decorator,
           replace_return_docstrings=decorator)
    module(f"{root}.modeling_outputs", **{k: getattr(transformers.modeling_outputs, k) for k in (
        "BaseModelOutputWithPastAndCrossAttentions", "CausalLMOutputWithCrossAttentions",
        "SequenceClassifierOutputWithPast")})
    module(f"{root}.modeling_utils", Conv1D=transformers.pytorch_utils.Conv1D,
           PreTrainedModel=transformers.modeling_utils.PreTrainedModel, SequenceSummary=torch.nn.Module,
           find_pruneable_heads_and_indices=None, prune_conv1d_layer=None)
    module(f"{root}.configuration_utils", PretrainedConfig=transformers.configuration_utils.PretrainedConfig)
    module(f"{root}.utils", logging=transformers.utils.logging)
    module(f"{root}.utils.model_parallel_utils", assert_device_map=None, get_device_map=None)
    module(f"{root}.models")
    module(f"{root}.models.gpt2").__path__ = [str(folder)]
    return importlib.import_module(f"{root}.models.gpt2.modeling_gpt2"), root


@contextmanager
def gpt2_shims():
    """While their GPT-2 is built: `init_weights` (transformers 4.5's name) ties the output layer to the input
    embedding and draws nothing; `get_head_mask` gives no mask (both gone from the installed transformers)."""
    import transformers.modeling_utils  # heavy: transformers

    pretrained = transformers.modeling_utils.PreTrainedModel
    saved = pretrained.init_weights, getattr(pretrained, "get_head_mask", None)

    def init_weights(self):
        out_emb, in_emb = self.get_output_embeddings(), self.get_input_embeddings()
        if out_emb is not None and in_emb is not None:
            out_emb.weight = in_emb.weight

    pretrained.init_weights = init_weights
    pretrained.get_head_mask = lambda self, head_mask, n: [None] * n if head_mask is None else head_mask
    try:
        yield
    finally:
        pretrained.init_weights = saved[0]
        if saved[1] is None:
            del pretrained.get_head_mask
        else:
            pretrained.get_head_mask = saved[1]


def official_gpt2_lm(checkout: Path, device: str = "cpu"):
    """Their Table 1 model as `run_clm.py --config_name infinite_memory_transformer` builds it, weights drawn by their
    `_init_weights`, on `device`."""
    modeling, root = load_official_gpt2(checkout, "finetune_gpt2")
    config_class = importlib.import_module(f"{root}.models.gpt2.configuration_gpt2").GPT2Config
    config_json = Path(checkout) / "finetune_gpt2" / "infinite_memory_transformer" / "config.json"
    settings = json.loads(config_json.read_text())
    for key in ("architectures", "_name_or_path", "transformers_version", "task_specific_params", "model_type"):
        settings.pop(key, None)
    building = cuda_on_cpu() if torch.device(device).type == "cpu" else nullcontext()
    with gpt2_shims(), building, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.meshgrid", category=UserWarning)  # their basis grid
        model = modeling.GPT2LMHeadModel(config_class(add_cross_attention=False, **settings))
        model.apply(model._init_weights)
    # the forward passes ask for a head mask too: the same shim on the instance, outliving the block above
    model.transformer.get_head_mask = lambda head_mask, n: [None] * n if head_mask is None else head_mask
    for module in model.modules():
        if isinstance(module, modeling.LongTermAttention):
            module.device = str(device)
    return model.to(device), settings


def our_gpt2_lm(path: Path, device: str):
    """Ours from a GPT-2 config (`configs/infinity_former/*/gpt2_*.yaml`) at GPT-2 small's shapes, random weights."""
    # imports Lightning and transformers: for --model gpt2_lm only
    init = yaml.safe_load(Path(path).read_text())["model"]["init_args"]
    if (init.get("memory_hook") or {}).get("kind") != "ltm":
        raise SystemExit(f"{PROG}: {path} is not an ∞-former GPT-2 config "
                         "(model.init_args.memory_hook.kind: ltm)")
    m = init.get("model") or {}
    settings = GPT2Settings(pretrained=None, dropout=m.get("dropout", 0.1), **PRETRAINED_SHAPES["gpt2"])
    return GPT2WithMemory(settings, MemoryHook(**init["memory_hook"]), n_token=50257).to(device), init


def gpt2_blocks(n: int, block: int, device: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 50257, (1, block), generator=g).to(device) for _ in range(n)]


def read_config(path: Path) -> dict:
    """The sorting settings of a config (`configs/infinity_former/*/sort_*_infty*.yaml`)."""
    cfg = yaml.safe_load(Path(path).read_text())
    init = cfg["model"]["init_args"]
    if init.get("backbone") != "infinity_former" or not init.get("ltm"):
        raise SystemExit(f"{PROG}: {path} is not an ∞-former sorting config "
                         "(model.init_args.backbone: infinity_former with an ltm block)")
    data = cfg["data"]["init_args"]
    return {"model": init["model"], "ltm": init["ltm"], "mem_len": init["memory"]["mem_len"],
            "length": data["length"], "batch": data["batch_size"], "tgt_len": data["tgt_len"]}


def our_sorting_model(c: dict, device: str):
    m = c["model"]
    cfg = TransformerXLConfig(n_layer=m["n_layer"], d_model=m["d_model"], n_head=m["n_head"], d_head=m["d_head"],
                              d_inner=m["d_inner"], n_token=N_TOKEN, dropout=m["dropout"], dropatt=m["dropatt"],
                              cutoffs=(), tie_weight=m.get("tie_weight", False))
    ltm = dict(c["ltm"])
    ltm["widths"] = tuple(ltm["widths"])
    return InfinityFormer(cfg, LTMConfig(**ltm)).to(device)


def sequence(c: dict, batch: int, device: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One group of `batch` examples as (input, target) segments (B, ≤ T): random symbols, the separator, 19 sorted
    outputs as input; PAD over the sequence and the 20 outputs as target (repro.data.sorting's layout)."""
    g = torch.Generator().manual_seed(0)
    body = torch.randint(0, N_SYMBOLS, (batch, c["length"]), generator=g)
    out = torch.sort(torch.randint(0, N_SYMBOLS, (batch, N_SYMBOLS), generator=g), -1, descending=True).values
    inp = torch.cat([body, torch.full((batch, 1), N_SYMBOLS), out[:, :-1]], 1)
    tgt = torch.cat([torch.full((batch, c["length"]), PAD), out], 1)
    t = c["tgt_len"]
    return [(inp[:, i:i + t].to(device), tgt[:, i:i + t].to(device)) for i in range(0, inp.shape[1], t)]


def step_theirs(model, segments, kl_weight: float) -> None:
    """`sorting/train.py`'s sequence: no_grad segments, then the last with (loss + kl_m × KL mean).backward()."""
    mems: tuple = ()
    for j, (x, y) in enumerate(segments):
        final = j == len(segments) - 1
        with nullcontext() if final else torch.no_grad():
            ret, _, _, kl = model(x.T.contiguous(), y.T.contiguous(), *mems, doc_final=final)
        loss, mems = ret[0], ret[1:]
        if final:
            (loss + kl_weight * kl.float().mean().type_as(loss) if kl is not None else loss).backward()


def step_ours(model, segments, mem_len: int) -> list:
    """`papers.infinity_former.module.SortingLM.training_step` over one group, without the optimizer; returns the
    memories after the last segment."""
    mems = None
    for j, (x, y) in enumerate(segments):
        scored = bool((y != PAD).any())
        if not scored and j < len(segments) - 1:
            with torch.no_grad():
                _, mems = model(x, mems, mem_len=mem_len)
            continue
        h, mems = model(x, mems, mem_len=mem_len)
        mask = y != PAD
        loss = model.nll(h[mask][None], y[mask][None]).sum() / (N_SYMBOLS * x.shape[0])
        aux = model.aux_losses() if j == len(segments) - 1 else {}
        (loss + sum(aux.values()) if aux else loss).backward()
    return mems


def interleave(codes: dict, device: torch.device, *, precision: str, rounds: int, steps: int, warmup: int,
               tokens_per_step: int) -> tuple[dict, dict, dict]:
    """`codes`: name → (model, step() running one step, whether anomaly detection is on during it), each step in
    the precision, its gradients zeroed first (`sidebyside.interleaved_steps`: each code's warm-up, its peak memory
    on a GPU, then the rounds). Returns (tokens/s per code and round, ours / each other code per round, peak MiB
    per code on a GPU)."""
    cast = autocast(device, precision)

    def whole(model, step, anomaly: bool):
        def one() -> None:
            model.zero_grad(set_to_none=True)
            with torch.autograd.set_detect_anomaly(anomaly), cast:
                step()
        return one

    speeds, peak = sidebyside.interleaved_steps({name: whole(*code) for name, code in codes.items()}, device,
                                                rounds=rounds, steps=steps, warmup=warmup,
                                                tokens_per_step=tokens_per_step)
    return speeds, {other: per_round(speeds["ours"], speeds[other]) for other in codes if other != "ours"}, peak


def _row(model: str, config: Path, theirs, ours, their_anomaly: bool, timing: tuple, device: str, **settings) -> dict:
    speeds, ratio, peak = timing
    path = Path(config).resolve()
    return {"model": model, "config": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(config),
            **settings, "their_anomaly_detection": their_anomaly, "tokens_per_s": speeds, "ours_over": ratio,
            "ours_over_median": {k: round(statistics.median(v), 3) for k, v in ratio.items()},
            "parameters": {"theirs": sum(p.numel() for p in theirs.parameters()),
                           "ours": sum(p.numel() for p in ours.parameters())},
            "peak_mib": peak or None, "device": sidebyside.device_name(device), "torch": torch.__version__}


def run(checkout: Path, *, config: Path = DEFAULT_CONFIG, precision: str = "32", batch: int | None = None,
        rounds: int = 3, steps: int = 1, warmup: int = 1, threads: int = 2, device: str = "cpu") -> dict:
    """Tokens/s per round of three codes taking turns: theirs as released (with the anomaly detection their
    `continuous_softmax.py` turns on at import: every backward output checked, every forward op's stack
    recorded), theirs without it, and ours (without it)."""
    torch.set_num_threads(threads)
    c = read_config(config)
    b = batch or c["batch"]
    m = c["model"]
    with sorting_modules(checkout) as (lta, mt):
        their_anomaly = torch.is_anomaly_enabled()
        torch.manual_seed(0)
        theirs = official_sorting_model(lta, mt, n_layer=m["n_layer"], n_head=m["n_head"], d_head=m["d_head"],
                                        d_inner=m["d_inner"], dropout=m["dropout"], dropatt=m["dropatt"],
                                        tgt_len=c["tgt_len"], mem_len=c["mem_len"], n_basis=c["ltm"]["n_basis"],
                                        device=device).train()
    torch.manual_seed(0)
    ours = our_sorting_model(c, device).train()
    segments = sequence(c, b, device)
    kl_weight = c["ltm"]["kl_weight"]
    codes = {"theirs": (theirs, lambda: step_theirs(theirs, segments, kl_weight), their_anomaly),
             "theirs_no_anomaly": (theirs, lambda: step_theirs(theirs, segments, kl_weight), False),
             "ours": (ours, lambda: step_ours(ours, segments, c["mem_len"]), False)}
    timing = interleave(codes, torch.device(device), precision=precision, rounds=rounds, steps=steps,
                        warmup=warmup, tokens_per_step=b * sum(x.shape[1] for x, _ in segments))
    return _row("sorting", config, theirs, ours, their_anomaly, timing, device, precision=precision, batch=b,
                length=c["length"], segment=c["tgt_len"], segments=len(segments), n_basis=c["ltm"]["n_basis"],
                threads=threads, rounds=rounds, steps=steps, warmup=warmup)


def run_gpt2(checkout: Path, *, config: Path = DEFAULT_GPT2_CONFIG, precision: str = "32", rounds: int = 3,
             steps: int = 4, warmup: int = 2, threads: int = 2, device: str = "cpu", block: int = 512) -> dict:
    """Tokens/s per round of the three codes (as `run`) on Table 1's model: `steps` blocks per code and round, the
    memory of each code carried through all of them (their threshold empties it every 2,048 tokens, ours too)."""
    torch.set_num_threads(threads)
    anomaly = torch.is_anomaly_enabled()
    torch.manual_seed(0)
    theirs, settings = official_gpt2_lm(checkout, device)
    their_anomaly = torch.is_anomaly_enabled()  # their continuous_sparsemax.py turns it on at import
    torch.autograd.set_detect_anomaly(anomaly)
    torch.manual_seed(0)
    ours, init = our_gpt2_lm(config, device)
    theirs.train()
    ours.train()
    kl_weight = init["memory_hook"]["args"]["ltm"]["kl_weight"]
    blocks = gpt2_blocks(8, block, device)
    # each model reads the blocks in order, its memory carried (both runs of theirs continue one stream)
    stream = {"theirs": itertools.cycle(blocks), "ours": itertools.cycle(blocks)}
    mems = [None]

    def step_theirs():
        x = next(stream["theirs"])
        out, kl = theirs(input_ids=x, labels=x, return_dict=True)
        (out.loss + kl_weight * kl.float().mean() if kl is not None else out.loss).backward()

    def step_ours():
        x = next(stream["ours"])
        hidden, mems[0] = ours(x, mems[0])
        loss = ours.nll(hidden[:, :-1], x[:, 1:]).mean()
        aux = ours.aux_losses()
        (loss + sum(aux.values()) if aux else loss).backward()

    codes = {"theirs": (theirs, step_theirs, their_anomaly), "theirs_no_anomaly": (theirs, step_theirs, False),
             "ours": (ours, step_ours, False)}
    timing = interleave(codes, torch.device(device), precision=precision, rounds=rounds, steps=steps,
                        warmup=warmup, tokens_per_step=block)
    return _row("gpt2_lm", config, theirs, ours, their_anomaly, timing, device, precision=precision, batch=1,
                segment=block, n_basis=settings["long_term_attention_basis"], threads=threads, rounds=rounds,
                steps=steps, warmup=warmup)


def describe(row: dict) -> str:
    if row["model"] == "gpt2_lm":
        shape = f"blocks of {row['segment']}"
    else:
        shape = f"batch {row['batch']} × {row['segments']} segments of {row['segment']}"
    med = {k: statistics.median(v) for k, v in row["tokens_per_s"].items()}
    r = row["ours_over"]
    return (f"{Path(row['config']).stem} {row['precision']} {shape} on {row['device']}, tokens/s: theirs "
            f"{med['theirs']:,.0f} (without their anomaly detection {med['theirs_no_anomaly']:,.0f}), "
            f"ours {med['ours']:,.0f}; ours / theirs {min(r['theirs']):.2f}–{max(r['theirs']):.2f}× "
            f"({min(r['theirs_no_anomaly']):.2f}–{max(r['theirs_no_anomaly']):.2f}× without it) "
            f"over {row['rounds']} round{'s' if row['rounds'] > 1 else ''}")


def main(argv: list[str]) -> None:
    p = sidebyside.parser(PROG, __doc__, repository="deep-spin/infinite-former", codes="both models", rounds=3,
                          steps=None, warmup=None, steps_help="sequences (sorting; default 1) or blocks (gpt2_lm; "
                          "default 4) per code and round", warmup_help="untimed steps per code first (default 1 / 2)")
    p.add_argument("--model", choices=["sorting", "gpt2_lm"], default="sorting",
                   help="Figure 3's sorting model or Table 1's GPT-2 with the LTM (default: %(default)s)")
    p.add_argument("--config", type=Path, help="an ∞-former sorting config, or GPT-2 config with --model gpt2_lm "
                   "(default: the paper's sort_8000_infty.yaml / gpt2_wt103_inftyformer.yaml)")
    p.add_argument("--batch", type=int, help="examples per sequence step (default: the config's)")

    def prepare(a) -> None:  # the defaults that depend on --model
        gpt2 = a.model == "gpt2_lm"
        a.config = a.config or (DEFAULT_GPT2_CONFIG if gpt2 else DEFAULT_CONFIG)
        a.steps = a.steps or (4 if gpt2 else 1)
        a.warmup = a.warmup if a.warmup is not None else (2 if gpt2 else 1)
        if gpt2 and a.batch is not None:
            raise SystemExit(f"{PROG}: --batch is for the sorting model (Table 1's batch is 1 block)")
        if not a.config.is_file():
            raise SystemExit(f"{PROG}: --config {a.config}: no such file")

    def run_model(a) -> list[dict]:
        if a.model == "gpt2_lm":
            return [run_gpt2(a.checkout, config=a.config, precision=a.precision, rounds=a.rounds, steps=a.steps,
                             warmup=a.warmup, threads=a.threads, device=a.device)]
        return [run(a.checkout, config=a.config, precision=a.precision, batch=a.batch, rounds=a.rounds,
                    steps=a.steps, warmup=a.warmup, threads=a.threads, device=a.device)]

    # both codes in this process, under the policy of the `repro` command
    sidebyside.main(p, argv, run_model, describe, prepare=prepare, keep_freed=True)
