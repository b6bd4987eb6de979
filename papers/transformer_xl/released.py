"""The authors' released Transformer-XL models (TensorFlow checkpoints) as our `TransformerXL`.

    repro released download enwik8 --root pretrained_xl   # the authors' files
    repro released evaluate enwik8 --root pretrained_xl   # their test split, a record
    model = load_tf("…/model.ckpt-0", LAYOUTS["enwik8"])   # eval mode, float32, the released weights

Follows the authors' TF model, `tf/model.py` of kimiyoung/transformer-xl (`transformer`, `rel_multihead_attn`,
`positionwise_FF`, `mask_adaptive_embedding_lookup`, `mask_adaptive_logsoftmax`), variable by variable:
- `transformer/layer_{i}/rel_attn/qkv/kernel` (D, 3·H·Dh), split q | k | v as `tf.split(…, 3, -1)`: our
  `qkv_net.weight` is its transpose; `r/kernel` and `o/kernel` likewise `r_net` and `o_net`;
- `…/rel_attn/LayerNorm/{gamma,beta}` and `…/ff/LayerNorm/{gamma,beta}` (after the residual sums, as ours),
  `…/ff/layer_1/{kernel,bias}` and `…/ff/layer_2/{kernel,bias}` (dense layers: kernels transposed);
- `transformer/r_w_bias`, `transformer/r_r_bias`: (H, Dh) shared by the layers (`untie_r` false, the enwik8 and
  text8 models);
- `transformer/adaptive_embed/lookup_table` (n_token, d_embed), scaled by √D at lookup as ours, its projection
  `proj_W` (d_embed, D) where the widths differ (our `emb_projs.0` is its transpose); with `div_val` > 1 one
  `cutoff_{i}/lookup_table` and `cutoff_{i}/proj_W` per cluster, the projection absent where the widths match and
  `proj_same_dim` is false (the One Billion Word model): the identity in ours;
- `transformer/adaptive_softmax/bias` (no clusters; the output weights are the embedding's: TF always ties them),
  or per cluster `cutoff_{i}/b`, an untied `cutoff_{i}/proj`, and `cutoff_0/cluster_W`, `cutoff_0/cluster_b`.
Differs, where our model follows the authors' PyTorch code instead, and the converter bridges it:
- TF's layer norms use ε = 1e-12 (`tf.contrib.layers.layer_norm`), PyTorch's 1e-5: the converted model's layer
  norms are given TF's ε;
- TF orders the cluster logits of the adaptive softmax's head after the shortlist as clusters 1, 2, …; the PyTorch
  code (and ours) reads cluster i at position −i: the cluster rows are reversed.
- TF's evaluation (`train_gpu.py`) starts from a memory of `mem_len` zero rows, not an empty one, and its
  `same_length` mask lets each query see the memory's M rows and itself, M + 1 keys, where the PyTorch mask counts
  `mem_len` keys with the query among them: the TF protocol is ours with `mem_len` M + 1 (`tf_protocol`; the
  extra row the memory then keeps is masked for every query).
Refused in one line: per-layer attention biases (`untie_r`, the WikiText-103 and One Billion Word models), which
our `TransformerXL` does not hold yet.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from papers.transformer_xl.model import TransformerXL, TransformerXLConfig
from repro.data.download import ChecksumError, DownloadError, download, read_sidecar
from repro.io import atomic_write_json
from repro.ops.bench import environment
from repro.weights.py2pickle import load
from repro.weights.tf_bundle import CheckpointError, TFCheckpoint

TF_LAYER_NORM_EPS = 1e-12
SCOPE = "transformer"


@dataclass(frozen=True)
class Layout:
    """The settings of a released model that its checkpoint does not say (`tf/sota/*.sh`)."""

    n_head: int
    d_head: int
    cutoffs: tuple[int, ...] = ()
    div_val: int = 1
    untie_r: bool = False
    proj_share_all_but_first: bool = False
    proj_same_dim: bool = True
    extra: dict = field(default_factory=dict)


LAYOUTS = {
    # tf/sota/enwik8.sh and text8.sh: 24 layers, d 1024, 8 heads of 128, no adaptive softmax, shared biases
    "enwik8": Layout(n_head=8, d_head=128),
    "text8": Layout(n_head=8, d_head=128),
}


def _t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def config_of(ckpt: TFCheckpoint, layout: Layout) -> TransformerXLConfig:
    """Our model's settings, the sizes read from the checkpoint's shapes."""
    names = set(ckpt.names())
    n_layer = sum(1 for n in names if n.startswith(f"{SCOPE}/layer_") and n.endswith("/rel_attn/qkv/kernel"))
    if n_layer == 0:
        raise CheckpointError(f"{ckpt.prefix} holds no {SCOPE}/layer_*/rel_attn/qkv/kernel: not a Transformer-XL "
                              "checkpoint of the authors' TF code")
    if layout.untie_r or len(ckpt.shape(f"{SCOPE}/r_w_bias")) == 3:
        raise CheckpointError(f"{ckpt.prefix} has per-layer attention biases (untie_r: the WikiText-103 and One "
                              "Billion Word models), which TransformerXL does not hold yet")
    d_model = ckpt.shape(f"{SCOPE}/layer_0/rel_attn/o/kernel")[1]
    d_inner = ckpt.shape(f"{SCOPE}/layer_0/ff/layer_1/kernel")[1]
    if layout.div_val == 1:
        n_token, d_embed = ckpt.shape(f"{SCOPE}/adaptive_embed/lookup_table")
    else:
        d_embed = ckpt.shape(f"{SCOPE}/adaptive_embed/cutoff_0/lookup_table")[1]
        n_token = layout.cutoffs[-1] + ckpt.shape(
            f"{SCOPE}/adaptive_embed/cutoff_{len(layout.cutoffs)}/lookup_table")[0]
    tie_projs = (False, *([layout.proj_share_all_but_first] * len(layout.cutoffs))) if layout.cutoffs else None
    return TransformerXLConfig(n_layer=n_layer, d_model=d_model, n_head=layout.n_head, d_head=layout.d_head,
                               d_inner=d_inner, n_token=n_token, dropout=0.0, dropatt=0.0,
                               d_embed=None if d_embed == d_model else d_embed, div_val=layout.div_val,
                               cutoffs=tuple(layout.cutoffs), tie_weight=True, tie_projs=tie_projs)


def state_dict_of(ckpt: TFCheckpoint, model: TransformerXL, layout: Layout) -> dict[str, torch.Tensor]:
    """Our state dict's entries from the checkpoint's variables (every one of ours set, every one of theirs used)."""
    cfg = model.cfg
    read = ckpt.read
    out: dict[str, torch.Tensor] = {"r_w_bias": _t(read(f"{SCOPE}/r_w_bias")),
                                    "r_r_bias": _t(read(f"{SCOPE}/r_r_bias"))}
    for i in range(cfg.n_layer):
        tf, us = f"{SCOPE}/layer_{i}", f"layers.{i}"
        out[f"{us}.attn.qkv_net.weight"] = _t(read(f"{tf}/rel_attn/qkv/kernel").T)
        out[f"{us}.attn.r_net.weight"] = _t(read(f"{tf}/rel_attn/r/kernel").T)
        out[f"{us}.attn.o_net.weight"] = _t(read(f"{tf}/rel_attn/o/kernel").T)
        out[f"{us}.attn_norm.weight"] = _t(read(f"{tf}/rel_attn/LayerNorm/gamma"))
        out[f"{us}.attn_norm.bias"] = _t(read(f"{tf}/rel_attn/LayerNorm/beta"))
        out[f"{us}.ff.net.0.weight"] = _t(read(f"{tf}/ff/layer_1/kernel").T)
        out[f"{us}.ff.net.0.bias"] = _t(read(f"{tf}/ff/layer_1/bias"))
        out[f"{us}.ff.net.3.weight"] = _t(read(f"{tf}/ff/layer_2/kernel").T)
        out[f"{us}.ff.net.3.bias"] = _t(read(f"{tf}/ff/layer_2/bias"))
        out[f"{us}.ff_norm.weight"] = _t(read(f"{tf}/ff/LayerNorm/gamma"))
        out[f"{us}.ff_norm.bias"] = _t(read(f"{tf}/ff/LayerNorm/beta"))
    emb, soft = f"{SCOPE}/adaptive_embed", f"{SCOPE}/adaptive_softmax"
    if cfg.div_val == 1:
        table = _t(read(f"{emb}/lookup_table"))
        out["word_emb.emb_layers.0.weight"] = table
        if f"{emb}/proj_W" in ckpt.entries:
            out["word_emb.emb_projs.0"] = _t(read(f"{emb}/proj_W").T)
        if not cfg.cutoffs:
            out["crit.out_layers.0.weight"] = table
            out["crit.out_layers.0.bias"] = _t(read(f"{soft}/bias"))
            if "word_emb.emb_projs.0" in out:
                out["crit.out_proj_0"] = out["word_emb.emb_projs.0"]
            return out
        raise CheckpointError(f"{ckpt.prefix}: an adaptive softmax with div_val 1 (cutoffs {cfg.cutoffs}) is not "
                              "among the released layouts and is not converted")
    # div_val > 1: one table and one projection per cluster; TF's missing projection (`proj_same_dim` false where
    # the widths match) is the identity, which our model holds as a matrix
    n = len(cfg.cutoffs) + 1
    projs = []
    for i in range(n):
        table = _t(read(f"{emb}/cutoff_{i}/lookup_table"))
        out[f"word_emb.emb_layers.{i}.weight"] = table
        out[f"crit.out_layers.{i}.weight"] = table  # TF ties the softmax to the embedding always
        proj = f"{emb}/cutoff_{i}/proj_W"
        projs.append(_t(read(proj).T) if proj in ckpt.entries else torch.eye(cfg.d_model, table.shape[1]))
        out[f"word_emb.emb_projs.{i}"] = projs[i]
        out[f"crit.out_layers.{i}.bias"] = _t(read(f"{soft}/cutoff_{i}/b"))
        own = f"{soft}/cutoff_{i}/proj"
        if cfg.proj_ties[i]:
            out[f"crit.out_proj_{i}"] = projs[i]
        elif own in ckpt.entries:
            out[f"crit.out_proj_{i}"] = _t(read(own).T)
        else:
            out[f"crit.out_proj_{i}"] = torch.eye(cfg.d_model, table.shape[1])
    # TF's head puts cluster i's logit at position cutoffs[0] + i − 1; the PyTorch code (ours) reads it at −i
    out["crit.cluster_weight"] = _t(read(f"{soft}/cutoff_0/cluster_W")[::-1])
    out["crit.cluster_bias"] = _t(read(f"{soft}/cutoff_0/cluster_b")[::-1])
    return out


def load_tf(prefix: str | os.PathLike, layout: Layout, *, verify: bool = True) -> TransformerXL:
    """The released model as our `TransformerXL` (float32, eval mode), with TF's layer-norm ε."""
    with TFCheckpoint(prefix, verify=verify) as ckpt:
        cfg = config_of(ckpt, layout)
        # built for real and loaded by copy, not on the meta device with `assign`: the adaptive softmax keeps its
        # projections in a plain list too (repro.nn.adaptive), which an assigned Parameter would leave behind
        model = TransformerXL(cfg)
        state = state_dict_of(ckpt, model, layout)
    ours = model.state_dict()
    missing = sorted(set(ours) - set(state))
    unknown = sorted(set(state) - set(ours))
    if missing or unknown:
        raise CheckpointError(f"converting {prefix}: our model's {missing[:3]} are not set and {unknown[:3]} are not "
                              "ours: the layout does not match the checkpoint")
    for k, v in state.items():
        if tuple(v.shape) != tuple(ours[k].shape):
            raise CheckpointError(f"converting {prefix}: {k} is {tuple(v.shape)} in the checkpoint, "
                                  f"{tuple(ours[k].shape)} in our model: the layout's n_head/d_head do not match")
    model.load_state_dict(state)
    for m in model.modules():
        if isinstance(m, nn.LayerNorm):
            m.eps = TF_LAYER_NORM_EPS
    return model.float().eval()


