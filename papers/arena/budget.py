"""The arena's second budget: every contestant at Transformer-XL's training FLOPs per token, within ±5%.

`repro arena-budget PROFILE` counts the training FLOPs per token of each contestant of `configs/arena/PROFILE/`
(one training step at full memory, `papers.arena.measure.train_flops`: matrix products, forward and backward) and
of the profile's Transformer-XL (`txl.yaml`, the reference). A contestant outside ±5% of the reference gets another
memory length, or, where no memory length reaches the band (a memory-less model, or a mechanism whose own cost
exceeds the reference at any memory), another depth and then the memory length at that depth: the setting that
comes closest, within the band where one exists. The result is written as configs beside the originals,
`NAME_eqflops.yaml` (the original config composed with the changed settings, and a header that says so), and one
record, `results/arena/budget/PROFILE.json` (`PROFILE_CORPUS.json` with `--prefix CORPUS_`, the paper profile):
per contestant the lever, its value, the FLOPs per token of the original and of the budget config, and the ratio
to the reference. The arena table reads it for its budget column.

Differs from the papers' practice, where each compares at its own budget (LaMemo and the ∞-former at equal memory
length, MGK at equal heads × width); the first budget of the arena, the same backbone, is theirs. FLOPs do not
depend on the weights or the tokens: the count runs on random tokens of the config's vocabulary, at its batch
size (the position projection is computed once per step, not per stream) and in float32, on PyTorch's meta device
(shapes without values: the same count as on a CPU, in about a second at the papers' sizes).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from repro.io import atomic_write_json, atomic_write_text

BAND = 0.05  # ±5% of the reference
REFERENCE = "txl"


def _flops(config: Path, overrides: dict[str, int], device: str = "meta") -> float:
    """Training FLOPs per token of `config` with `overrides` (dotted `model.init_args` keys). On the meta device
    (the default) no weight or activation is materialised: the count needs shapes only, and takes about a second
    at the papers' sizes, where a real step would take minutes on a CPU; tests pin it to the CPU count."""
    import torch  # heavy: torch

    from papers.arena.measure import train_flops  # heavy: torch
    from repro.cli.cli import build  # heavy: Lightning
    from repro.data.lm import Segment  # heavy: Lightning

    args = [a for key, value in overrides.items() for a in (f"--model.init_args.{key}", str(value))]
    cli = build([str(config)], args, meta=device == "meta")
    module = cli.model.float().to(device)
    data = cli.config["data"]["init_args"]
    t, b = int(data["tgt_len"]), int(data["batch_size"])
    gen = torch.Generator().manual_seed(0)

    def batches():
        while True:
            x = torch.randint(0, module.n_token, (b, t + 1), generator=gen).to(device)
            yield Segment(x[:, :-1], x[:, 1:])

    torch.manual_seed(0)
    return float(train_flops(module, batches(), precision="32", device=torch.device(device))["per_token"])


def _setting(config: Path) -> dict[str, int]:
    ia = yaml.safe_load(config.read_text())["model"]["init_args"]
    return {"memory.mem_len": int(ia.get("memory", {}).get("mem_len", 0)), "model.n_layer": int(ia["model"]["n_layer"])}


def _closest(cost, values: list[int], target: float) -> tuple[int, float]:
    """The value whose cost is closest to `target` (costs grow with the value: bisection, then the neighbours)."""
    lo, hi = 0, len(values) - 1
    seen: dict[int, float] = {}

    def at(i):
        if i not in seen:
            seen[i] = cost(values[i])
        return seen[i]

    while lo < hi:
        mid = (lo + hi) // 2
        if at(mid) < target:
            lo = mid + 1
        else:
            hi = mid
    best = min((i for i in (lo - 1, lo) if 0 <= i < len(values)), key=lambda i: abs(at(i) / target - 1))
    return values[best], at(best)


def _closest_memory(cost, step: int, tgt_len: int, target: float) -> tuple[int, float]:
    """The memory length closest in cost to `target`: on a grid of `step` up to 4 segments, then every length
    between the grid's neighbours of the best."""
    mem, f = _closest(cost, list(range(step, 4 * tgt_len + 1, step)), target)
    if step > 1 and abs(f / target - 1) > 0.005:
        fine = list(range(max(1, mem - step + 1), mem + step))
        mem2, f2 = _closest(cost, fine, target)
        if abs(f2 / target - 1) < abs(f / target - 1):
            return mem2, f2
    return mem, f


