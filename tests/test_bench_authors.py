"""The side-by-side commands `repro bench-txl-authors`, `bench-lamemo-authors`, `bench-mgk-authors` and
`bench-infinity-former-authors` (the papers' parts over `repro.ops.sidebyside`, whose own tests are
tests/test_sidebyside.py), run on our models on both sides (the authors' code is not on this machine's test path):
every code is timed in every round, the memory is carried through the timed segments and reset between runs, a
missing checkout is one line, every command takes the shared options, the MGK layer timed is the paper config's,
and the ∞-former's sequence step is the sorting module's."""

from functools import partial

import pytest
import torch

from papers.lamemo.model import LaMemo, LaMemoConfig
from papers.transformer_xl.bench_authors import build, ours, stream_of
from papers.transformer_xl.model import TransformerXLConfig
from repro.ops.sidebyside import SegmentCode, interleaved, interleaved_processes, product_flops, token_stream

SHAPE = dict(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=30, batch=2, tgt=4, mem=4, dropout=0.1)
MODULES = ["papers.transformer_xl.bench_authors", "papers.lamemo.bench_authors", "papers.mgk.bench_authors",
           "papers.infinity_former.bench_authors"]


def stream(n: int):
    return token_stream(**stream_of(SHAPE), segments=n)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_every_code_is_timed_every_round_with_its_memory(mode):
    torch.manual_seed(0)
    cfg = TransformerXLConfig(n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, n_token=30)
    codes = {"txl": ours(SHAPE, mode), "lamemo": SegmentCode(LaMemo(cfg, LaMemoConfig()), mem_len=SHAPE["mem"])}
    speeds = interleaved(codes, stream(3), mode=mode, precision="32", rounds=2, steps=2, warmup=1)
    assert {k: len(v) for k, v in speeds.items()} == {"txl": 2, "lamemo": 2}
    assert all(v > 0 for vs in speeds.values() for v in vs)
    mems = codes["txl"].mems  # after 3 segments of 4 tokens, the memory holds mem_len = 4 positions
    assert mems is not None and (mems[0].shape[3] if mode == "eval" else mems[0].shape[1]) == 4
    assert codes["txl"].model.training == (mode == "train")


@pytest.mark.parametrize("module, repository", [("papers.transformer_xl.bench_authors", "kimiyoung/transformer-xl"),
                                                ("papers.lamemo.bench_authors", "thu-coai/LaMemo")])
def test_a_checkout_without_the_model_file_is_refused_in_one_line(module, repository, tmp_path):
    import importlib

    with pytest.raises(SystemExit, match=f"has no pytorch/mem_transformer.py; pass a checkout of {repository}"):
        importlib.import_module(module).official_module(tmp_path)


@pytest.mark.slow
def test_each_code_is_timed_in_its_own_process_with_its_allocator_policy():
    """`interleaved_processes` (`bench-txl-authors`): every code is timed in every round, each in its own spawned
    process built by the paper's `build`, and `repro.ops.allocator`'s policy is in force in exactly the processes
    asked for (both codes are ours here, so that no checkout is needed)."""
    codes = {"plain": (partial(build, "ours", None, SHAPE, "train"), False),
             "kept": (partial(build, "ours", None, SHAPE, "train"), True)}
    speeds, params, policy, flops = interleaved_processes(codes, stream=stream_of(SHAPE), mode="train",
                                                          precision="32", rounds=2, steps=2, warmup=1, threads=1)
    assert {k: len(v) for k, v in speeds.items()} == {"plain": 2, "kept": 2}
    assert all(v > 0 for vs in speeds.values() for v in vs)
    expected = sum(p.numel() for p in ours(SHAPE, "train").model.parameters())
    assert params == {"plain": expected, "kept": expected}
    assert policy == {"plain": False, "kept": True}
    assert flops == {"plain": 172_544, "kept": 172_544}  # test_product_flops_count_each_product_of_a_step


