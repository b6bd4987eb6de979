"""Every file in configs/ builds its model and data module (no training); paper configs match the paper's sizes."""

from pathlib import Path

import pytest

from repro.cli.commands import describe_configs

ROOT = Path(__file__).resolve().parent.parent
# configs/rehearsal/ holds overrides composed after a paper config (tests/test_rehearsal.py builds them so);
# claims.yaml holds a profile's pre-registered claims (repro/claims.py), not a config. The paper profile's training
# configs are built by tests/test_rehearsal.py, which checks the same row of each (`check_row`) beside its rehearsal.
ALL = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "configs").rglob("*.yaml")
             if p.parent.name != "rehearsal" and p.name != "claims.yaml")
PAPER_TRAINING = [c for c in ALL if Path(c).parent.name == "paper" and ".eval." not in c]
CONFIGS = [c for c in ALL if c not in PAPER_TRAINING]


def check_row(config: str, row: dict) -> None:
    """What `repro describe` must say of every config: its size, paper, experiment and profile, and a corpus that is
    offline in the tiny and small profiles and real in the paper profile."""
    assert row["parameters"] > 0 and row["paper"] and row["experiment"] and row["profile"]
    if "/tiny/" in config or "/small/" in config:  # offline: the embedded corpora, or generated tasks (sorting)
        assert row["profile"] == Path(config).parent.name and row["corpus"].startswith(("embedded-", "sorting-"))
    else:
        assert row["profile"] == "paper" and not row["corpus"].startswith("embedded-")


def test_there_are_configs():
    assert any("/paper/" in c for c in CONFIGS) and any("/tiny/" in c for c in CONFIGS)
    assert len(PAPER_TRAINING) >= 90  # left to tests/test_rehearsal.py


@pytest.mark.parametrize("config", CONFIGS)
def test_config_builds(config, monkeypatch):
    monkeypatch.chdir(ROOT)
    check_row(config, describe_configs([config])[0])  # an *.eval.yaml is built on top of its training config


# The paper's parameter counts (Tables 1-3). WikiText-103 large is the exception documented in
# papers/transformer_xl/README.md: the official 18-layer script builds 285.2M parameters, not 257M.
@pytest.mark.parametrize("experiment,within", [("wt103_base", 0.01), ("enwik8_12l", 0.01), ("enwik8_24l", 0.01),
                                               ("text8_24l", 0.01), ("wt103_large", 0.12)])
def test_paper_parameter_counts(experiment, within, monkeypatch):
    monkeypatch.chdir(ROOT)
    row = describe_configs([f"configs/transformer_xl/paper/{experiment}.yaml"])[0]
    assert abs(row["ratio_to_paper"] - 1) < within, row
