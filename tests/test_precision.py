"""bf16 autocast through float32 products on CPUs without bf16 kernels (`repro.precision`).

The replacement is installed for a whole process, so the checks that need it installed run in a child process
(`force=True`, whatever this CPU has): its products against a float64 reference of the same bf16-rounded operands
and against PyTorch's own bf16 kernels, forward and backward."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from repro import precision

CHILD = textwrap.dedent(
    """
    import json, torch
    import torch.nn.functional as F
    from repro import precision

    torch.manual_seed(0)
    x, w, bias = torch.randn(48, 96), torch.randn(80, 96), torch.randn(80)
    a, b, c = torch.randn(3, 20, 24), torch.randn(3, 24, 12), torch.randn(3, 20, 12)
    q, k, v = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 11, 16), torch.randn(2, 2, 11, 16)
    conv_x, conv_w = torch.randn(2, 6, 30), torch.randn(6, 6, 3)
    r = lambda t: t.to(torch.bfloat16).double()  # the operands autocast sees, exactly, in float64
    ops = {
        "linear": (lambda: F.linear(x, w, bias), lambda: r(x) @ r(w).T + r(bias)),
        "matmul": (lambda: x @ w.T, lambda: r(x) @ r(w).T),
        "bmm": (lambda: torch.bmm(a, b), lambda: r(a) @ r(b)),
        "baddbmm": (lambda: torch.baddbmm(c, a, b, alpha=0.5), lambda: r(c) + 0.5 * (r(a) @ r(b))),
        "einsum": (lambda: torch.einsum("bij,bjk->bik", a, b), lambda: r(a) @ r(b)),
        "conv1d": (lambda: F.conv1d(conv_x, conv_w, padding=1),
                   lambda: F.conv1d(r(conv_x), r(conv_w), padding=1)),
        "sdpa": (lambda: F.scaled_dot_product_attention(q, k, v),
                 lambda: torch.softmax(r(q) @ r(k).transpose(-1, -2) / 4.0, -1) @ r(v)),
    }

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return {name: f() for name, (f, _) in ops.items()}

    def grads():
        torch.manual_seed(1)
        net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
        inp = torch.randn(16, 32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = net(inp).float().square().mean()
        loss.backward()
        return [p.grad for p in net.parameters()]

    native, native_grads = run(), grads()
    assert precision.emulate_bf16_matmul(force=True)
    emulated, emulated_grads = run(), grads()
    out = {}
    for name, (_, ref) in ops.items():
        exact = ref()
        out[name] = {
            "dtype": [str(native[name].dtype), str(emulated[name].dtype)],
            "emulated_vs_exact": ((emulated[name].double() - exact).abs() / exact.abs().clamp_min(1)).max().item(),
            "native_vs_exact": ((native[name].double() - exact).abs() / exact.abs().clamp_min(1)).max().item(),
            "emulated_mean_err": (emulated[name].double() - exact).abs().mean().item(),
        }
    # the same products of the unrounded operands: autocast's rounding of the operands must show
    for name, f in {"linear": lambda: x.double() @ w.double().T + bias.double(),
                    "bmm": lambda: a.double() @ b.double()}.items():
        out[name]["unrounded_mean_err"] = (emulated[name].double() - f()).abs().mean().item()
    out["grads"] = max(((e - n).abs().max() / n.abs().max()).item() for e, n in zip(emulated_grads, native_grads))
    out["grad_dtypes"] = sorted({str(g.dtype) for g in emulated_grads})
    with torch.autocast("cpu", dtype=torch.float16):
        out["float16"] = str((x @ w.T).dtype)
    out["outside"] = str((x @ w.T).dtype)
    print(json.dumps(out))
    """
)


@pytest.mark.slow
def test_emulated_bf16_products_round_like_pytorchs_own_kernels():
    res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    for name in ("linear", "matmul", "bmm", "baddbmm", "einsum", "conv1d", "sdpa"):
        assert out[name]["dtype"] == ["torch.bfloat16", "torch.bfloat16"], name
        # one rounding to bf16 of a float32 sum: within bf16's half-ulp (2^-9) of the exact product, as PyTorch's
        assert out[name]["emulated_vs_exact"] <= 2**-8, (name, out[name])
        assert out[name]["native_vs_exact"] <= 2**-7, (name, out[name])  # its attention rounds twice
    for name in ("linear", "bmm"):  # nearer the product of the rounded operands than of the operands themselves
        assert out[name]["emulated_mean_err"] < 0.75 * out[name]["unrounded_mean_err"], (name, out[name])
    assert out["grads"] < 2e-2, out["grads"]  # bf16 gradients of the same net, two summation orders
    assert out["grad_dtypes"] == ["torch.float32"]
    assert out["float16"] == "torch.float16"  # another autocast dtype keeps PyTorch's rule
    assert out["outside"] == "torch.float32"  # no autocast: untouched


def test_nothing_is_replaced_where_the_cpu_has_bf16_kernels(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    monkeypatch.setattr(precision, "_installed", [])
    assert not precision.active()
    assert not precision.emulate_bf16_matmul()
    assert not precision.installed()


def test_repro_bf16_native_keeps_pytorchs_kernels(monkeypatch):
    monkeypatch.setattr(precision, "native_bf16", lambda: False)
    monkeypatch.setattr(precision, "_installed", [])
    monkeypatch.setenv("REPRO_BF16", "native")
    assert not precision.active()
    monkeypatch.delenv("REPRO_BF16")
    assert precision.active()


def test_every_replaced_operator_exists():
    for name in precision.OPS:
        base, _, overload = name.partition(".")
        assert hasattr(getattr(torch.ops.aten, base), overload or "default"), name


def test_the_command_installs_it_wherever_a_process_may_train():
    from repro.cli.entry import NO_TORCH, _starts_workers

    # `repro runs` trains in this process with one worker or one spec, and in each worker (`--queue`)
    assert _starts_workers(["runs", "--paper", "p", "--profile", "tiny", "--group", "g", "--jobs", "2", "a", "b"])
    assert not _starts_workers(["runs", "--paper", "p", "--jobs", "2", "a"])
    assert not _starts_workers(["runs", "--paper", "p", "a", "b"])
    assert not _starts_workers(["runs", "--jobs=2", "a", "b", "--queue", "/tmp/q"])
    assert not _starts_workers(["fit", "-c", "a.yaml"])
    assert not {"fit", "test", "runs", "bench", "recl", "generate", "steps"} & set(NO_TORCH)


def test_a_record_names_the_float32_products(monkeypatch):
    from repro.tracking import cpu_model

    monkeypatch.setattr(precision, "installed", lambda: True)
    assert cpu_model().endswith("bf16 products in float32)")
    monkeypatch.setattr(precision, "installed", lambda: False)
    assert "bf16 products in float32" not in cpu_model()
