"""Regenerate the ∞-former parity fixtures from a checkout of deep-spin/infinite-former:
`python tests/parity/make_infinity_former.py CHECKOUT`.

Follows the shared convention of `tests/parity/common.py`. The authors' three copies of `LongTermAttention` are
imported from CHECKOUT with run-time shims only (none of their code is copied here):
- `sorting/long_term_attention.py` (the sorting model's LTM), from the `sorting/` folder as their script does;
- `finetune_gpt2/src/transformers/models/gpt2/long_term_attention.py` (GPT-2 language modelling, Table 1) and
  `document_grounded_generation/transformers/src/transformers/models/gpt2/long_term_attention.py` (dialogue,
  Table 2): each folder is loaded as a stand-alone package (its relative imports `.basis_functions`, ... resolve
  inside it) without importing their patched `transformers`.
Shims: a stub `entmax` module (imported, used only by sparsemax, which no case runs); `self.device = 'cuda'` is
honoured on CPU by mapping the device 'cuda' to 'cpu' in `Tensor.to` while their constructor runs, then setting
the module's `device` to 'cpu'; the sorting module's `share_mask` (read, never set: the official defect) is set
to False, so that its CNN gate (`mask_type='cnn'`) is built as the sorting settings intend.

Each case builds their module with small shapes (d = H·E = 8, N = 16 basis functions, 16 vectors per update;
their hard-coded 512 samples of the old signal and τ, ridge and RBF widths of each copy), re-draws every weight
large (`enlarge_` with std 0.3: at 0.2, swapping two of the gate's biases moved the sorting output by only 98×
the tolerance), and runs fp32 over 4 steps (a first fit, then 3 unbounded-memory updates) with fixed random
memory vectors and queries. Saved per case (`tests/parity/infinity_former/<case>.pt`): their state dict
(`weight.*`), the inputs (`input.k`: (steps, B, L, d) batch-first; `input.q`: (steps, B, H, T, E)), and after each
step the output (`output.context`: (steps, B, T, d)), their KL term (`output.kl`: (steps, B, H·T)) and the carried
coefficients B (`output.B`: (steps, B, N, d), their `B_past`). Sticky cases also hold the sample points their
update drew (`output.sample_points`: (steps − 1, B, 512), recorded from their `batch_evaluate` calls) and the
bin probabilities they drew them from (`output.bin_probs`: (steps − 1, B, 128), recorded from the `Categorical`
they build), so that the test can feed the same points to our module.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.parity.common import HERE, checkout_commit, enlarge_, on_path, save_fixture  # noqa: E402

OUT = HERE / "infinity_former"
H, E, N, L, T, STEPS = 2, 4, 16, 16, 5, 4
D = H * E

CASES = {
    # the sorting LTM: σ² ≥ 1e-6, widths (.01, .05), ridge 1, τ 0.75, KL without a μ term (mu_0 None)
    "sorting": dict(copy="sorting", batch=2, sticky=False),
    # GPT-2 language modelling (Table 1): σ² ≥ 1e-4, widths (.005, .01), ridge .5, τ .5, KL with mu_0 = −1
    "gpt2_lm": dict(copy="finetune_gpt2", batch=2, sticky=False, mu_0=-1.0),
    "gpt2_lm_sticky": dict(copy="finetune_gpt2", batch=2, sticky=True, mu_0=-1.0),
    # the σ² floor: the σ² affine scaled ×50 so that many queries fall below 1e-4 (clamped) and others do not
    "gpt2_lm_floor": dict(copy="finetune_gpt2", batch=2, sticky=False, mu_0=-1.0, sigma_scale=50.0),
    # document-grounded dialogue (Table 2): batch 1 (hard-coded there), KL without a μ term
    "dialogue": dict(copy="document_grounded_generation", batch=1, sticky=False),
    "dialogue_sticky": dict(copy="document_grounded_generation", batch=1, sticky=True),
}
GPT2_DIRS = {
    "finetune_gpt2": "finetune_gpt2/src/transformers/models/gpt2",
    "document_grounded_generation": "document_grounded_generation/transformers/src/transformers/models/gpt2",
}


@contextmanager
def _cuda_on_cpu():
    """Their constructors move tensors `.to('cuda')`: map that device to the CPU while they run."""
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple("cpu" if isinstance(a, str) and a.startswith("cuda") else a for a in args)
        if isinstance(kwargs.get("device"), str) and kwargs["device"].startswith("cuda"):
            kwargs["device"] = "cpu"
        return original(self, *args, **kwargs)

    torch.Tensor.to = to
    try:
        yield
    finally:
        torch.Tensor.to = original


def _stub_entmax():
    if "entmax" not in sys.modules:
        stub = types.ModuleType("entmax")
        for name in ("Sparsemax", "Entmax15", "EntmaxBisect"):
            setattr(stub, name, type(name, (), {}))
        sys.modules["entmax"] = stub


def _load_gpt2_copy(checkout: Path, copy: str):
    """Their gpt2 model folder as a stand-alone package `_official_<copy>` (its long_term_attention module)."""
    folder = checkout / GPT2_DIRS[copy]
    name = f"_official_{copy}"
    pkg = types.ModuleType(name)
    pkg.__path__ = [str(folder)]
    sys.modules[name] = pkg
    spec = importlib.util.spec_from_file_location(f"{name}.long_term_attention", folder / "long_term_attention.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _build(checkout: Path, case: dict):
    _stub_entmax()
    common = dict(head_size=E, length=L, target_len=L, attn_func="softmax", attn_num_basis=N, n_layers=1,
                  n_heads=H, kl_regularizer=True, sigma_0=0.05)
    if case["copy"] == "sorting":
        with on_path(checkout / "sorting"):
            import long_term_attention as lta

            lta.LongTermAttention.share_mask = False  # read by their constructor, never set (official defect)
            with _cuda_on_cpu():
                m = lta.LongTermAttention(**common, attn_drop=0.0, infinite_memory=True, d_model=D, mask=True,
                                          mask_type="cnn", mu_0=None)
            dist = None
    else:
        lta = _load_gpt2_copy(checkout, case["copy"])
        extra = dict(mask=True, sticky_memories=case["sticky"])
        if case["copy"] == "finetune_gpt2":
            extra.update(continuous=True, attn_drop=0.0, infinite_memory=True, affines=True, mask_type="cnn",
                         mask_dropout=0.0, mu_0=case["mu_0"])
        with _cuda_on_cpu():
            m = lta.LongTermAttention(**common, **extra)
        dist = lta.dist if case["sticky"] else None
    m.device = "cpu"
    return m, dist


def make_case(checkout: Path, name: str, case: dict, commit: str) -> None:
    torch.manual_seed(0)
    m, dist = _build(checkout, case)
    m.eval()
    enlarge_(m, std=0.3, seed=1)
    if "sigma_scale" in case:
        with torch.no_grad():
            m.sigma.weight.mul_(case["sigma_scale"])
    b = case["batch"]
    g = torch.Generator().manual_seed(2)
    k_all = torch.randn(STEPS, b, L, D, generator=g)
    q_all = torch.randn(STEPS, b, H, T, E, generator=g)

    points, probs = [], []
    if case["sticky"]:  # record the sample points and the bin probabilities their update draws from
        basis = m.psi[m.length][0]
        original_eval = basis.batch_evaluate
        basis.batch_evaluate = lambda t: (points[-1].append(t.clone()), original_eval(t))[1]
        original_cat = dist.Categorical

        class Recording(original_cat):
            def __init__(self, p=None, *args, **kwargs):
                if p is not None and p.dim() == 2 and p.shape[-1] == 128:
                    probs.append(p.detach().clone())
                super().__init__(p, *args, **kwargs)

        dist.Categorical = Recording
    contexts, kls, coefs = [], [], []
    torch.manual_seed(3)  # their sticky sampling draws from torch's global generator
    try:
        with torch.no_grad():
            for s in range(STEPS):
                if case["sticky"] and s:
                    points.append([])
                if case["copy"] == "sorting":  # time-first inputs, queries (qlen, B, H·E)
                    k = k_all[s].transpose(0, 1)
                    q = q_all[s].permute(2, 0, 1, 3).reshape(T, b, D)
                    context, kl = m(k, q, new_doc=(s == 0))
                    context = context.transpose(0, 1)
                elif case["copy"] == "finetune_gpt2":
                    context, kl = m(k_all[s], q_all[s])
                else:
                    context, kl = m(k_all[s], q_all[s], new_doc=(s == 0))
                contexts.append(context)
                kls.append(kl)
                coefs.append(m.B_past.clone())
    finally:
        if case["sticky"]:
            dist.Categorical = original_cat
            basis.batch_evaluate = original_eval
    tensors = {f"weight.{k}": v for k, v in m.state_dict().items()}
    tensors.update({"input.k": k_all, "input.q": q_all, "output.context": torch.stack(contexts),
                    "output.kl": torch.stack(kls), "output.B": torch.stack(coefs)})
    if case["sticky"]:
        tensors["output.sample_points"] = torch.stack([torch.stack(p) for p in points])
        tensors["output.bin_probs"] = torch.stack(probs)
    meta = {"repo": "deep-spin/infinite-former", "commit": commit, "case": name, "copy": case["copy"],
            "n_head": H, "d_head": E, "n_basis": N, "length": L, "queries": T, "steps": STEPS,
            "n_samples": m.nb_samples, "tau": m.tau, "ridge": m.ridge_penalty, "mu_0": case.get("mu_0"),
            "sticky": case["sticky"]}
    save_fixture(OUT / f"{name}.pt", tensors, meta)
    print(f"{name}: {sum(v.numel() for v in tensors.values())} numbers")


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python tests/parity/make_infinity_former.py /path/to/infinite-former")
    checkout = Path(sys.argv[1]).resolve()
    commit = checkout_commit(checkout)
    for name, case in CASES.items():
        make_case(checkout, name, case, commit)


if __name__ == "__main__":
    main()
