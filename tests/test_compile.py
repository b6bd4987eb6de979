"""`SegmentLM.compile_model` (`repro fit --run.compile true`, `repro bench --compile`) against the eager model.

Follows the rule that a compiled path equals the eager one: the same tiny configs are trained for three segments
with the memory carried, once eager and once compiled, from the same weights and inputs, in float32 with dropout
off; every segment's loss and every parameter's gradient agree to 1e-5 (relative to the gradient's largest
entry), and the state dict keeps its keys (checkpoints load either way). The Transformer-XL parity test
(`tests/parity/test_transformer_xl_parity.py`) also runs the compiled layers against the authors' gradients.
`repro fit --run.compile true` of one model of each paper (the ∞-former's sorting model and its GPT-2 too) gives
the eager fit's losses (slow tier). With `REPRO_TEST_DEVICE=cuda` the same checks run on a GPU, where the attention
kernel is the fused one.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from repro.cli.cli import build
from repro.lm import MemorySettings

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {
    "transformer_xl": ["configs/transformer_xl/tiny/enwik8_12l.yaml", "--model.init_args.model.n_layer", "2"],
    "lamemo": ["configs/lamemo/tiny/char_lamemo.yaml", "--model.init_args.model.n_layer", "2"],
    "mgk": ["configs/mgk/tiny/wt103_mgk4.yaml", "--model.init_args.model.n_layer", "2"],
}


def _module(name: str):
    config, *overrides = CONFIGS[name]
    cli = build([config], overrides + ["--model.init_args.model.dropout", "0.0"])
    module = cli.model.float()
    cli.datamodule.setup("fit")
    return module, cli.datamodule


def _train(module, batches, lengths: MemorySettings, *, graphs: bool = False):
    """Loss and gradients of each segment, the memory carried (detached) between segments; with `graphs` (CUDA
    graphs) each segment marked as a new step and the memory copied out of the graphs' pool, as `repro bench`
    does."""
    out, mems = [], None
    module.train()
    for x, y in batches:
        module.zero_grad(set_to_none=True)
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        hidden, mems = module(x, mems, lengths)
        if graphs:
            mems = [m.clone() for m in mems]
        loss = module.model.nll(hidden, y).mean()
        loss.backward()
        out.append((loss.detach(), {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}))
    return out


# CUDA graphs (torch.compile's mode reduce-overhead) exist on a GPU only: that mode is collected under
# REPRO_TEST_DEVICE=cuda (on a CPU it is the default mode again)
MODES = [None] + (["reduce-overhead"] if torch.get_default_device().type == "cuda" else [])


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_compiled_model_trains_as_the_eager_one(name, mode):
    torch.manual_seed(0)
    module, dm = _module(name)
    device = torch.get_default_device()
    module.to(device)
    b, t = 2, dm.tgt_len
    stream = torch.randint(0, module.n_token, (b, 3 * t + 1), device=device)
    batches = [(stream[:, i * t : (i + 1) * t], stream[:, i * t + 1 : (i + 1) * t + 1]) for i in range(3)]
    compiled = copy.deepcopy(module)
    keys = list(compiled.state_dict())
    units = compiled.compile_model(mode=mode)
    assert units and list(compiled.state_dict()) == keys
    eager_runs = _train(module, batches, module.memory)
    compiled_runs = _train(compiled, batches, module.memory, graphs=mode == "reduce-overhead")
    for (loss_e, grads_e), (loss_c, grads_c) in zip(eager_runs, compiled_runs):
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-5)
        assert grads_c.keys() == grads_e.keys()
        for key, g in grads_e.items():
            scale = max(1.0, float(g.abs().max()))
            torch.testing.assert_close(grads_c[key] / scale, g / scale, rtol=1e-5, atol=1e-5, msg=key)
    compiled.compile_model(undo=units)
    assert all(unit._compiled_call_impl is None for unit in units)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_compiled_model_evaluates_as_the_eager_one(mode):
    """Transformer-XL's evaluation (the key/value memory, no gradients) over three segments: the same NLL."""
    torch.manual_seed(0)
    module, dm = _module("transformer_xl")
    device = torch.get_default_device()
    module.to(device).eval()
    b, t = 2, dm.eval_tgt_len
    stream = torch.randint(0, module.n_token, (b, 3 * t + 1), device=device)
    compiled = copy.deepcopy(module)
    compiled.compile_model(mode=mode)
    graphs = mode == "reduce-overhead"
    nll = {}
    for name, m in (("eager", module), ("compiled", compiled)):
        mems, out = None, []
        with torch.inference_mode():
            for i in range(3):
                if graphs and name == "compiled":
                    torch.compiler.cudagraph_mark_step_begin()
                x, y = stream[:, i * t : (i + 1) * t], stream[:, i * t + 1 : (i + 1) * t + 1]
                hidden, mems = m(x, mems, module.eval_memory, kv_memory=True)
                if graphs and name == "compiled":
                    mems = [k.clone() for k in mems]
                out.append(m.model.nll(hidden, y).clone())
        nll[name] = torch.stack(out)
    torch.testing.assert_close(nll["compiled"], nll["eager"], rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_run_compile_and_attention_options_reach_the_model(monkeypatch):
    """`--run.compile` compiles the module's units before the run starts, `cudagraphs` in torch.compile's
    reduce-overhead mode; `--run.attention` sets the attention kernel; both are off (eager, auto) by default."""
    from repro.cli.lightning_cli import ReproCLI

    seen = {}

    def record(self, sub):  # what the run would start with, after the checks and set-up of `before_fit`
        self.before_fit()
        seen[tuple(self.config_init[sub]["run"].get(k) for k in ("compile", "attention"))] = (
            [layer._compiled_call_impl is not None for layer in self.model.model.layers],
            self.model._graphs is not None, {layer.attn.kernel for layer in self.model.model.layers})

    monkeypatch.setattr(ReproCLI, "_run_subcommand", record)
    base = ["fit", "-c", CONFIGS["transformer_xl"][0], "--run.tracking", "none", "--model.init_args.model.n_layer", "2"]
    for extra in ([], ["--run.compile", "true", "--run.attention", "sdpa"], ["--run.compile", "cudagraphs"]):
        ReproCLI(args=base + extra)
    assert seen[(False, "auto")] == ([False, False], False, {"auto"})
    assert seen[(True, "sdpa")] == ([True, True], False, {"sdpa"})
    assert seen[("cudagraphs", "auto")] == ([True, True], True, {"auto"})


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_the_whole_model_compiled_trains_as_the_eager_one(mode):
    """`compile_model(whole=True)`: one graph of Transformer-XL's whole forward (embedding, layers, memory update)
    instead of one per layer; the same losses and gradients over three segments."""
    torch.manual_seed(0)
    module, dm = _module("transformer_xl")
    device = torch.get_default_device()
    module.to(device)
    b, t = 2, dm.tgt_len
    stream = torch.randint(0, module.n_token, (b, 3 * t + 1), device=device)
    batches = [(stream[:, i * t : (i + 1) * t], stream[:, i * t + 1 : (i + 1) * t + 1]) for i in range(3)]
    compiled = copy.deepcopy(module)
    assert compiled.compile_model(mode=mode, whole=True) == [compiled.model]
    for (loss_e, grads_e), (loss_c, grads_c) in zip(_train(module, batches, module.memory),
                                                    _train(compiled, batches, module.memory,
                                                           graphs=mode == "reduce-overhead")):
        torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-5)
        for key, g in grads_e.items():
            scale = max(1.0, float(g.abs().max()))
            torch.testing.assert_close(grads_c[key] / scale, g / scale, rtol=1e-5, atol=1e-5, msg=key)


