"""The LTM update's gain (`papers/infinity_former/stability.py`, `repro ltm-gain`): the spectral radius it reports
against an independent measurement, the growth of the coefficients over repeated updates of `ContinuousLTM`
itself with nothing new entering; the paper configs' memories fade, the small profile's grow (README)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from papers.infinity_former.ltm import ContinuousLTM, LTMConfig
from papers.infinity_former.stability import update_gain

ROOT = Path(__file__).resolve().parents[1]


def measured_growth(ltm: dict, n_new: int, updates: int = 60) -> float:
    """Power iteration through `ContinuousLTM.update`: random coefficients, then updates whose new vectors are
    zero (no gate, so they stay zero); the norm ratio of the last update."""
    cfg = LTMConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in ltm.items()}, gate=False)
    module = ContinuousLTM(d_model=4, n_head=1, d_head=4, cfg=cfg)
    g = torch.Generator(device="cpu").manual_seed(0)
    coef = torch.randn(1, cfg.n_basis, 4, generator=g, dtype=torch.float32, device="cpu").to(torch.get_default_device())
    zeros = torch.zeros(1, n_new, 4)
    ratio = 0.0
    for _ in range(updates):
        new, _ = module.update(coef, zeros)
        ratio = (new.norm() / coef.norm()).item()
        coef = new / new.norm()  # keep it in range
    return ratio


@pytest.mark.parametrize("ltm, n_new", [
    (dict(n_basis=32, n_samples=16), 64),  # the small profile's sorting geometry
    (dict(n_basis=64, n_samples=32), 64),  # the tiny profile's
    (dict(n_basis=1024, n_samples=512, grid="official"), 1024),  # the paper's sorting
    (dict(n_basis=512, n_samples=512, widths=[0.005, 0.01], ridge=0.5, tau=0.5, grid="official"), 512),  # GPT-2
])
@pytest.mark.slow
def test_gain_is_the_measured_growth_per_update(ltm, n_new):
    gain = update_gain(ltm, n_new)
    assert measured_growth(ltm, n_new) == pytest.approx(gain, rel=1e-2)


@pytest.mark.slow
def test_paper_configs_fade_and_the_small_profile_grows():
    assert update_gain(dict(n_basis=1024, n_samples=512, grid="official"), 1024) < 0.6
    assert update_gain(dict(n_basis=32, n_samples=16), 64) > 5


@pytest.mark.slow
def test_command_reports_each_config():
    out = subprocess.run([sys.executable, "-m", "repro", "ltm-gain",
                          "configs/infinity_former/small/sort_512_infty.yaml",
                          "configs/infinity_former/paper/sort_8000_infty.yaml",
                          "configs/infinity_former/paper/sort_8000_txl.yaml"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(out) == 3
    assert "gain 5.476 per update, GROWS" in out[0]
    assert "gain 0.528 per update, fades" in out[1]
    assert out[2].endswith("no long-term memory")


@pytest.mark.slow
def test_command_refuses_a_missing_config():
    res = subprocess.run([sys.executable, "-m", "repro", "ltm-gain", "configs/nope.yaml"], cwd=ROOT,
                         capture_output=True, text=True)
    assert res.returncode != 0
    assert (res.stderr.strip().splitlines()[-1]
            == "configs/nope.yaml: no such config file; give the path of a YAML config")


def test_command_refuses_unknown_ltm_settings(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  init_args:\n    ltm: {n_basis: 32, n_sample: 16}\ndata:\n  init_args: {tgt_len: 64}\n")
    res = subprocess.run([sys.executable, "-m", "repro", "ltm-gain", str(bad)], cwd=ROOT, capture_output=True,
                         text=True)
    assert res.returncode != 0 and res.stdout == ""
    last = res.stderr.strip().splitlines()
    assert len(last) == 1
    assert last[0].startswith(f"{bad}: its ltm settings are not an LTMConfig (") and "n_sample" in last[0]


def test_a_growing_geometry_warns_once_per_process(capsys):
    # a ridge no other test uses, so that this geometry's G is built here
    growing = ContinuousLTM(d_model=4, n_head=1, d_head=4, cfg=LTMConfig(n_basis=32, n_samples=16, ridge=0.9991))
    growing.ridge_G("update", 16, 64, torch.get_default_device())
    first = capsys.readouterr().err.splitlines()
    ContinuousLTM(d_model=4, n_head=1, d_head=4, cfg=LTMConfig(n_basis=32, n_samples=16, ridge=0.9991)).ridge_G(
        "update", 16, 64, torch.get_default_device())
    fading = ContinuousLTM(d_model=4, n_head=1, d_head=4, cfg=LTMConfig(n_basis=32, n_samples=32, ridge=0.9991))
    fading.ridge_G("update", 32, 64, torch.get_default_device())
    assert len(first) == 1 and first[0].startswith("warning: ∞-former LTM with N 32, widths 0.01/0.05, 16 update "
                                                   "samples and 64 new vectors per update multiplies its memory by")
    assert capsys.readouterr().err == ""
