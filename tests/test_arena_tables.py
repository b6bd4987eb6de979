"""The arena's measurements (`papers/arena/measure.py`) and tables (`papers/arena/tables.py`): the Pareto front
against a hand-worked example, the FLOP counter against a count by hand of every matrix product of the backbone,
the loss at another evaluation memory against a plain loop over the model, and toy records through the table and
the figure's data."""

import json
import math
from pathlib import Path

import pytest
import torch

from papers.arena import tables as T
from papers.arena.measure import evaluate, train_flops, warm_up
from papers.arena.module import ArenaLM
from repro.data.lm import Segment
from repro.lm import MemorySettings
from repro.ops.timing import count_flops
from repro.tables import Results

B, TGT, D, H, E, F, V, L = 2, 6, 16, 2, 8, 24, 30, 2
BACKBONE = dict(n_layer=L, d_model=D, n_head=H, d_head=E, d_inner=F, dropout=0.0, n_token=V)


def _batches(seed=0):
    g = torch.Generator().manual_seed(seed)
    while True:
        x = torch.randint(0, V, (B, TGT + 1), generator=g)
        yield Segment(x[:, :-1], x[:, 1:])


# ------------------------------------------------------------------------------------------------ Pareto front
def test_pareto_front_by_hand():
    # (FLOPs, bpc): a is cheapest; b is beaten by c (cheaper and better); d is best but dearest; e ties a's cost
    # with a worse loss; f equals d in both (neither dominates the other: both stay)
    pts = [(1.0, 3.0), (3.0, 2.5), (2.0, 2.0), (5.0, 1.0), (1.0, 3.5), (5.0, 1.0)]
    assert T.pareto_front(pts) == [0, 2, 3, 5]
    assert T.pareto_front([]) == []
    assert T.pareto_front([(2.0, 2.0)]) == [0]


# ------------------------------------------------------------------------------------------------------ FLOPs
def _hand_count(*, mem: int) -> tuple[int, int]:
    """(forward FLOPs, forward + backward FLOPs) of Transformer-XL's matrix products (2 per multiply-add) for a
    segment of B × TGT tokens with `mem` rows of memory, K = mem + TGT keys (repro/nn/attention.py)."""
    k, he = mem + TGT, H * E
    layer = (2 * B * TGT * D * he  # queries of the segment
             + 2 * B * k * D * 2 * he  # keys and values of [memory; segment]
             + 2 * k * D * he  # W_kR of the K relative positions (no batch)
             + 2 * B * H * TGT * E * k  # (q + v)·W_kR R: terms (b) + (d)
             + 2 * B * H * TGT * E * k  # (q + u)·k: terms (a) + (c)
             + 2 * B * H * TGT * k * E  # probabilities · values
             + 2 * B * TGT * he * D  # output projection
             + 2 * 2 * B * TGT * D * F)  # feed-forward, two layers
    forward = L * layer + 2 * B * TGT * D * V  # the softmax layer (tied to the embedding, no lookup product)
    # backward: two products per forward product (gradients of both operands), but the sinusoids R need none: W_kR
    # has its weight's gradient only
    return forward, 3 * forward - L * 2 * k * D * he


@pytest.mark.parametrize("mem", [0, 8])
def test_train_flops_equal_a_count_by_hand(mem):
    module = ArenaLM(model=BACKBONE, mechanisms=[], memory=MemorySettings(mem_len=mem), n_token=V)
    out = train_flops(module, _batches())
    forward, total = _hand_count(mem=mem)
    assert out["per_step"] == total
    assert out["per_token"] == total / (B * TGT)
    # the memory was filled first: 6, then 8 rows, then 8 again (no change: full) — or empty throughout
    assert out["memory_full"] and out["fill_segments"] == (3 if mem else 2)
    assert out["short_memory_rows"] == mem
    # the forward alone, with the memory the count saw
    batch = next(_batches(1))
    mems = [torch.zeros(B, mem, D) for _ in range(L)]
    with torch.no_grad():
        fwd = count_flops(lambda: module.model.nll(module(batch.input, mems, module.memory)[0], batch.target),
                          module)
    assert fwd == forward