def test_product_flops_count_each_product_of_a_step():
    """The matrix products of one step with a full memory, counted by hand for the one-layer shape (B 2, T 4,
    M 4, D 16, 2 heads of 8, inner 32, 30 words); 2 FLOPs per multiply-add. Evaluation (keys and values of the
    memory kept): q 2·8·16·16, k/v of the segment 2·8·16·32, positions W_kR 2·8·16·16 over K = 8 distances, the
    three (B, H, T, K, E) products 3·2·(2·2·4·8·8), output projection 2·8·16·16, feed-forward 2·(2·8·16·32),
    logits 2·8·16·30. Training projects k/v from [memory; segment] (16 rows: +2·8·16·32) and adds the backward
    pass: every product's two gradients but the input gradient of W_kR's sinusoids, which need none. The k/v
    projection's input gradient covers the memory's rows too (one product over the concatenation, whose backward
    then drops those rows: 8,192 of the step's FLOPs here; 2·B·M·2HE·D per layer: 2.3% of a step at the
    small benchmark shape, 3.2% at 41M)."""
    eval_forward = 4096 + 8192 + 4096 + 3 * 2048 + 4096 + 16384 + 7680
    torch.manual_seed(0)
    assert product_flops(ours(SHAPE, "eval"), stream(3), mode="eval") == eval_forward
    train_forward = eval_forward + 8192
    backward = 2 * train_forward - 4096  # both gradients of every product but W_kR's input gradient
    code = ours(SHAPE, "train")
    assert product_flops(code, stream(3), mode="train") == train_forward + backward == 172_544
    assert code.mems is None and all(p.grad is None for p in code.model.parameters())  # left as found


def test_mgk_checkout_without_the_model_file_and_unknown_configs_are_refused_in_one_line(tmp_path):
    from papers.mgk import bench_authors

    with pytest.raises(SystemExit, match="has no language-modeling/lmtool-fwms/src/mem_transformer.py"):
        bench_authors.official_module(tmp_path)
    with pytest.raises(SystemExit, match="--configs takes .*got wt103_linear8"):
        bench_authors.main(["--checkout", str(tmp_path), "--configs", "wt103_mgk4,wt103_linear8"])


@pytest.mark.parametrize("config", ["wt103_softmax8", "wt103_mgk4", "wt103_mgk8", "wt103_smgk8"])
def test_mgk_bench_times_the_paper_configs_layer(config):
    """The layer `repro bench-mgk-authors` times is the paper config's (the official layer's parameter count, from
    the parity fixture of minhtannguyen/transformer-mgk), in the config's form and with its dropout."""
    from papers.mgk.bench_authors import our_lm_layer
    from tests.parity.common import HERE, load_fixture

    layer = our_lm_layer(config)
    _, meta = load_fixture(HERE / "mgk" / "counts.pt")
    assert sum(p.numel() for p in layer.parameters()) == meta[f"lm.{config}"]
    assert layer.drop.p == 0.1
    if config != "wt103_softmax8":
        assert layer.attn.form == "lm_official"


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("device, message", [("tpu:0", "is not a device"),
                                             ("meta", "only cpu and cuda are timed")]
                         + ([] if torch.cuda.is_available() else [("cuda", "sees no GPU")]))
def test_a_device_it_cannot_time_on_is_refused_in_one_line(module, device, message, tmp_path):
    """`--device` is checked before a checkout is read or a model built (the checkout here is empty)."""
    import importlib

    with pytest.raises(SystemExit, match=message):
        importlib.import_module(module).main(["--checkout", str(tmp_path), "--device", device])


@pytest.mark.parametrize("module", MODULES)
def test_every_command_takes_the_shared_options_and_refuses_a_count_below_one(module, tmp_path, capsys):
    """The options of `repro.ops.sidebyside.parser`, in every paper's command, and its checks before a checkout is
    read (the checkout here is empty)."""
    import importlib

    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for option in ("--checkout", "--precision", "--rounds", "--steps", "--warmup", "--threads", "--device",
                   "--output"):
        assert option in out, option
    with pytest.raises(SystemExit, match="--rounds must be at least 1, got 0"):
        main(["--checkout", str(tmp_path), "--rounds", "0"])
    with pytest.raises(SystemExit, match="--warmup must be at least 0, got -1"):
        main(["--checkout", str(tmp_path), "--warmup", "-1"])


def test_infinity_former_bench_refuses_a_bad_checkout_or_config_in_one_line(tmp_path):
    from papers.infinity_former import bench_authors

    with pytest.raises(SystemExit, match="has no sorting/mem_transformer.py"):
        with bench_authors.sorting_modules(tmp_path):
            pass
    with pytest.raises(SystemExit, match="no such file"):
        bench_authors.main(["--checkout", str(tmp_path), "--config", str(tmp_path / "missing.yaml")])
    with pytest.raises(SystemExit, match="is not an ∞-former sorting config"):
        bench_authors.main(["--checkout", str(tmp_path), "--config", "configs/infinity_former/tiny/sort_512_txl.yaml"])
    with pytest.raises(SystemExit, match="--batch must be at least 1"):
        bench_authors.main(["--checkout", str(tmp_path), "--batch", "0"])


