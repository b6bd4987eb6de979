"""Speed and memory of a language model, measured (never asserted in tests): the library of `repro bench`
(`repro.cli.bench` builds the model from its configs and writes the rows).

Modes:
- `train`: forward, backward, gradient clipping and an Adam step per segment, carrying the training memory.
- `eval`: forward passes under `torch.inference_mode` with the evaluation memory, clamp and same_length,
  after a first (untimed) pass that fills the memory, so that every timed segment sees a full memory.
- `slowdown` (Transformer-XL Table 9; the memory model reuses hidden states, as the paper's did, not the
  key/value memory that `eval` uses): per-token evaluation time of the vanilla model, which recomputes a whole
  window of L tokens for every prediction (Al-Rfou et al.), against memory reuse, which scores a segment of S
  tokens at once with L tokens of cached memory; reported for each attention length L.

Warm-up steps are excluded. `peak_memory_mb` is the CUDA allocator's peak on a GPU; on the CPU it is the
process's peak resident memory (the model, the data and the Python runtime included). `forward_tensor_peak_mb`,
on any device, is the peak of the tensors one forward pass creates (activations, attention scores; not the
weights, the input or the carried memory that existed before it), measured without gradients on one extra
untimed segment by `repro.memtrack.TensorPeak`. Tokens come from the config's corpus when it is built, otherwise they are drawn
from a Zipf distribution over the vocabulary (the vocabularies are frequency-sorted, so this exercises the
adaptive softmax clusters roughly as real text does); the output says which.
"""

from __future__ import annotations

import resource
import statistics
import time
from contextlib import nullcontext
from dataclasses import asdict

import torch

from repro.lm import MemorySettings


def _tokens(dm, n: int, *, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, str]:
    from repro.data.corpora import is_built, load_corpus

    name = getattr(dm, "corpus_name", None)
    if name and is_built(name, getattr(dm, "data_dir", None)):
        train = load_corpus(name, dm.data_dir).splits["train"]
        reps = -(-n // train.numel())
        return train.repeat(reps)[:n].long(), f"corpus:{name}"
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    probs = (1.0 / ranks) / (1.0 / ranks).sum()
    return torch.multinomial(probs, n, replacement=True, generator=generator), "zipf"


def _autocast(device: torch.device, precision: str):
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext()


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _peak_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def bench_module(module, dm, *, config: list[str], mode: str, precision: str = "32", steps: int = 10,
                 warmup: int = 3, batch_size: int | None = None, tgt_len: int | None = None, device: str | None = None,
                 attention_lengths: list[int] | None = None, segment: int = 32) -> list[dict]:
    """The rows of `repro bench` for a built `SegmentLM` and its data module (`config`: the files they came from,
    recorded in every row; `repro.cli.bench.bench` builds them)."""
    from repro.tracking import hardware

    if precision not in ("32", "bf16"):
        raise ValueError("--precision is 32 or bf16")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    module.to(dev)
    model = module.model
    g = torch.Generator().manual_seed(0)
    base = {"config": config, "mode": mode, "precision": precision, "device": hardware() if dev.type == "cpu"
            else torch.cuda.get_device_name(dev), "torch": torch.__version__,
            "parameters": sum(p.numel() for p in module.parameters())}
    if mode == "slowdown":
        return _slowdown(module, dm, dev, precision, steps, warmup, attention_lengths or [64, 128, 256, 512], segment,
                         g, base)
    train = mode == "train"
    b = batch_size or (dm.batch_size if train else dm.eval_batch_size)
    t = tgt_len or (dm.tgt_len if train else dm.eval_tgt_len)
    lengths: MemorySettings = module.memory if train else module.eval_memory
    n_steps = warmup + steps
    tokens, source = _tokens(dm, b * (t * (n_steps + 1) + 1), vocab=module.n_token, generator=g)
    streams = tokens[: b * (t * (n_steps + 1) + 1)].view(b, -1).to(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    times = []
    mems = None
    kv = (not train) and getattr(model, "supports_kv_memory", False)  # as `repro test` evaluates
    if train:
        module.train()
        opt = torch.optim.Adam(module.parameters(), lr=1e-4)
    else:
        module.eval()
        if lengths.mem_len > 0:  # time the steady state: a memory already full, as after the first segments
            prime, _ = _tokens(dm, b * lengths.mem_len, vocab=module.n_token, generator=g)
            with torch.inference_mode(), _autocast(dev, precision):
                _, mems = module(prime.view(b, -1).to(dev), None, MemorySettings(mem_len=lengths.mem_len),
                                 kv_memory=kv)
    def step(x, y):
        nonlocal mems
        if train:
            with _autocast(dev, precision):
                hidden, mems = module(x, mems, lengths)
                loss = model.nll(hidden, y).mean()
                aux = module.extra_loss()
                if aux:
                    loss = loss + sum(aux.values())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 0.25)
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode(), _autocast(dev, precision):
                hidden, mems = module(x, mems, lengths, kv_memory=kv)
                model.nll(hidden, y)

    for i in range(n_steps + 1):
        x, y = streams[:, i * t : (i + 1) * t], streams[:, i * t + 1 : (i + 1) * t + 1]
        if i == n_steps:  # one more forward pass, untimed, under the tensor tracker (it slows every operator)
            from repro.memtrack import TensorPeak

            with torch.no_grad(), _autocast(dev, precision), TensorPeak() as tracker:
                module(x, mems, lengths, kv_memory=kv)
            break
        _sync(dev)
        t0 = time.perf_counter()
        step(x, y)
        _sync(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    return [base | {
        "batch_size": b, "tgt_len": t, "memory": asdict(lengths), "tokens": source, "steps": steps,
        "warmup": warmup, "ms_per_step": round(med * 1e3, 2), "tokens_per_s": round(b * t / med, 1),
        "peak_memory_mb": round(_peak_mb(dev), 1), "forward_tensor_peak_mb": round(tracker.peak_mb, 1),
        "threads": torch.get_num_threads(),
    }]


def _slowdown(module, dm, dev, precision, steps, warmup, lengths, segment, g, base) -> list[dict]:
    model = module.model
    module.eval()
    out = []
    for L in lengths:
        tokens, source = _tokens(dm, L + segment * (warmup + steps + 1) + 1, vocab=module.n_token, generator=g)
        tokens = tokens.to(dev)[None]
        with torch.inference_mode(), _autocast(dev, precision):
            # memory reuse: fill a memory of L positions, then time segments of `segment` tokens
            mems = None
            _, mems = module(tokens[:, :L], mems, MemorySettings(mem_len=L))
            mem_times = []
            for i in range(warmup + steps):
                x = tokens[:, L + i * segment : L + (i + 1) * segment]
                _sync(dev)
                t0 = time.perf_counter()
                _, mems = module(x, mems, MemorySettings(mem_len=L, same_length=True))
                _sync(dev)
                if i >= warmup:
                    mem_times.append((time.perf_counter() - t0) / segment)
            # vanilla: one full window of L tokens per predicted token
            van_times = []
            for i in range(warmup + steps):
                x = tokens[:, i : i + L]
                _sync(dev)
                t0 = time.perf_counter()
                module(x, None, MemorySettings())
                _sync(dev)
                if i >= warmup:
                    van_times.append(time.perf_counter() - t0)
        m, v = statistics.median(mem_times), statistics.median(van_times)
        out.append(base | {"attention_length": L, "segment": segment, "tokens": source,
                           "memory_ms_per_token": round(m * 1e3, 4), "vanilla_ms_per_token": round(v * 1e3, 4),
                           "slowdown": round(v / m, 1), "steps": steps, "warmup": warmup})
    return out