def test_a_mechanism_costs_flops_and_its_memory_fills():
    """The compressive memory: the count comes after its compressed slots are full too (a later segment than the
    short memory), and its attention over them costs more than the backbone's."""
    comp = [{"name": "compressive", "rate": 2, "cmem_len": 4}]
    plain = train_flops(ArenaLM(model=BACKBONE, memory=MemorySettings(mem_len=8), n_token=V), _batches())
    module = ArenaLM(model=BACKBONE, mechanisms=comp, memory=MemorySettings(mem_len=8), n_token=V)
    out = train_flops(module, _batches())
    assert out["memory_full"] and out["fill_segments"] > plain["fill_segments"]
    assert out["per_step"] > plain["per_step"]


def test_warm_up_stops_when_no_shape_changes():
    sizes = iter([1, 2, 3, 3, 3, 3])
    state = {"x": None}
    n, full = warm_up(lambda: state.update(x=[torch.zeros(next(sizes))]), lambda: state["x"])
    assert (n, full) == (4, True)
    growing = iter(range(1, 100))
    n, full = warm_up(lambda: state.update(x=[torch.zeros(next(growing))]), lambda: state["x"], limit=3)
    assert (n, full) == (3, False)


# -------------------------------------------------------------------------------------------- loss by context
def test_loss_at_another_memory_is_a_plain_loop_over_the_model():
    torch.manual_seed(0)
    module = ArenaLM(model=BACKBONE, memory=MemorySettings(mem_len=4), eval_memory=MemorySettings(mem_len=4),
                     n_token=V)
    batches = [b for _, b in zip(range(4), _batches())]
    got = evaluate(module, batches, mem_len=10)
    assert module.eval_memory.mem_len == 4  # put back
    module.eval()
    nll, mems = [], None
    with torch.no_grad():
        for b in batches:
            h, mems = module.model(b.input, mems, mem_len=10)
            nll.append(module.model.nll(h, b.target))
    want = torch.cat(nll, 1).double().mean().item()
    assert got["tokens"] == 4 * B * TGT and got["mem_len"] == 10 and got["protocol"] == "memory"
    assert got["loss"] == pytest.approx(want, rel=1e-6)
    assert got["bpc"] == pytest.approx(want / math.log(2), rel=1e-6)


def test_the_sliding_contestant_is_scored_on_windows_of_segment_plus_memory():
    module = ArenaLM(model=BACKBONE, memory=MemorySettings(), eval_memory=MemorySettings(),
                     eval_protocol={"kind": "sliding", "window": 12, "stride": 1}, n_token=V)
    batches = [b for _, b in zip(range(3), _batches())]
    got = evaluate(module, batches, mem_len=4)
    assert got["window"] == TGT + 4 and got["protocol"] == "sliding"
    assert module.eval_protocol.window == 12
    # the last token of the last segment, from the window of TGT + 4 tokens that ends at its input
    module.eval()
    seq = torch.cat([b.input for b in batches], 1)
    with torch.no_grad():
        h, _ = module.model(seq[:, -(TGT + 4):], None, mem_len=0)
        last = module.model.nll(h[:, -1:], batches[-1].target[:, -1:])
    module.eval_protocol = module.eval_protocol.__class__(kind="sliding", window=TGT + 4, stride=1)
    module._eval_start("test")
    with torch.inference_mode():
        for b in batches[:-1]:
            module._eval_step("test", b)
        mine = module._sliding_nll("test", batches[-1].input, batches[-1].target)
    torch.testing.assert_close(mine[:, -1:], last)


# ------------------------------------------------------------------------------------------ records → table
def _write(root, name, rec):
    path = root / "arena" / "runs" / "tiny" / "g" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec))


