"""The configs that turn a paper experiment into its rehearsal (`configs/rehearsal/`, composed after the experiment's
own): `repro rehearse` (`repro.cli.rehearsal`), `repro runs --rehearsal true` (`repro.cli.runs`) and `repro prepare
--rehearsal true` compose them. They sit below both commands (`repro.cli.rehearsal` re-exports them): the
rehearsal reads `repro runs`' groups to size its disk need, so `repro runs` must not import the rehearsal."""

from __future__ import annotations

from pathlib import Path

import yaml

REHEARSAL_CONFIGS = Path("configs") / "rehearsal"


def config_overrides(config: str | Path, *, root: Path = Path(".")) -> list[str]:
    """`-c` arguments that turn a paper experiment into its rehearsal: the trainer caps, then the file named after
    the config's data module (`configs/rehearsal/<DataModule>.yaml`), when there is one."""
    config = Path(config)
    cfg = yaml.safe_load(config.read_text()) or {}
    data_cls = str((cfg.get("data") or {}).get("class_path") or "").rsplit(".", 1)[-1]
    out = ["-c", str(root / REHEARSAL_CONFIGS / "trainer.yaml")]
    per_data = root / REHEARSAL_CONFIGS / f"{data_cls}.yaml"
    if data_cls and per_data.exists():
        out += ["-c", str(per_data)]
    # a sliding-window evaluation (every token scored from the window that ends at it) costs one forward pass of
    # the window per token: one evaluation batch exercises it (MGK's paper model spent 5 minutes on three)
    evals = [cfg, *(yaml.safe_load(p.read_text()) or {} for p in [config.with_suffix(".eval.yaml")] if p.exists())]
    if any(((c.get("model") or {}).get("init_args") or {}).get("eval_protocol", {}).get("kind") == "sliding"
           for c in evals):
        out += ["-c", str(root / REHEARSAL_CONFIGS / "sliding.yaml")]
    return out


def data_overrides(config: str | Path, *, root: Path = Path(".")) -> list[str]:
    """Config paths (no `-c`) of the data module's rehearsal file, for commands that build data alone."""
    args = config_overrides(config, root=root)
    return [a for a in args[1::2] if not a.endswith("trainer.yaml")]