@dataclass(frozen=True)
class TFProtocol:
    """The authors' TF evaluation settings (`tf/sota/*.sh`: tgt_len, mem_len, clamp_len, same_length)."""

    mem_len: int
    clamp_len: int = -1
    same_length: bool = False

    def first_memory(self, model: TransformerXL, batch: int) -> list[torch.Tensor]:
        """`train_gpu.py`'s first memory: `mem_len` zero rows per layer (batch-first here)."""
        return [torch.zeros(batch, self.mem_len, model.cfg.d_model) for _ in model.layers]

    @property
    def our_mem_len(self) -> int:
        """The `mem_len` our forward takes to compute what TF computes (the module docstring)."""
        return self.mem_len + 1 if self.same_length else self.mem_len


@torch.no_grad()
def tf_protocol_nll(model: TransformerXL, segments: list[tuple[torch.Tensor, torch.Tensor]],
                    protocol: TFProtocol) -> list[torch.Tensor]:
    """Per-token NLL (B, T) of each consecutive segment (inputs, targets; batch-first), the memory carried from a
    first memory of zeros, as the authors' TF evaluation computes them."""
    mems = protocol.first_memory(model, segments[0][0].shape[0])
    out = []
    for x, y in segments:
        h, mems = model(x, mems, mem_len=protocol.our_mem_len, clamp_len=protocol.clamp_len,
                        same_length=protocol.same_length)
        out.append(model.nll(h, y))
    return out


