"""Attention utilisation (the paper's motivating analysis): how much attention the current tokens put on the
memory, as a function of the distance to the key, for a trained Transformer-XL and a trained LaMemo.

`python -m papers.lamemo.utilisation -c CONFIG.yaml --ckpt CHECKPOINT --out results/lamemo/runs/tiny/X.json`
evaluates the checkpoint on the validation split with its evaluation memory (LaMemo's protocol: the training
lengths) and writes, per layer and averaged over layers:
- `mass_by_distance[d]`: the attention probability on the key at distance d = (query position − key position),
  averaged over heads, batch and the queries that have a key at that distance (full-memory segments only);
- `memory_mass`: the share of each query's attention that lands on memory positions (mean over queries).
A Transformer-XL checkpoint is evaluated by `LaMemo` with look-ahead off, which is the same model weight for
weight (tests/test_lamemo.py) and exposes its attention probabilities.
"""

from __future__ import annotations

import argparse

import torch

from papers.lamemo.model import LaMemo, LaMemoAttention, LaMemoConfig
from repro.io import atomic_write_json


def mass_by_distance(prob_BHTK: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over batch, heads and queries of the probability at each distance d = M + i − j (0 … K−1), and the
    number of (batch, head, query) triples that have a key at that distance. Query i sits at key position M + i."""
    b, h, t, k = prob_BHTK.shape
    m = k - t
    dev = prob_BHTK.device
    dist_TK = (m + torch.arange(t, device=dev)[:, None]) - torch.arange(k, device=dev)[None, :]
    valid = dist_TK >= 0
    sums = torch.zeros(k, dtype=torch.float64, device=dev)
    sums.index_add_(0, dist_TK[valid], prob_BHTK.double().sum((0, 1))[valid])
    counts = torch.zeros(k, dtype=torch.float64, device=dev)
    counts.index_add_(0, dist_TK[valid], torch.ones(int(valid.sum()), dtype=torch.float64, device=dev))
    return sums, counts * b * h


def memory_share(prob_BHTK: torch.Tensor) -> float:
    """Mean over batch, heads and queries of the attention mass on the first M (memory) keys."""
    t, k = prob_BHTK.shape[-2:]
    return float(prob_BHTK[..., : k - t].double().sum(-1).mean())


def analyse(module, dm, *, max_batches: int = 20) -> dict:
    """Run the validation split through the checkpoint's model, on the module's device, and collect the
    statistics."""
    src = module.model
    if isinstance(src, LaMemo):
        model = src
    else:  # Transformer-XL: the same weights in LaMemo with look-ahead off
        model = LaMemo(src.cfg, LaMemoConfig(look_ahead=False))
        model.load_state_dict(src.state_dict(), strict=True)
    device = next(module.parameters()).device
    model.to(device).eval()
    lengths = module.eval_memory
    attns = [layer.attn for layer in model.layers]
    assert all(isinstance(a, LaMemoAttention) for a in attns)
    n_layer = len(attns)
    sums = counts = None
    shares = [[] for _ in range(n_layer)]
    mems = None
    dm.setup("validate")
    with torch.no_grad():
        for i, batch in enumerate(dm.val_dataloader()):
            if i >= max_batches:
                break
            for a in attns:
                a.record = []
            _, mems = model(batch.input.to(device), mems, mem_len=lengths.mem_len, clamp_len=lengths.clamp_len,
                            same_length=lengths.same_length)
            probs = [a.record[0] for a in attns]
            k, t = probs[0].shape[-1], probs[0].shape[-2]
            if k - t < lengths.mem_len:  # the memory is still filling: skip
                continue
            if sums is None:
                sums = torch.zeros(n_layer, k, dtype=torch.float64, device=device)
                counts = torch.zeros(n_layer, k, dtype=torch.float64, device=device)
            for layer, p in enumerate(probs):
                s, c = mass_by_distance(p)
                sums[layer] += s
                counts[layer] += c
                shares[layer].append(memory_share(p))
    for a in attns:
        a.record = None
    if sums is None:
        raise ValueError("no validation segment had a full memory: evaluate more batches")
    per_layer = (sums / counts.clamp(min=1)).tolist()
    t = batch.input.shape[1]
    return {
        "mem_len": lengths.mem_len,
        "tgt_len": t,
        "look_ahead": bool(model.lamemo.look_ahead),
        "segments": len(shares[0]),
        "mass_by_distance": (sums.sum(0) / counts.sum(0).clamp(min=1)).tolist(),
        "mass_by_distance_per_layer": per_layer,
        "memory_mass_per_layer": [sum(s) / len(s) for s in shares],
        "memory_mass": sum(sum(s) / len(s) for s in shares) / n_layer,
    }


def main(argv: list[str] | None = None) -> None:
    from repro.cli.cli import build  # heavy: Lightning

    ap = argparse.ArgumentParser(prog="python -m papers.lamemo.utilisation", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-c", "--config", action="append", required=True, help="training config (and overrides)")
    ap.add_argument("--ckpt", required=True, help="the trained checkpoint")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--experiment", help="name in the record (default: the config's run.experiment)")
    ap.add_argument("--batches", type=int, default=20, help="validation segments to analyse")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    cli = build(args.config)
    module, dm = cli.model, cli.datamodule
    state = torch.load(args.ckpt, map_location="cpu", weights_only=True)
    module.load_state_dict(state["state_dict"])
    if torch.cuda.is_available():  # the paper's models after a GPU run: there, not on two CPU threads
        module.cuda()
    run = dict(cli.config.get("run", {}) or {})
    out = analyse(module, dm, max_batches=args.batches)
    record = {"paper": run.get("paper"), "experiment": args.experiment or run.get("experiment"),
              "profile": run.get("profile"), "rehearsal": bool(run.get("rehearsal")), "stage": "utilisation",
              "checkpoint": args.ckpt, "corpus": getattr(dm, "corpus_name", None), "utilisation": out}
    atomic_write_json(args.out, record)
    print(f"{args.out}: memory mass {out['memory_mass']:.3f} over {out['segments']} segments")


def after_run(config: str, checkpoint: str, experiment: str, record_dir: str, *,
              overrides: list[str] | tuple[str, ...] = ()) -> None:
    """`repro runs --after papers.lamemo.utilisation`: analyse each trained checkpoint in the same process. With
    `overrides` (the rehearsal's configs, `repro runs --rehearsal true`) they are composed after the config and
    only 3 validation segments are analysed: the code path at the paper's sizes, not a measurement."""
    extra = [a for c in overrides for a in ("-c", c)] + (["--batches", "3"] if overrides else [])
    main(["-c", config, *extra, "--ckpt", checkpoint, "--experiment", experiment,
          "--out", f"{record_dir}/{experiment}.utilisation.json"])


if __name__ == "__main__":
    main()