def _arena_record(exp, *, flops, tok_s, bpc_by_mem, checkpoint="ck"):
    return {"paper": "arena", "experiment": exp, "profile": "tiny", "stage": "arena", "rehearsal": False,
            "level": "char", "mechanisms": [{"name": "ltm", "n_basis": 8}], "mem_len": 32,
            "eval": {"protocol": "memory", "mem_len": 32}, "parameters": 1234, "non_embedding_parameters": 1000,
            "train_flops_per_token": flops, "eval_flops_per_token": flops / 3, "train_tokens_per_s": tok_s,
            "eval_tokens_per_s": 2 * tok_s, "train_forward_tensor_peak_mb": 1.5, "peak_rss_mb": 500.0,
            "timing": {"steps": 5, "warmup": 2, "train_batch": [16, 32], "eval_batch": [10, 32]},
            "loss_by_context": [{"mem_len": m, "bpc": b, "loss": b * math.log(2), "tokens": 640}
                                for m, b in bpc_by_mem.items()],
            "provenance": {"checkpoint": f"checkpoints/arena/tiny/g/{exp}.ckpt", "hardware": "CPU toy",
                           "torch": "2.x", "precision": "bf16"}}


def _test_record(exp, bpc, mechanisms=({"name": "ltm", "n_basis": 8},)):
    return {"paper": "arena", "experiment": exp, "profile": "tiny", "stage": "test", "rehearsal": False,
            "metrics": {"test/bpc": bpc, "test/loss": bpc * math.log(2)},
            "model": {"mechanisms": list(mechanisms), "mem_len": 32, "eval": {"protocol": "memory"}},
            "provenance": {"corpus": "embedded-char", "hardware": "CPU toy", "precision": "bf16-mixed"}}


def test_toy_records_become_a_row_and_a_point(tmp_path):
    for seed, bpc in ((1, 2.0), (2, 2.2)):
        _write(tmp_path, f"toy.seed{seed}.arena.json",
               _arena_record(f"toy.seed{seed}", flops=2e6, tok_s=1000.0 * seed, bpc_by_mem={0: bpc + 0.5, 32: bpc}))
        _write(tmp_path, f"toy.seed{seed}.test.json", _test_record(f"toy.seed{seed}", bpc))
    _write(tmp_path, "cheap.arena.json", _arena_record("cheap", flops=1e6, tok_s=3000.0, bpc_by_mem={0: 3.0}))
    _write(tmp_path, "cheap.test.json", _test_record("cheap", 3.0, mechanisms=()))
    results = Results("arena", tmp_path)
    configs = tmp_path / "configs"  # none: the contestants are those with records
    assert T.profiles(results) == ["tiny"]
    table = T.arena_table(results, "tiny", configs)
    assert table.name == "tiny/arena"
    rows = {row[0]: row for row in table.rows}
    assert set(rows) == {"toy", "cheap"}
    col = {c: i for i, c in enumerate(table.columns)}
    toy = rows["toy"]
    assert toy[col["memory mechanisms"]] == "short memory 32 + continuous long-term memory (8 basis functions)"
    assert toy[col["budget"]] == "same backbone"
    assert toy[col["seeds"]] == "2"
    assert toy[col["train MFLOP/token"]].value == "2.000 ± 0.000"
    assert toy[col["train tok/s"]].value == "1,500 ± 707"
    assert toy[col["test bpc (training memory)"]].value == f"2.100 ± {0.2 / math.sqrt(2):.3f}"
    assert toy[col["bpc, eval memory 0"]].value.startswith("2.600 ± ")
    assert "`toy.seed*` measured by `papers.arena.measure`" in toy[col["train tok/s"]].provenance
    assert "checkpoints/arena/tiny/g/toy.seed*.ckpt" in toy[col["train tok/s"]].provenance
    cheap = rows["cheap"]
    assert cheap[col["memory mechanisms"]] == "short memory 32"
    assert cheap[col["train MFLOP/token"]].value == pytest.approx(1.0)
    assert cheap[col["bpc, eval memory 32"]].value == "not run"
    md = table.markdown()
    assert "| toy | short memory 32 + continuous" in md and "Where our numbers come from" in md

    points = {p.name: p for p in T.pareto_points(results, "tiny", configs)}
    assert points["toy"] == T.Point("toy", 2e6, pytest.approx(2.1), 2, True)
    assert points["cheap"].front  # cheaper, worse: both on the front
    _write(tmp_path, "bad.arena.json", _arena_record("bad", flops=3e6, tok_s=1.0, bpc_by_mem={0: 9.0}))
    _write(tmp_path, "bad.test.json", _test_record("bad", 9.0))
    points = {p.name: p for p in T.pareto_points(Results("arena", tmp_path), "tiny", configs)}
    assert not points["bad"].front and points["toy"].front