URL = "http://curtis.ml.cmu.edu/datasets/pretrained_xl"  # tf/sota/download.sh


@dataclass(frozen=True)
class Release:
    """One released model: its folder under `URL`, checkpoint prefix, layout, test protocol (`tf/sota/<name>.sh`:
    TEST_TGT_LEN, TEST_MEM_LEN, TEST_CLAMP_LEN, same_length, TEST_BSZ) and the paper's number for it."""

    folder: str
    checkpoint: str
    layout: Layout
    tgt_len: int
    protocol: TFProtocol
    batch: int
    level: str  # "char": bpc; "word": perplexity
    paper: float

    def files(self) -> list[str]:
        """The files the evaluation needs (the graph's `.meta` is not: the model is ours)."""
        return ["data/cache.pkl", "data/corpus-info.json", "model/checkpoint",
                f"model/{self.checkpoint}.index", f"model/{self.checkpoint}.data-00000-of-00001"]


RELEASES = {
    "enwik8": Release("tf_enwiki8", "model.ckpt-0", LAYOUTS["enwik8"], 128, TFProtocol(3800, 1000, True), 16,
                      "char", 0.99),
    "text8": Release("tf_text8", "model.ckpt-0", LAYOUTS["text8"], 128, TFProtocol(3800, 1000, True), 16, "char",
                     1.08),
    "wt103": Release("tf_wt103", "model.ckpt-0",
                     Layout(n_head=16, d_head=64, cutoffs=(20000, 40000, 200000), div_val=4, untie_r=True,
                            proj_share_all_but_first=True), 128, TFProtocol(1600, 1000, True), 16, "word", 18.3),
    "lm1b": Release("tf_lm1b", "model.ckpt-1191000",
                    Layout(n_head=16, d_head=80, cutoffs=(60000, 100000, 640000), div_val=4, untie_r=True,
                           proj_same_dim=False), 32, TFProtocol(128, -1, False), 16, "word", 21.8),
}


