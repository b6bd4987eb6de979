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

Model-FLOPs utilisation (`mfu`, train and eval rows): the step's FLOPs over its median time and over the device's
peak for the precision. The FLOPs are counted once, on one extra untimed step at full memory, by
`torch.utils.flop_counter` (`repro.ops.timing.count_flops`: matrix products and attention, forward, and backward in
training), with the eager attention kernel whatever kernel is timed, so that every kernel and compiled form of a
model is divided by the same count. The peak comes from `PEAK_TFLOPS` (dense, the datasheets' figures without
sparsity) for known GPUs, and otherwise is measured (`repro.ops.timing.measured_peak_tflops`: the best of a few
large matrix products in the precision): on a CPU always, whose rate depends on its cores, clock and instructions.
float32 on a GPU counts against the plain float32 peak unless TF32 products are allowed
(`torch.backends.cuda.matmul.allow_tf32`), then against TF32's.

Options of the timed step: `compile` (`nn.Module.compile` of the model's compile units, as `repro fit
--run.compile true`: `SegmentLM.compile_model`; a string is torch.compile's mode, e.g. `reduce-overhead`), `attention`
(the kernel of `repro.nn.attention`), and the optimiser of the module's `configure_optimizers` (fused on a GPU). Warm-up
steps are excluded (with `compile`, they include the compilation of each memory length's graph). `peak_memory_mb` is the
CUDA allocator's peak on a GPU; on the CPU it is the process's peak resident memory (the model, the data and the Python
runtime included). `forward_tensor_peak_mb`, on any device, is the peak of the tensors one forward pass creates
(activations, attention scores; not the weights, the input or the carried memory that existed before it), measured
without gradients on one extra untimed segment by `repro.ops.memtrack.TensorPeak`. Tokens come from the config's corpus
when it is built, otherwise they are drawn from a Zipf distribution over the vocabulary (the vocabularies are
frequency-sorted, so this exercises the adaptive softmax clusters roughly as real text does); the output says which.
"""

from __future__ import annotations

import resource
import statistics
import sys
import time
from dataclasses import asdict

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity
from torch.profiler import profile as profiler

from repro.data.corpora import is_built, load_corpus
from repro.lm import MemorySettings
from repro.nn.attention import attention_kernel
from repro.ops.allocator import keep_freed_memory
from repro.ops.memtrack import TensorPeak
from repro.ops.timing import autocast, count_flops, measured_peak_tflops, sync
from repro.tracking import cpu_model, hardware


def _tokens(dm, n: int, *, vocab: int, generator: torch.Generator) -> tuple[torch.Tensor, str]:
    name = getattr(dm, "corpus_name", None)
    if name and is_built(name, getattr(dm, "data_dir", None)):
        train = load_corpus(name, dm.data_dir).splits["train"]
        reps = -(-n // train.numel())
        return train.repeat(reps)[:n].long(), f"corpus:{name}"
    ranks = torch.arange(1, vocab + 1, dtype=torch.float64)
    probs = (1.0 / ranks) / (1.0 / ranks).sum()
    return torch.multinomial(probs, n, replacement=True, generator=generator), "zipf"


def _peak_mb(device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# Dense peak TFLOP/s by GPU name (torch.cuda.get_device_name) and precision: the vendors' datasheets, without
# sparsity. "tf32" is float32 through the tensor cores (allowed by torch.backends.cuda.matmul.allow_tf32).
PEAK_TFLOPS = {
    "NVIDIA H200": {"bf16": 989.4, "tf32": 494.7, "32": 66.9},
    "NVIDIA H100 80GB HBM3": {"bf16": 989.4, "tf32": 494.7, "32": 66.9},  # SXM5
    "NVIDIA H100 PCIe": {"bf16": 756.0, "tf32": 378.0, "32": 51.2},
    "NVIDIA A100-SXM4-80GB": {"bf16": 312.0, "tf32": 156.0, "32": 19.5},
    "NVIDIA A100-SXM4-40GB": {"bf16": 312.0, "tf32": 156.0, "32": 19.5},
    "NVIDIA A100 80GB PCIe": {"bf16": 312.0, "tf32": 156.0, "32": 19.5},
    "NVIDIA L40S": {"bf16": 362.0, "tf32": 183.0, "32": 91.6},
    "NVIDIA L4": {"bf16": 121.0, "tf32": 60.0, "32": 30.3},
}


def peak_tflops(device: torch.device, precision: str) -> tuple[float, str]:
    """(peak TFLOP/s, where it comes from) for `precision` on `device`: `PEAK_TFLOPS` for a known GPU, otherwise
    `measured_peak_tflops`."""
    if device.type == "cuda":
        key = precision
        if precision == "32" and torch.backends.cuda.matmul.allow_tf32:
            key = "tf32"
        known = PEAK_TFLOPS.get(torch.cuda.get_device_name(device), {}).get(key)
        if known:
            return known, f"datasheet ({key})"
    return round(measured_peak_tflops(device, precision), 2), "measured (large matrix product)"


def environment(device: torch.device) -> dict:
    """What a benchmark record names besides its numbers: the device (GPU name, or the CPU with its instruction set
    and threads), the host CPU, torch and CUDA versions, and the command line."""
    return {"device": hardware() if device.type == "cpu" else torch.cuda.get_device_name(device),
            "host_cpu": cpu_model(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "command": "repro " + " ".join(sys.argv[1:]) if sys.argv and sys.argv[0].endswith("repro")
            else " ".join(sys.argv)}


def bench_module(module, dm, *, config: list[str], mode: str, precision: str = "32", steps: int = 10,
                 warmup: int = 3, batch_size: int | None = None, tgt_len: int | None = None, device: str | None = None,
                 attention_lengths: list[int] | None = None, segment: int = 32, compile: bool | str = False,
                 attention: str = "auto", mfu: bool = True, optimizer: str = "module", profile: int = 0) -> list[dict]:
    """The rows of `repro bench` for a built `SegmentLM` and its data module (`config`: the files they came from,
    recorded in every row; `repro.cli.bench.bench` builds them). `optimizer`: `module` (the module's own,
    `SegmentLM.make_optimizer`) or `foreach` (Adam's multi-tensor form on any device, the module's before it fused
    the update on a GPU). `profile` > 0: after the timed steps, three more under `torch.profiler`, and the row's
    `profile` lists the operators (kernels on a GPU) that took the most device time, that many."""
    if precision not in ("32", "bf16"):
        raise ValueError("--precision is 32 or bf16")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    module.to(dev)

    keep_freed_memory(parameters=sum(p.numel() for p in module.parameters()))  # as `repro fit` runs this model
    g = torch.Generator().manual_seed(0)
    base = {"config": config, "mode": mode, "precision": precision, **environment(dev),
            "parameters": sum(p.numel() for p in module.parameters()), "compile": compile, "attention": attention,
            "optimizer": optimizer}
    with attention_kernel(module, attention):
        if mode == "slowdown":
            return _slowdown(module, dm, dev, precision, steps, warmup, attention_lengths or [64, 128, 256, 512],
                             segment, g, base)
        return _timed(module, dm, dev, precision, steps, warmup, batch_size, tgt_len, g, base, compile=compile,
                      mfu=mfu, optimizer=optimizer, profile=profile)


def _profiled(step, batches, dev, top: int) -> tuple[list[dict], float | None]:
    """The `top` operators by self device time over `batches` steps (per step, in ms), and on a GPU the share of
    the steps' wall time its kernels took (their summed durations: below 1 where the host launches too slowly to
    keep it busy)."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profiler(activities=acts) as prof:
        sync(dev)
        t0 = time.perf_counter()
        for x, y in batches:
            step(x, y)
        sync(dev)
        wall = time.perf_counter() - t0
    busy = None
    if dev.type == "cuda":
        kernels = sum(e.device_time for e in prof.events() if e.device_type == DeviceType.CUDA)  # µs
        busy = round(kernels / 1e6 / wall, 3)
    key = "self_device_time_total" if dev.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:top]
    return [{"name": e.key[:80], "ms_per_step": round(getattr(e, key) / 1e3 / len(batches), 3),
             "calls_per_step": e.count // len(batches)} for e in events], busy


def _timed(module, dm, dev, precision, steps, warmup, batch_size, tgt_len, g, base, *, compile: bool | str,
           mfu: bool, optimizer: str, profile: int = 0) -> list[dict]:
    model = module.model
    train = base["mode"] == "train"
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
    # CUDA graphs (compile mode reduce-overhead) overwrite a graph's outputs at its next replay: each step is marked
    # as a new one, and the memory, which outlives the step, is copied out of the graphs' pool (its cost is timed)
    graphs = isinstance(compile, str) and compile.startswith("reduce-overhead") and dev.type == "cuda"
    eager_forward = None
    if compile:
        whole = isinstance(compile, str) and compile.endswith("+whole")  # e.g. "reduce-overhead+whole"
        mode = compile.removesuffix("+whole") if isinstance(compile, str) else None
        eager_forward = module.compile_model(mode=mode or None, whole=whole)
    if train:
        module.train()
        opt = module.make_optimizer() if optimizer == "module" else torch.optim.Adam(
            module.parameters(), lr=module.optim.lr, foreach=True)
    else:
        module.eval()
        if lengths.mem_len > 0:  # time the steady state: a memory already full, as after the first segments
            prime, _ = _tokens(dm, b * lengths.mem_len, vocab=module.n_token, generator=g)
            with torch.inference_mode(), autocast(dev, precision):
                _, mems = module(prime.view(b, -1).to(dev), None, MemorySettings(mem_len=lengths.mem_len),
                                 kv_memory=kv)
                mems = [m.clone() for m in mems]  # see `graphs` below

    def step(x, y):
        nonlocal mems
        if graphs:
            torch.compiler.cudagraph_mark_step_begin()
        if train:
            with autocast(dev, precision):
                hidden, mems = module(x, mems, lengths)
                if graphs:
                    mems = [m.clone() for m in mems]
                loss = model.nll(hidden, y).mean()
                aux = module.extra_loss()
                if aux:
                    loss = loss + sum(aux.values())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 0.25)
            opt.step()
            opt.zero_grad(set_to_none=True)
        else:
            with torch.inference_mode(), autocast(dev, precision):
                hidden, mems = module(x, mems, lengths, kv_memory=kv)
                if graphs:
                    mems = [m.clone() for m in mems]
                model.nll(hidden, y)

    flops = None
    for i in range(n_steps + 1):
        x, y = streams[:, i * t : (i + 1) * t], streams[:, i * t + 1 : (i + 1) * t + 1]
        if i == n_steps:  # one more forward pass, untimed, under the tensor tracker (it slows every operator)
            if profile:  # the same steps (the memory carried on), compiled if timed so
                profiled, busy = _profiled(step, [(x, y)] * 3, dev, profile)
            if eager_forward is not None:  # count and track the model's own operators, not the compiled graph's
                module.compile_model(undo=eager_forward)
            if mfu:  # one more step at full memory (its update is discarded with the model after the bench)
                saved = mems
                flops = count_flops(lambda: step(x, y), module)
                mems = saved
            with torch.no_grad(), autocast(dev, precision), TensorPeak() as tracker:
                module(x, mems, lengths, kv_memory=kv)
            break
        sync(dev)
        t0 = time.perf_counter()
        step(x, y)
        sync(dev)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    row = base | {
        "batch_size": b, "tgt_len": t, "memory": asdict(lengths), "tokens": source, "steps": steps,
        "warmup": warmup, "ms_per_step": round(med * 1e3, 2), "tokens_per_s": round(b * t / med, 1),
        "peak_memory_mb": round(_peak_mb(dev), 1), "forward_tensor_peak_mb": round(tracker.peak_mb, 1),
        "threads": torch.get_num_threads(),
    }
    if profile:
        row |= {"profile": profiled, "device_busy": busy}
    if flops is not None:
        peak, source = peak_tflops(dev, precision)
        row |= {"gflop_per_step": round(flops / 1e9, 3), "tflop_per_s": round(flops / med / 1e12, 3),
                "peak_tflop_per_s": peak, "peak_source": source, "mfu": round(flops / med / (peak * 1e12), 4)}
    return [row]


def _slowdown(module, dm, dev, precision, steps, warmup, lengths, segment, g, base) -> list[dict]:
    module.eval()
    out = []
    for L in lengths:
        tokens, source = _tokens(dm, L + segment * (warmup + steps + 1) + 1, vocab=module.n_token, generator=g)
        tokens = tokens.to(dev)[None]
        with torch.inference_mode(), autocast(dev, precision):
            # memory reuse: fill a memory of L positions, then time segments of `segment` tokens
            mems = None
            _, mems = module(tokens[:, :L], mems, MemorySettings(mem_len=L))
            mem_times = []
            for i in range(warmup + steps):
                x = tokens[:, L + i * segment : L + (i + 1) * segment]
                sync(dev)
                t0 = time.perf_counter()
                _, mems = module(x, mems, MemorySettings(mem_len=L, same_length=True))
                sync(dev)
                if i >= warmup:
                    mem_times.append((time.perf_counter() - t0) / segment)
            # vanilla: one full window of L tokens per predicted token
            van_times = []
            for i in range(warmup + steps):
                x = tokens[:, i : i + L]
                sync(dev)
                t0 = time.perf_counter()
                module(x, None, MemorySettings())
                sync(dev)
                if i >= warmup:
                    van_times.append(time.perf_counter() - t0)
        m, v = statistics.median(mem_times), statistics.median(van_times)
        out.append(base | {"attention_length": L, "segment": segment, "tokens": source,
                           "memory_ms_per_token": round(m * 1e3, 4), "vanilla_ms_per_token": round(v * 1e3, 4),
                           "slowdown": round(v / m, 1), "steps": steps, "warmup": warmup})
    return out