def test_build_writes_the_figure_beside_the_table(tmp_path):
    _write(tmp_path, "toy.arena.json", _arena_record("toy", flops=2e6, tok_s=10.0, bpc_by_mem={0: 2.0}))
    _write(tmp_path, "toy.test.json", _test_record("toy", 2.0))
    tables = T.build(Results("arena", tmp_path))
    assert [t.name for t in tables] == ["claims_small", "tiny/arena"]
    assert (tmp_path / "arena" / "tiny" / "pareto.png").stat().st_size > 0
    # the configs of the profile that have not run are rows too
    assert {"toy", "txl", "vanilla"} <= {row[0] for row in tables[1].rows}


TOY = '''
"""A toy memory mechanism from outside the repository: per layer the running mean of every row that left the short
memory, read through a learned map."""
import torch
from torch import nn

from repro.memory import MemoryMechanism, register


@register("toy_mean")
class ToyMean(MemoryMechanism):
    slots = ("mean", "count")

    def __init__(self, cfg):
        super().__init__()
        self.maps = nn.ModuleList(nn.Linear(cfg.d_model, cfg.d_model, bias=False) for _ in range(cfg.n_layer))

    def empty(self, batch, like):
        return like.new_zeros(batch, 1, like.shape[-1]), like.new_zeros(batch, 1)

    def read(self, i, layer, x, state):
        return self.maps[i](state[0].to(x.dtype)).expand_as(x)

    def write(self, i, layer, state, evicted, inputs):
        mean, count = state
        if not evicted.shape[1]:
            return state
        total = count + evicted.shape[1]
        mean = (mean * count[..., None] + evicted.sum(1, keepdim=True).to(mean.dtype)) / total[..., None]
        return mean.detach(), total
'''


@pytest.mark.slow
def test_a_toy_contestant_of_one_file_and_one_config_appears_in_the_table(tmp_path, monkeypatch):
    """The README's promise, end to end: a mechanism written in its own file, named in a copy of a tiny config,
    trains, tests and is measured through the repository's commands and becomes a row and a point of the table."""
    import yaml

    from papers.arena.measure import after_run
    from repro.cli.entry import main

    (tmp_path / "toy_mean.py").write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    root = Path(__file__).resolve().parent.parent
    cfg = yaml.safe_load((root / "configs/arena/tiny/txl.yaml").read_text())
    cfg["run"]["experiment"] = "toy"
    cfg["model"]["init_args"]["mechanisms"] = [{"name": "toy_mean", "module": "toy_mean"}]
    config = tmp_path / "toy.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "results" / "arena" / "runs" / "tiny" / "g"
    ckpt = tmp_path / "toy.ckpt"
    monkeypatch.chdir(root)
    common = ["--run.tracking", "none", "--trainer.limit_val_batches", "2"]
    main(["fit", "-c", str(config), "--trainer.max_steps", "3", "--trainer.val_check_interval", "3",
          "--run.checkpoint", str(ckpt), "--run.record", str(runs / "toy.fit.json"), *common])
    main(["test", "-c", str(config), "--ckpt_path", str(ckpt), "--trainer.limit_test_batches", "3",
          "--run.record", str(runs / "toy.test.json"), *common])
    after_run(str(config), str(ckpt), "toy", str(runs), overrides=())
    results = Results("arena", tmp_path / "results")
    table = T.arena_table(results, "tiny", tmp_path / "no-configs")
    row = next(r for r in table.rows if r[0] == "toy")
    col = {c: i for i, c in enumerate(table.columns)}
    assert row[col["memory mechanisms"]] == "short memory 32 + toy_mean"
    assert float(row[col["test bpc (training memory)"]].value) > 0
    assert float(str(row[col["train MFLOP/token"]].value)) > 0
    assert [p.name for p in T.pareto_points(results, "tiny", tmp_path / "no-configs")] == ["toy"]


