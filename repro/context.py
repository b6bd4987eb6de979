"""Loss as a function of the context offered at test time, and the relative effective context length (RECL).

Transformer-XL §4.3 and Appendix C (Dai et al., 2019) define RECL over a *group* of models that share one
baseline. With l_i(c, t) the loss of model i on token t given a context of length c:

- baseline b(c, t) = min_i l_i(c, t): the best of the group at the short length c;
- T = the top-r fraction of tokens with the largest b(c, t) (the hardest ones for short contexts);
- relative loss f_i(c, c') = mean over t ∈ T of min(b(c, t), l_i(c', t)): only improvements over the shared
  baseline count;
- relative gain g_i(c, c') = (exp f_i(c, c) − exp f_i(c, c')) / exp f_i(c, c), a relative perplexity reduction;
- RECL_i: start at the shortest length c; while g_i(c, c + Δ) ≥ 0.01 move to c + Δ; the RECL is the c where the
  gain first falls below the threshold.

Here Δ is the step between consecutive lengths of the list evaluated (the paper's Table 8 lengths are multiples of
100 with its WT103 models; the tiny profile uses short lengths). When the gain never falls below the threshold the
RECL is the longest length tried and is reported as censored ("≥").

"Context length" is the attention length offered at test time, and any `SegmentLM` can be measured:
- `memory` models (trained with recurrence: Transformer-XL, LaMemo, ∞-former, …) are evaluated with carried memory
  under `eval_memory` with `mem_len = c` and `same_length`: every query attends to exactly c positions;
- `window` models (no recurrence: the ablations, MGK, the vanilla model) are evaluated with a sliding window of c
  tokens (`EvalProtocol(kind="sliding")`). Scoring every token from its own window costs c forward tokens per
  scored token; by default blocks of `max(1, c // 8)` tokens share a window, so every token sees between 7c/8 + 1
  and c tokens (pass `stride=1` for the exact protocol).

Every model of a group is scored on the same tokens (the same split, streams and segments), so the per-token
losses line up position by position.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from repro.data.lm import LMSegments
from repro.io import atomic_path
from repro.lm import EvalProtocol, SegmentLM
from repro.tracking import hardware

THRESHOLD = 0.01  # the paper's threshold on the relative gain
RATIOS = (0.1, 0.5, 1.0)  # Table 8's r

# (config files, checkpoint) -> (module in eval mode, data module); see `measure`
Loader = Callable[[Sequence[str], str | None], tuple[SegmentLM, object]]


@dataclass(frozen=True)
class ContextModel:
    """One model of a group: its config files (training config, then overrides) and checkpoint."""

    name: str
    configs: tuple[str, ...]
    ckpt: str
    mode: Literal["auto", "memory", "window"] = "auto"

    @classmethod
    def parse(cls, text: str) -> ContextModel:
        """`NAME=CONFIG[,CONFIG…]@CHECKPOINT[:memory|window]`."""
        try:
            name, rest = text.split("=", 1)
            cfgs, ckpt = rest.rsplit("@", 1)
        except ValueError:
            raise ValueError(f"--model {text!r}: expected NAME=CONFIG[,CONFIG...]@CHECKPOINT[:memory|window]") from None
        mode = "auto"
        if ckpt.endswith((":memory", ":window")):
            ckpt, mode = ckpt.rsplit(":", 1)
        return cls(name, tuple(c for c in cfgs.split(",") if c), ckpt, mode)  # type: ignore[arg-type]


def context_mode(module: SegmentLM, mode: str = "auto") -> Literal["memory", "window"]:
    """How a model is offered a context: memory when it was trained with recurrence, a sliding window otherwise."""
    if mode in ("memory", "window"):
        if mode == "memory" and not getattr(module.model, "supports_memory", False):
            raise ValueError(f"{type(module.model).__name__} keeps no memory: measure it with mode 'window'")
        return mode  # type: ignore[return-value]
    if mode != "auto":
        raise ValueError(f"context mode is auto, memory or window, got {mode!r}")
    return "memory" if getattr(module.model, "supports_memory", False) and module.memory.mem_len > 0 else "window"


def eval_tokens(dm, split: str, max_tokens: int | None):
    """The tokens a group is scored on: the split, or its first `max_tokens` tokens."""
    dm.setup("test")
    tokens = dm.corpus.splits[split]
    return tokens[:max_tokens] if max_tokens else tokens


@torch.no_grad()
def token_losses(module: SegmentLM, tokens: torch.Tensor, *, context: int, mode: Literal["memory", "window"],
                 batch_size: int, tgt_len: int, stride: int | None = None, window_batch: int = 256) -> np.ndarray:
    """Per-token NLL (nats) of `tokens` given `context` tokens of attention, in stream order (B·N values)."""
    if context <= 0:
        raise ValueError(f"context lengths must be positive, got {context}")
    segments = LMSegments(tokens, batch_size=batch_size, tgt_len=tgt_len)
    dev = next(module.parameters()).device  # the module's device: a GPU's where measure() put it there
    out = []
    if mode == "memory":
        lengths = replace(module.eval_memory, mem_len=context, same_length=True)
        kv = getattr(module.model, "supports_kv_memory", False)
        mems = None
        for seg in segments:
            hidden, mems = module(seg.input.to(dev), mems, lengths, kv_memory=kv)
            out.append(module.model.nll(hidden, seg.target.to(dev)).float())
    else:
        saved = module.eval_protocol
        module.eval_protocol = EvalProtocol(kind="sliding", window=context,
                                            stride=stride if stride else max(1, context // 8),
                                            window_batch=window_batch)
        module._history["test"] = None
        try:
            for seg in segments:
                out.append(module._sliding_nll("test", seg.input.to(dev), seg.target.to(dev)))
        finally:
            module.eval_protocol = saved
            module._history["test"] = None
    return torch.cat(out, dim=1).reshape(-1).double().cpu().numpy()


# ------------------------------------------------------------------------------------------------------- RECL
def relative_gain(losses: dict[str, dict[int, np.ndarray]], *, short: int, long: int, r: float) -> dict[str, float]:
    """g_i(c, c') of every model of the group (Appendix C), on the top-r hardest tokens under the baseline b(c, ·)."""
    if not 0 < r <= 1:
        raise ValueError(f"r is a fraction of the tokens in (0, 1], got {r}")
    names = list(losses)
    base_t = np.min(np.stack([losses[m][short] for m in names]), axis=0)  # b(c, t)
    n = max(1, int(round(r * base_t.size)))
    hard = np.argsort(-base_t, kind="stable")[:n]  # T: the top-r tokens with the largest baseline loss
    gains = {}
    for m in names:
        f_short = np.minimum(base_t[hard], losses[m][short][hard]).mean()  # f_i(c, c) (= mean b over T)
        f_long = np.minimum(base_t[hard], losses[m][long][hard]).mean()  # f_i(c, c')
        gains[m] = float((math.exp(f_short) - math.exp(f_long)) / math.exp(f_short))
    return gains


def recl(losses: dict[str, dict[int, np.ndarray]], *, r: float, threshold: float = THRESHOLD,
         contexts: Sequence[int] | None = None) -> dict[str, dict]:
    """RECL of every model: {name: {"recl": c, "censored": bool, "gains": [[c, c', g], …]}}."""
    names = list(losses)
    if not names:
        raise ValueError("RECL needs at least one model")
    contexts = sorted(contexts or losses[names[0]])
    if len(contexts) < 2:
        raise ValueError("RECL needs at least two context lengths")
    sizes = {losses[m][c].size for m in names for c in contexts}
    if len(sizes) != 1:
        raise ValueError("every model must be scored on the same tokens at every context length")
    out = {}
    curve = [relative_gain(losses, short=a, long=b, r=r) for a, b in zip(contexts, contexts[1:])]
    for m in names:
        gains = [[a, b, g[m]] for (a, b), g in zip(zip(contexts, contexts[1:]), curve)]
        result, censored = contexts[-1], True
        for a, _, g in gains:
            if g < threshold:
                result, censored = a, False
                break
        out[m] = {"recl": result, "censored": censored, "gains": gains}
    return out


# ----------------------------------------------------------------------------------------------- the harness
def measure(models: Sequence[ContextModel], contexts: Sequence[int], *, load: Loader, split: str = "test",
            max_tokens: int | None = None, ratios: Sequence[float] = RATIOS, threshold: float = THRESHOLD,
            stride: int | None = None, threads: int | None = None, batch_size: int | None = None,
            device: str | None = None) -> dict:
    """Per-token losses of every model at every context length, mean losses and RECL: a JSON-ready record.

    The split is cut into `batch_size` contiguous streams (default: the first config's eval batch size). Near the
    start of a stream a window model is run once per token (its window is the prefix), so fewer streams cost less.
    `load(configs, ckpt)` gives a model's module (eval mode, fp32) and data module: `repro recl` passes
    `repro.cli.cli.load_module`, which builds them from config files (this library imports no CLI). The models
    run on `device` (default: a GPU where there is one; the paper's groups score 245k tokens at up to 1,600 tokens
    of context, sliding windows included).
    """
    if threads:
        torch.set_num_threads(threads)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if len({m.name for m in models}) != len(models):
        raise ValueError("model names in a group must be unique")
    contexts = sorted(set(int(c) for c in contexts))
    losses: dict[str, dict[int, np.ndarray]] = {}
    info, ref = {}, None
    for spec in models:
        module, dm = load(spec.configs, spec.ckpt)
        module = module.to(dev)
        mode = context_mode(module, spec.mode)
        tokens = eval_tokens(dm, split, max_tokens)
        key = (dm.corpus_name, dm.corpus.vocab.digest, tokens.numel(), batch_size or dm.eval_batch_size,
               dm.eval_tgt_len)
        if ref is None:
            ref = key
        elif key[:3] != ref[:3]:
            raise ValueError(f"{spec.name} is scored on {key[0]} ({key[2]} tokens), the group's first model on "
                             f"{ref[0]} ({ref[2]}): a group shares one corpus and split")
        t0 = time.time()
        losses[spec.name] = {c: token_losses(module, tokens, context=c, mode=mode, batch_size=ref[3],
                                             tgt_len=ref[4], stride=stride) for c in contexts}
        info[spec.name] = {
            "configs": list(spec.configs), "ckpt": spec.ckpt, "mode": mode,
            "parameters": sum(p.numel() for p in module.parameters()),
            "train_mem_len": module.memory.mem_len,
            "mean_loss": {str(c): float(losses[spec.name][c].mean()) for c in contexts},
            "seconds": round(time.time() - t0, 1),
        }
    result = {"corpus": ref[0], "split": split, "tokens": int(next(iter(losses.values()))[contexts[0]].size),
              "eval_batch_size": ref[3], "eval_tgt_len": ref[4], "contexts": contexts, "threshold": threshold,
              "window_stride": stride or "max(1, c // 8)", "hardware": hardware(), "models": info,
              "recl": {}}
    for r in ratios:
        result["recl"][str(r)] = recl(losses, r=r, threshold=threshold, contexts=contexts)
    return result


def plot(result: dict, out: str | Path, *, r: float = 0.1, title: str | None = None) -> Path:
    """Left: perplexity against the attention length offered at test time; right: the relative gain g(c, c')."""
    import matplotlib  # heavy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    cs = result["contexts"]
    for name, m in result["models"].items():
        a.plot(cs, [math.exp(m["mean_loss"][str(c)]) for c in cs], "o-", ms=3, label=f"{name} ({m['mode']})")
        gains = result["recl"][str(r)][name]["gains"]
        b.plot([g[1] for g in gains], [g[2] for g in gains], "o-", ms=3, label=name)
    b.axhline(result["threshold"], color="grey", ls="--", lw=1, label=f"threshold {result['threshold']}")
    a.set_xlabel("attention length at test time")
    a.set_ylabel(f"{result['split']} perplexity")
    b.set_xlabel("longer context c'")
    b.set_ylabel(f"relative gain g(c, c'), r = {r}")
    for ax in (a, b):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    out = Path(out)
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out