def test_infinity_former_bench_sequence_is_the_sorting_layout_and_its_step_the_modules():
    """One timed step is one group of examples as `repro.data.sorting` lays it out (L symbols, the separator and
    the sorted output, cut into segments; only the 20 outputs scored) and as `SortingLM.training_step` runs it: the
    LTM absorbs every segment, and the backward pass reaches the parameters from the scored segment only."""
    from papers.infinity_former import bench_authors
    from repro.data.sorting import N_SYMBOLS, PAD

    c = bench_authors.read_config("configs/infinity_former/tiny/sort_256_infty.yaml")
    segments = bench_authors.sequence(c, 2, "cpu")
    t, length = c["tgt_len"], c["length"]
    total = length + N_SYMBOLS
    assert [x.shape for x, _ in segments] == [(2, min(t, total - i)) for i in range(0, total, t)]
    targets = torch.cat([y for _, y in segments], 1)
    assert (targets[:, :length] == PAD).all() and (targets[:, length:] != PAD).all()
    inputs = torch.cat([x for x, _ in segments], 1)
    assert (inputs[:, length] == N_SYMBOLS).all() and torch.equal(inputs[:, length + 1:], targets[:, length:-1])
    torch.manual_seed(0)
    model = bench_authors.our_sorting_model(c, "cpu").train()
    mems = bench_authors.step_ours(model, segments, c["mem_len"])
    n, basis = c["model"]["n_layer"], c["ltm"]["n_basis"]
    assert [m.shape[1] for m in mems[2 * n:3 * n]] == [basis] * n  # every layer's LTM holds a signal
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None for g in grads) and sum(float(g.abs().sum()) for g in grads) > 0


def test_infinity_former_bench_initialises_their_model_as_their_train_py():
    """`init_as_train_py` follows `sorting/train.py`'s `weights_init` by class name (the official constructor
    leaves tensors uninitialised): Linear N(0, 0.02) with zero biases, LayerNorm weights N(1, 0.02), embeddings
    N(0, 0.02), the relative-position biases of a `…TransformerLM` N(0, 0.02); other modules untouched."""
    from papers.infinity_former.bench_authors import init_as_train_py

    class MemTransformerLM(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(200, 300)
            self.norm = torch.nn.LayerNorm(3000)
            self.emb = torch.nn.Embedding(300, 200)
            self.conv = torch.nn.Conv1d(4, 4, 3)
            self.r_w_bias = torch.nn.Parameter(torch.full((100, 60), float("nan")))

    model = MemTransformerLM()
    conv = model.conv.weight.detach().clone()
    torch.manual_seed(0)
    init_as_train_py(model)
    for w, mean in ((model.lin.weight, 0.0), (model.emb.weight, 0.0), (model.norm.weight, 1.0),
                    (model.r_w_bias, 0.0)):
        w = w.detach()
        assert abs(float(w.mean()) - mean) < 2e-3 and abs(float(w.std()) - 0.02) < 1e-3
    assert not model.lin.bias.detach().any() and not model.norm.bias.detach().any()
    assert torch.equal(model.conv.weight, conv)


def test_infinity_former_gpt2_bench_refuses_bad_input_in_one_line(tmp_path):
    """`--model gpt2_lm`: a sorting-only option, a checkout without their GPT-2 copy, and a GPT-2 config without
    the LTM are each refused in one line."""
    from papers.infinity_former import bench_authors

    with pytest.raises(SystemExit, match="--batch is for the sorting model"):
        bench_authors.main(["--checkout", str(tmp_path), "--model", "gpt2_lm", "--batch", "2"])
    with pytest.raises(SystemExit, match="has no finetune_gpt2/src/transformers/models/gpt2/modeling_gpt2.py"):
        bench_authors.main(["--checkout", str(tmp_path), "--model", "gpt2_lm", "--steps", "1"])
    with pytest.raises(SystemExit, match="is not an ∞-former GPT-2 config"):
        bench_authors.our_gpt2_lm("configs/infinity_former/paper/gpt2_wt103_gpt2.yaml", "cpu")