def test_the_equal_flops_configs_are_what_their_budget_record_says():
    """`repro arena-budget` wrote NAME_eqflops.yaml beside each contestant it changed and one record per profile:
    each config holds the record's settings, within ±5% of Transformer-XL's FLOPs where the record says so, and
    nothing else differs from the contestant's own config."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    records = sorted((root / "results/arena/budget").glob("*.json"))
    assert {p.stem.split("_")[0] for p in records} >= {"tiny", "small"}
    for path in records:
        record = json.loads(path.read_text())
        for name, entry in record["contestants"].items():
            assert entry["within_band"] == (abs(entry["flops_per_token"] / record["reference_flops_per_token"] - 1)
                                            <= record["band"])
            if entry["lever"] == "none":
                continue
            config = root / entry["config"]
            assert config.name == f"{name}_eqflops.yaml", config
            budget, own = (yaml.safe_load(p.read_text()) for p in (config, config.with_name(f"{name}.yaml")))
            ia, own_ia = budget["model"]["init_args"], own["model"]["init_args"]
            for key, value in entry["setting"].items():
                group, field = key.split(".")
                assert ia[group][field] == value
                own_ia[group][field] = value
                if key == "memory.mem_len":
                    own_ia["eval_memory"]["mem_len"] = value
            own["run"]["experiment"] += "_eqflops"
            assert budget == own, config
            head = config.read_text().splitlines()
            prefix = f" --prefix {path.stem.split('_', 1)[1]}_" if "_" in path.stem else ""
            assert f"`repro arena-budget {record['profile']}{prefix}`" in head[0]  # the command that rewrites it
            assert f"{entry['flops_per_token'] / 1e6:.3f} MFLOP" in head[1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["txl", "vanilla", "compressive", "infinity", "infinity_sticky", "lamemo_infinity",
                                  "mgk_lamemo"])
def test_the_budget_counts_on_the_meta_device_what_a_cpu_step_counts(name):
    """`repro arena-budget` counts on the meta device (shapes without values, a second at the papers' sizes):
    every mechanism and the MGK score give the count of a real CPU step, at the config's memory and at another."""
    from papers.arena.budget import _flops

    config = Path(__file__).resolve().parent.parent / "configs/arena/tiny" / f"{name}.yaml"
    for overrides in ({}, {"memory.mem_len": 8, "eval_memory.mem_len": 8}):
        if name == "vanilla" and overrides:
            continue
        assert _flops(config, overrides, "meta") == _flops(config, overrides, "cpu"), overrides


def test_a_profile_named_by_corpus_gets_one_table_per_corpus(tmp_path):
    """The paper profile's contestants are `enwik8_NAME` and `wt103_NAME`: one table each, never bpc and perplexity
    in one column; a profile whose configs are not named by corpus keeps one table."""
    import yaml

    configs = tmp_path / "configs"
    (configs / "tiny").mkdir(parents=True)
    for corpus in ("enwik8", "wt103"):
        config = {"data": {"init_args": {"corpus": corpus}}}
        (configs / "tiny" / f"{corpus}_toy.yaml").write_text(yaml.safe_dump(config))
    assert T.corpora("tiny", configs) == ["enwik8_", "wt103_"]
    _write(tmp_path, "enwik8_toy.arena.json", _arena_record("enwik8_toy", flops=2e6, tok_s=10.0, bpc_by_mem={0: 2.0}))
    _write(tmp_path, "enwik8_toy.test.json", _test_record("enwik8_toy", 2.0))
    word = _arena_record("wt103_toy", flops=3e6, tok_s=10.0, bpc_by_mem={})
    word |= {"level": "word", "loss_by_context": [{"mem_len": 32, "ppl": 30.0, "loss": math.log(30.0), "tokens": 64}]}
    _write(tmp_path, "wt103_toy.arena.json", word)
    test = _test_record("wt103_toy", 0.0)
    test["metrics"] = {"test/ppl": 30.0, "test/loss": math.log(30.0)}
    _write(tmp_path, "wt103_toy.test.json", test)
    results = Results("arena", tmp_path)
    char, words = (T.arena_table(results, "tiny", configs, prefix) for prefix in T.corpora("tiny", configs))
    assert (char.name, words.name) == ("tiny/arena_enwik8", "tiny/arena_wt103")
    assert [r[0] for r in char.rows] == ["enwik8_toy"] and [r[0] for r in words.rows] == ["wt103_toy"]
    assert "test bpc (training memory)" in char.columns and "test perplexity (training memory)" in words.columns
    col = words.columns.index("test perplexity (training memory)")
    assert words.rows[0][col].value == 30.0 and words.rows[0][col].fmt == "{:.2f}"
    (configs / "tiny" / "plain.yaml").write_text(yaml.safe_dump({"data": {"init_args": {"corpus": "enwik8"}}}))
    assert T.corpora("tiny", configs) == [""]


@pytest.mark.parametrize("corpus, rate", [("enwik8", 3), ("wt103", 4)])
def test_the_paper_arena_is_lamemos_transformer_xl_with_each_mechanism_added(corpus, rate):
    """Every paper contestant of a corpus is LaMemo's Transformer-XL of that corpus (configs/lamemo/paper: backbone,
    data, optimiser, steps, precision) with only its mechanisms and memory changed (MGK: also half the heads;
    at equal FLOPs: also the depth); the compressive memory
    compresses at Rae et al.'s rate for the corpus into as many slots as the memory; the memory-less model is
    scored on windows as long as the others attend (segment + memory)."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    lamemo = yaml.safe_load((root / f"configs/lamemo/paper/{corpus}_txl.yaml").read_text())
    def shared(cfg: dict) -> tuple:  # backbone, optimiser, data, trainer
        return cfg["model"]["init_args"]["model"], cfg["model"]["init_args"]["optim"], cfg["data"], cfg["trainer"]

    configs = sorted((root / "configs/arena/paper").glob(f"{corpus}_*.yaml"))
    assert len([p for p in configs if not p.stem.endswith("_eqflops")]) == 9
    for path in configs:
        cfg = yaml.safe_load(path.read_text())
        model, base = cfg["model"]["init_args"]["model"], lamemo["model"]["init_args"]["model"]
        if path.stem.endswith("_eqflops"):  # the budget may change the depth: the rest is the same
            model["n_layer"] = base["n_layer"]
        if "_mgk" in path.stem:  # MGK's half the heads (its papers' MGK-4 against softmax-8)
            assert model["n_head"] == base["n_head"] // 2, path.name
            model["n_head"] = base["n_head"]
        assert shared(cfg) == shared(lamemo), path.name
    txl = yaml.safe_load((root / f"configs/arena/paper/{corpus}_txl.yaml").read_text())
    mem, tgt = txl["model"]["init_args"]["memory"]["mem_len"], txl["data"]["init_args"]["tgt_len"]
    compressive = yaml.safe_load((root / f"configs/arena/paper/{corpus}_compressive.yaml").read_text())
    assert compressive["model"]["init_args"]["mechanisms"] == [{"name": "compressive", "rate": rate,
                                                               "cmem_len": mem}]
    vanilla = yaml.safe_load((root / f"configs/arena/paper/{corpus}_vanilla.yaml").read_text())
    protocol = vanilla["model"]["init_args"]["eval_protocol"]
    assert protocol["kind"] == "sliding" and protocol["window"] == tgt + mem
    assert vanilla["model"]["init_args"]["memory"]["mem_len"] == 0
