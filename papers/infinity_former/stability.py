"""Whether an LTM geometry keeps its memory bounded: the gain of the unbounded-memory update (∞-former §3.2).

Each update re-reads the carried signal at `n_samples` points, contracts them into [0, τ] and fits the basis again
together with the new vectors. With no new input the coefficients B follow a linear map, B_new = G_oldᵀ Ψ B,
with Ψ (M × N) the basis at the M linear sample points and G_old the rows of the update's ridge matrix G
(`ContinuousLTM.ridge_G`) that weigh the old samples. Its spectral radius is the factor by
which the carried memory grows (> 1) or fades (< 1) per update. The paper's geometries fade (0.53 for N = 256 …
2048 with 512 samples and widths 0.01 / 0.05); a geometry whose sample count matches its centres per width while
the basis is narrow against their spacing amplifies: N = 32 with 16 samples multiplies the memory by 5.5 per
update, which is what made the small profile's linear ∞-former fail at length 512 (papers/infinity_former/README.md).

Not in the paper or the official code: a check of configurations, with a command (`repro ltm-gain`); the LTM
itself prints one warning line per process when it builds an update whose gain exceeds 1
(`ContinuousLTM.update_gain`, where the computation lives). Sticky memories draw their sample points from the
attention, so their gain varies from update to update; the linear sampling's gain is reported for them as a
reference.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml


def ltm_config(ltm: dict):
    """`LTMConfig` from a config's `ltm` mapping (YAML lists as tuples)."""
    from papers.infinity_former.ltm import LTMConfig  # heavy: torch

    return LTMConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in ltm.items()})


def update_gain(ltm: dict, n_new: int) -> float:
    """The gain per update of a config's LTM settings (`ltm`, as in a config) with n_new vectors per update, from
    the matrices `ContinuousLTM` itself uses (`ContinuousLTM.update_gain`)."""
    from papers.infinity_former.ltm import ContinuousLTM  # heavy: torch

    cfg = ltm_config(ltm)
    module = ContinuousLTM(d_model=1, n_head=1, d_head=1, cfg=cfg)
    # G built directly, not through `ridge_G`, whose run-time warning would repeat what the caller reports
    return module.update_gain(n_new, module._build_G("update", cfg.n_samples, n_new, "cpu"))


def _ltm_and_new(config: dict) -> tuple[dict | None, int | None]:
    """The config's LTM settings and how many vectors enter the LTM per update (the segment or block length)."""
    init = (config.get("model") or {}).get("init_args") or {}
    ltm = init.get("ltm") or ((init.get("memory_hook") or {}).get("args") or {}).get("ltm")
    data = (config.get("data") or {}).get("init_args") or {}
    return ltm, data.get("tgt_len") or data.get("block_size")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="repro ltm-gain", description=HELP)
    parser.add_argument("config", nargs="+", help="∞-former configs (configs/infinity_former/<profile>/*.yaml)")
    parser.add_argument("--new", type=int, default=None,
                        help="vectors entering the LTM per update (default: the config's tgt_len or block_size)")
    args = parser.parse_args(argv)
    if args.new is not None and args.new <= 0:
        raise SystemExit(f"--new must be positive, got {args.new}")
    for path in args.config:
        if not Path(path).is_file():
            raise SystemExit(f"{path}: no such config file; give the path of a YAML config")
    for path in args.config:
        ltm, n_new = _ltm_and_new(yaml.safe_load(Path(path).read_text()) or {})
        if ltm is None:
            override = " (an evaluation override: give its training config)" if path.endswith(".eval.yaml") else ""
            print(f"{path}: no long-term memory{override}", flush=True)
            continue
        n_new = args.new or n_new
        if not n_new:
            print(f"{path}: cannot tell how many vectors enter the LTM per update: give --new N", flush=True)
            continue
        try:
            cfg = ltm_config(ltm)
        except (TypeError, ValueError) as err:
            raise SystemExit(f"{path}: its ltm settings are not an LTMConfig ({err}); fix them") from None
        gain = update_gain(ltm, n_new)
        widths = "/".join(f"{w:g}" for w in cfg.widths)
        verdict = "fades" if gain < 1 else "GROWS: the carried memory is amplified at every update"
        sticky = " (sticky sampling: linear-sample reference)" if cfg.sampling == "sticky" else ""
        print(f"{path}: N {cfg.n_basis}, widths {widths}, {cfg.n_samples} samples, "
              f"{n_new} new per update: gain {gain:.3f} per update{sticky}, {verdict}", flush=True)


HELP = "the ∞-former LTM update's gain per update (> 1: the memory grows without bound)"
