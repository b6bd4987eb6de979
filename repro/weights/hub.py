"""A trained model as researchers share it: a folder of settings (`config.json`), safetensors weights
(`model.safetensors`) and the vocabulary, which loads back in one line and goes to the Hugging Face Hub with one call:

    from repro.weights.hub import ExportedLM
    exported = ExportedLM.from_pretrained("exported/enwik8_12l")    # or "org/name" on the Hub
    exported.lm                                                     # the paper's LightningModule, weights loaded
    exported.push_to_hub("org/name")

Follows `huggingface_hub.PyTorchModelHubMixin` (its `save_pretrained`/`from_pretrained`/`push_to_hub`: the
constructor's arguments as `config.json`, the state dict as safetensors, tied weights stored once). Differs: what
is built is one of this repository's modules (`module_class`, a `repro.lm.SegmentLM` of a package at the
checkout's root, with the plain hyper-parameters it saves itself), never a class the file names elsewhere; the
vocabulary (`symbols`, in id order) or the pretrained tokenizer's name travels in the same config, so that a test
or a generation needs no corpus beside it. Written by `repro export`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from repro.lm import SegmentLM

ROOT = Path(__file__).resolve().parents[2]  # the checkout: the packages whose classes an export may name


def _ours(module: str) -> bool:
    top = module.split(".")[0]
    return bool(top) and top != "tests" and (ROOT / top / "__init__.py").is_file()


def resolve_module_class(path: str) -> type[SegmentLM]:
    """The LightningModule class `path` names, refused in one line unless it is a `SegmentLM` of one of this
    repository's packages."""
    mod, _, name = path.rpartition(".")
    if not _ours(mod):
        raise ValueError(f"an exported model's module_class must be one of this repository's packages ({ROOT}), "
                         f"not {path!r}")
    try:
        cls = getattr(importlib.import_module(mod), name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"module_class {path!r} does not exist in this checkout ({err})") from None
    if not (isinstance(cls, type) and issubclass(cls, SegmentLM)):
        raise ValueError(f"module_class {path!r} is not a repro.lm.SegmentLM")
    return cls


class ExportedLM(nn.Module, PyTorchModelHubMixin, library_name="repro-memory-transformers",
                 tags=["language-modeling", "memory"]):
    """A trained `SegmentLM` with what it needs to run alone (the module docstring).

    Args:
        module_class: the LightningModule's import path.
        hparams: its saved hyper-parameters (`module.hparams`: plain values), from which it is built.
        symbols: the vocabulary in id order (character and word corpora), or None.
        tokenizer: a pretrained tokenizer's name (the GPT-2 models), or None.
        run: what the training run was (paper, experiment, profile, corpus, MLflow run, test loss).
    """

    def __init__(self, module_class: str, hparams: dict, symbols: list[str] | None = None,
                 tokenizer: str | None = None, run: dict | None = None):
        super().__init__()
        cls = resolve_module_class(module_class)
        # `lm`, not `module`: the mixin saves and loads a `.module` attribute's weights alone (DataParallel's)
        self.lm = cls(**hparams)
        self.symbols, self.tokenizer, self.run = symbols, tokenizer, dict(run or {})
        n_token = getattr(self.lm, "n_token", None)
        if symbols is not None and n_token not in (None, len(symbols)):
            raise ValueError(f"the vocabulary has {len(symbols)} symbols, the model {n_token} outputs")

    def forward(self, *args, **kwargs):
        return self.lm(*args, **kwargs)
