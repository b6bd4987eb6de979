"""What a fit of a config costs, estimated on the meta device without training: its parameters, the disk of its
checkpoint and a peak-memory figure, recorded beside each rehearsal stage's measured peak and checked against it in CI
(tests/test_config_estimates.py): a config whose model, batch, segment or memory grows is caught by name before a
machine runs out of memory, without a rehearsal.

Follows `repro.cli.disk` (the models built on the meta device by `repro.cli.cli.build`, a fraction of a second each)
for the parameters and the checkpoint's bytes. The peak figure is a model of what a training step holds, not a
measurement: the weights with their gradients and Adam's two moments (16 bytes a float32 parameter), the carried
memory (`repro.cli.disk.memory_bytes`), and each layer's activations for one batch: the hidden states
(`ACTIVATION_WIDTHS` vectors of d_model and one of d_inner a token) and the attention scores (`SCORE_COPIES` of
n_head × (tgt_len + mem_len) a token), float32, where the module and data module name those sizes (else the state
alone). What is checked is its growth: the measured peak of the last rehearsal scaled by the estimate's ratio now to
then (`predicted_peak`).
"""

from __future__ import annotations

from pathlib import Path

from repro.cli.disk import _split, checkpoint_bytes, in_child, memory_bytes

# bytes of one float32 trained parameter during a step: the weight, its gradient, Adam's exp_avg and exp_avg_sq
STATE_BYTES_PER_PARAMETER = 16
# vectors of d_model a token and layer kept for the backward pass: the input, layer norm, q, k, v, attention output,
# the residual sum and the feed-forward output
ACTIVATION_WIDTHS = 8
# the attention scores, their softmax and the dropout mask
SCORE_COPIES = 3
# the growth, above the estimate recorded with a rehearsal's measurement, that fails the check
TOLERANCE = 0.10


def _int(x) -> int:
    return x if isinstance(x, int) and not isinstance(x, bool) else 0


def estimate(module, datamodule) -> dict:
    """{parameters, disk_bytes, peak_bytes} of one fit (see the module's docstring)."""
    params = dict(module.named_parameters())
    n = sum(p.numel() for p in params.values())
    trained = sum(p.numel() for p in params.values() if p.requires_grad)
    carried = memory_bytes(module, datamodule)
    cfg = getattr(getattr(module, "model", None), "cfg", None)
    layers, width = _int(getattr(cfg, "n_layer", 0)), _int(getattr(cfg, "d_model", 0))
    inner, heads = _int(getattr(cfg, "d_inner", 0)), _int(getattr(cfg, "n_head", 0))
    batch, tgt = _int(getattr(datamodule, "batch_size", 0)), _int(getattr(datamodule, "tgt_len", 0))
    mem = _int(getattr(getattr(module, "memory", None), "mem_len", 0))
    per_token = ACTIVATION_WIDTHS * width + inner + SCORE_COPIES * heads * (tgt + mem)
    activations = layers * batch * tgt * per_token * 4
    return {"parameters": n, "disk_bytes": checkpoint_bytes(module) + carried,
            "peak_bytes": trained * STATE_BYTES_PER_PARAMETER + (n - trained) * 4 + carried + activations}


def estimates_of(steps: list[list[str]]) -> dict[str, dict]:
    """{config: estimate} of the fits among command lines (`fit -c A.yaml …`, as `repro runs` builds them), keyed by
    the first config file; a config fitted twice (seeds) keeps the larger figures."""
    # heavy: torch and Lightning, which the rehearsal's parent imports this module without
    from repro.cli.cli import build  # heavy: Lightning

    out: dict[str, dict] = {}
    for args in steps:
        if not args or args[0] != "fit":
            continue
        configs, rest = _split(args)
        cli = build(configs, rest, meta=True)
        got = estimate(cli.model, cli.datamodule)
        key = str(configs[0])
        out[key] = {k: max(v, out.get(key, {}).get(k, 0)) for k, v in got.items()}
    return out


def estimates_in_child(groups: dict[str, list[list[str]]], *, cwd: str | Path | None = None) -> dict[str, dict]:
    """`estimates_of` of each named group of command lines, in a fresh interpreter (the rehearsal's parent stays
    without torch); its error as a ValueError."""
    code = ("import json, sys\nfrom repro.cli.estimate import estimates_of\n"
            "print(json.dumps({k: estimates_of(v) for k, v in json.load(sys.stdin).items()}))")
    return in_child(code, groups, what="estimating the configs", cwd=cwd)


def predicted_peak(measured_mb: float, recorded: dict, now: dict) -> float:
    """The stage's measured peak (MiB) scaled by the growth of the config's estimate since it was measured."""
    return measured_mb * now["peak_bytes"] / max(1, recorded["peak_bytes"])


def over(recorded: dict, now: dict) -> list[str]:
    """The figures of `now` more than `TOLERANCE` above `recorded` (both `estimate`s): "peak_bytes", …"""
    return [k for k in ("parameters", "peak_bytes", "disk_bytes") if now[k] > recorded[k] * (1 + TOLERANCE)]


def failures(recorded_steps: list[dict], now: dict[str, dict[str, dict]]) -> list[str]:
    """One line for each config whose estimate grew more than `TOLERANCE` above the one recorded with its step's
    measurement: the config, the figure, both numbers, and the step's measured peak scaled to it. `recorded_steps`:
    the summary's steps (`configs` holds their estimates); `now`: {step: {config: estimate}}, as `estimates_of`."""
    lines = []
    for step in recorded_steps:
        for config, then in step.get("configs", {}).items():
            est = now.get(step["stage"], {}).get(config)
            if est is None:
                continue
            for key in over(then, est):
                if key == "peak_bytes":
                    lines.append(f"{config}: estimated peak {est[key] / 2**30:.2f} GiB against {then[key] / 2**30:.2f} "
                                 f"GiB when {step['stage']} measured {step['peak_rss_mb'] / 1024:.1f} GiB; that "
                                 f"stage now predicts {predicted_peak(step['peak_rss_mb'], then, est) / 1024:.1f} GiB")
                elif key == "disk_bytes":
                    lines.append(f"{config}: estimated checkpoint {est[key] / 1e9:.2f} GB against "
                                 f"{then[key] / 1e9:.2f} GB at {step['stage']}'s last rehearsal")
                else:
                    lines.append(f"{config}: {est[key]:,} parameters against {then[key]:,} at {step['stage']}'s last "
                                 f"rehearsal")
    return lines