def equalise(config: Path, reference: float, *, tgt_len: int) -> dict:
    """The budget setting of one contestant (see the module docstring)."""
    base = _setting(config)
    original = _flops(config, {})
    out = {"original": base, "original_flops_per_token": original, "lever": "none", "setting": {},
           "flops_per_token": original}
    if abs(original / reference - 1) <= BAND:
        return out
    step = max(1, tgt_len // 4)
    if base["memory.mem_len"]:  # the memory length first
        mem, f = _closest_memory(lambda m: _flops(config, {"memory.mem_len": m, "eval_memory.mem_len": m}), step,
                                 tgt_len, reference)
        out |= {"lever": "memory length", "setting": {"memory.mem_len": mem}, "flops_per_token": f}
        if abs(f / reference - 1) <= BAND:
            return out
    layers = list(range(1, 4 * base["model.n_layer"] + 1))
    depth, f = _closest(lambda n: _flops(config, {"model.n_layer": n}), layers, reference)
    out |= {"lever": "depth", "setting": {"model.n_layer": depth}, "flops_per_token": f}
    if abs(f / reference - 1) > BAND and base["memory.mem_len"]:
        mem, f = _closest_memory(lambda m: _flops(config, {"model.n_layer": depth, "memory.mem_len": m,
                                                           "eval_memory.mem_len": m}), step, tgt_len, reference)
        out |= {"lever": "depth and memory length", "setting": {"model.n_layer": depth, "memory.mem_len": mem},
                "flops_per_token": f}
    return out


def write_config(config: Path, result: dict, reference: float, prefix: str = "") -> Path:
    """`NAME_eqflops.yaml`: the contestant's config with the budget's settings, and a header that says so."""
    cfg = yaml.safe_load(config.read_text())
    ia = cfg["model"]["init_args"]
    for key, value in result["setting"].items():
        group, name = key.split(".")
        ia[group][name] = value
        if key == "memory.mem_len" and "eval_memory" in ia:
            ia["eval_memory"]["mem_len"] = value
    cfg["run"]["experiment"] = f"{cfg['run']['experiment']}_eqflops"
    ratio = result["flops_per_token"] / reference
    changed = ", ".join(f"{k} {result['original'][k]} → {v}" for k, v in result["setting"].items()) or "nothing"
    command = f"repro arena-budget {cfg['run']['profile']}" + (f" --prefix {prefix}" if prefix else "")
    head = (f"# Generated by `{command}` from {config.name}: do not edit, rerun it.\n"
            f"# Equal training FLOPs per token: {result['flops_per_token'] / 1e6:.3f} MFLOP against Transformer-XL's "
            f"{reference / 1e6:.3f} ({ratio:.3f}×; the band is ±{BAND:.0%}); lever: {result['lever']} ({changed}).\n")
    out = config.with_name(f"{config.stem}_eqflops.yaml")
    atomic_write_text(out, head + yaml.safe_dump(cfg, sort_keys=False, allow_unicode=True, width=116))
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="repro arena-budget", description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="configs/arena/PROFILE")
    ap.add_argument("--configs", default="configs/arena")
    ap.add_argument("--out", default="results/arena/budget", help="folder of the record PROFILE.json")
    ap.add_argument("--prefix", default="", help="the contestants' name prefix (paper: enwik8_, the corpus)")
    args = ap.parse_args(argv)

    folder = Path(args.configs) / args.profile
    ref_config = folder / f"{args.prefix}{REFERENCE}.yaml"
    if not ref_config.is_file():
        sys.exit(f"repro arena-budget: no reference config {ref_config}; the budget is Transformer-XL's FLOPs")
    contestants = sorted(p for p in folder.glob(f"{args.prefix}*.yaml") if p.stem not in (ref_config.stem, "claims")
                         and not p.stem.startswith("sort_") and not p.stem.endswith("_eqflops")
                         and ".eval." not in p.name)
    tgt_len = int(yaml.safe_load(ref_config.read_text())["data"]["init_args"]["tgt_len"])
    reference = _flops(ref_config, {})
    record = {"profile": args.profile, "reference": REFERENCE, "reference_flops_per_token": reference,
              "band": BAND,
              "count": "train_flops of papers.arena.measure at the config's batch size, float32, on the meta device",
              "contestants": {}}
    for config in contestants:
        result = equalise(config, reference, tgt_len=tgt_len)
        result["ratio"] = result["flops_per_token"] / reference
        result["within_band"] = abs(result["ratio"] - 1) <= BAND
        written = write_config(config, result, reference, args.prefix) if result["lever"] != "none" else config
        result["config"] = str(written)
        record["contestants"][config.stem] = result
        print(f"arena-budget {args.profile}/{config.stem}: {result['original_flops_per_token'] / 1e6:.3f} → "
              f"{result['flops_per_token'] / 1e6:.3f} MFLOP/token ({result['ratio']:.3f}× Transformer-XL's), "
              f"lever: {result['lever']} {result['setting'] or ''}")
    out = Path(args.out) / f"{args.profile}{'_' + args.prefix.rstrip('_') if args.prefix else ''}.json"
    atomic_write_json(out, record)
    print(f"arena-budget {args.profile}: {len(contestants)} contestants against {reference / 1e6:.3f} MFLOP/token; "
          f"{out}")


if __name__ == "__main__":
    main(sys.argv[1:])