FITS = {  # one model of each paper through `repro fit` (3 steps, float32, dropout as configured), n_layer 2
    "transformer_xl": ["configs/transformer_xl/tiny/enwik8_12l.yaml", "--trainer.limit_val_batches", "2"],
    "lamemo": ["configs/lamemo/tiny/char_lamemo.yaml", "--trainer.limit_val_batches", "2"],
    "mgk": ["configs/mgk/tiny/wt103_mgk4.yaml", "--trainer.limit_val_batches", "2"],
    "infinity_former_sorting": ["configs/infinity_former/tiny/sort_256_infty.yaml",
                                "--trainer.limit_val_batches", "8"],
    "infinity_former_gpt2": ["configs/infinity_former/tiny/gpt2_lm_inftyformer.yaml",
                             "--trainer.limit_val_batches", "2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FITS))
def test_every_paper_model_fits_compiled_as_eager(name, tmp_path, monkeypatch):
    """`repro fit --run.compile true` against the same fit eager, for one model of each paper (the ∞-former's
    sorting model and its GPT-2, whose whole model is the compiled unit): the training and validation losses of the
    run records agree to 1e-5 (float32, the same seed, so the same dropout draws)."""
    import json

    from repro.cli.entry import main

    monkeypatch.chdir(ROOT)
    config, *extra = FITS[name]
    layers = [] if "gpt2" in name else ["--model.init_args.model.n_layer", "2"]
    metrics = {}
    for compiled in ("false", "true"):
        record = tmp_path / f"{compiled}.json"
        main(["fit", "-c", config, *extra, *layers, "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
              "--trainer.precision", "32-true", "--run.tracking", "none", "--run.compile", compiled,
              "--run.record", str(record)])
        metrics[compiled] = json.loads(record.read_text())["metrics"]
    keys = [k for k in ("train/loss", "val/loss") if k in metrics["false"]]
    assert "val/loss" in keys
    for key in keys:
        assert metrics["true"][key] == pytest.approx(metrics["false"][key], rel=1e-5, abs=1e-5), key