def _release(name: str) -> Release:
    if name not in RELEASES:
        raise ValueError(f"no released model {name!r}: the authors released {', '.join(RELEASES)}")
    return RELEASES[name]


def download_released(name: str, root: str | os.PathLike) -> Path:
    """The authors' files of model `name` under `root/<folder>/` (resumable, atomic, `repro.data.download`). Nothing
    is published for them: the size and sha256 of each are recorded at the first download (`<file>.sha256`),
    every later use is checked against them, and they are printed for comparing with another copy."""
    rel = _release(name)
    folder = Path(root) / rel.folder
    for f in rel.files():
        dest = download(f"{URL}/{rel.folder}/{f}", folder / f, sha256=None, record_sha256=True)
        print(f"released {name}: {dest} {dest.stat().st_size:,} bytes sha256 {read_sidecar(dest)}", flush=True)
    return folder


def test_streams(tokens: np.ndarray, batch: int) -> torch.Tensor:
    """The test split as the authors' evaluation serves it: `batch` contiguous streams (`batchify`: the tail that
    does not fill them dropped), (B, N)."""
    n = len(tokens) // batch
    return torch.from_numpy(np.asarray(tokens[: n * batch], dtype=np.int64)).view(batch, n)


@torch.no_grad()
def evaluate_released(name: str, root: str | os.PathLike, *, max_segments: int | None = None,
                      release: Release | None = None) -> dict:
    """The released model's test loss by the authors' protocol on their own encoded test split (`cache.pkl`'s
    `test`, with its vocabulary as released): the mean per-token NLL over every full segment of every stream.
    `release`: other settings than `RELEASES[name]` (a test's miniature)."""
    rel = release or _release(name)
    folder = Path(root) / rel.folder
    corpus = load(folder / "data" / "cache.pkl")
    model = load_tf(folder / "model" / rel.checkpoint, rel.layout)
    if len(corpus.vocab.idx2sym) != model.cfg.n_token:
        raise CheckpointError(f"{folder}: cache.pkl has {len(corpus.vocab.idx2sym)} symbols, the checkpoint "
                              f"{model.cfg.n_token}: the files come from two releases")
    streams = test_streams(np.asarray(corpus.test), rel.batch)
    steps = (streams.shape[1] - 1) // rel.tgt_len
    if max_segments is not None:
        steps = min(steps, max_segments)
    mems = rel.protocol.first_memory(model, rel.batch)
    total, count = 0.0, 0
    for k in range(steps):
        x = streams[:, k * rel.tgt_len:(k + 1) * rel.tgt_len]
        y = streams[:, k * rel.tgt_len + 1:(k + 1) * rel.tgt_len + 1]
        h, mems = model(x, mems, mem_len=rel.protocol.our_mem_len, clamp_len=rel.protocol.clamp_len,
                        same_length=rel.protocol.same_length)
        nll = model.nll(h, y)
        total, count = total + float(nll.sum()), count + nll.numel()
    loss = total / count
    return {"model": name, "loss": loss, "bpc": loss / math.log(2), "ppl": math.exp(loss), "tokens": count,
            "segments": steps, "batch": rel.batch, "tgt_len": rel.tgt_len, "mem_len": rel.protocol.mem_len,
            "clamp_len": rel.protocol.clamp_len, "same_length": rel.protocol.same_length, "level": rel.level,
            "paper": rel.paper, "parameters": sum(p.numel() for p in model.parameters())}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="repro released", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["download", "evaluate"])
    ap.add_argument("model", choices=sorted(RELEASES))
    ap.add_argument("--root", default="pretrained_xl", help="where the released files go (default: pretrained_xl)")
    ap.add_argument("--out", help="evaluate: the record to write (default: results/transformer_xl/released/"
                                  "<model>.json)")
    ap.add_argument("--max-segments", type=int, help="evaluate: only the first segments of the test split")
    args = ap.parse_args(argv)
    try:
        if args.action == "download":
            download_released(args.model, args.root)
            return
        record = evaluate_released(args.model, args.root, max_segments=args.max_segments)
    except (ValueError, OSError, DownloadError, ChecksumError) as err:
        raise SystemExit(f"error: {err}") from None
    env = environment(torch.device("cpu"))
    record["provenance"] = {"command": "repro released " + " ".join(argv or sys.argv[1:]),
                            "host_cpu": env["host_cpu"], "torch": env["torch"], "complete": args.max_segments is None}
    out = args.out or f"results/transformer_xl/released/{args.model}.json"
    atomic_write_json(out, record)
    unit = f"{record['bpc']:.3f} bpc" if record["level"] == "char" else f"{record['ppl']:.2f} ppl"
    print(f"released {args.model}: {unit} over {record['tokens']:,} test tokens (the paper: {record['paper']}); "
          f"{out}", flush=True)


if __name__ == "__main__":
    main()

