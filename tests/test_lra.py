"""Long Range Arena: the ListOps generator against hand-evaluated expressions, the loaders of the real formats on
small files built here, and the classifier's padding (exact) and pooling."""

import io
import json
import pickle
import tarfile
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from papers.mgk.lra import LRAClassifier, LRAConfig, LRAEncoder, Variant
from repro.data import listops, lra, lra_sources, lra_tasks
from repro.data.listops import (
    ListOpsSpec,
    generate_listops_examples,
    listops_source,
    listops_tokens,
    listops_value,
    parse_listops,
    read_listops_tsv,
    write_listops,
)
from repro.data.lra import LRADataModule
from repro.data.lra_sources import (
    extract_prefix,
    read_aan_tsv,
    read_cifar10,
    read_imdb,
    read_pathfinder,
)

# ------------------------------------------------------------------------------------------------ ListOps


@pytest.mark.parametrize("source,value", [
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[MIN 4 7 ]", 4),
    ("[SM 5 6 7 ]", 8),  # 18 mod 10
    ("[SM 0 0 ]", 0),
    ("[MED 3 1 7 ]", 3),  # odd count: the middle value of 1 3 7
    ("[MED 1 2 3 4 ]", 2),  # even count: (2 + 3) / 2 = 2.5, truncated
    ("[MED 9 8 ]", 8),  # 8.5 → 8
    ("[SM [MAX 1 8 ] [MED 2 9 4 ] 5 ]", 7),  # 8 + 4 + 5 = 17 → 7
    ("[MIN [SM 9 9 ] [MAX 3 4 ] ]", 4),  # min(18 mod 10 = 8, 4)
    ("[MAX [MIN [SM 3 4 ] [MED 9 9 1 ] ] 6 ]", 7),  # min(7, 9) = 7; max(7, 6)
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's parenthesised form
    ("( ( ( ( [SM 6 ) ( ( ( [MIN 7 ) 3 ) ] ) ) 5 ) ] )", 4),  # 6 + 3 + 5 = 14 → 4
])
def test_listops_values_by_hand(source, value):
    assert listops_value(parse_listops(source)) == value


def test_listops_written_forms_round_trip():
    tree = ("[SM", [("[MAX", [1, 8]), ("[MED", [2, 9, 4]), 5])
    assert " ".join(listops_tokens(tree)) == "[SM [MAX 1 8 ] [MED 2 9 4 ] 5 ]"
    src = listops_source(tree)
    assert src.startswith("( ( ( ( [SM ( ( ( [MAX 1 ) 8 ) ] )")
    assert parse_listops(src) == tree
    with pytest.raises(ValueError, match="unclosed"):
        parse_listops("[MAX 1 2")


def test_listops_generator_is_deterministic_and_respects_bounds():
    spec = ListOpsSpec(n_train=60, n_valid=10, n_test=10, min_length=10, max_length=30, max_depth=5, max_args=4, seed=3)
    a, b = generate_listops_examples(spec), generate_listops_examples(spec)
    assert a == b
    other = generate_listops_examples(ListOpsSpec(**{**spec.__dict__, "seed": 4}))
    assert other != a
    sources = [s for rows in a.values() for s, _ in rows]
    assert len(set(sources)) == len(sources) == 80  # distinct within and across splits
    for rows in a.values():
        for src, label in rows:
            tree = parse_listops(src)
            assert 10 <= len(listops_tokens(tree)) <= 30
            assert listops_value(tree) == label and 0 <= label <= 9
    with pytest.raises(ValueError, match="min_length"):
        ListOpsSpec(min_length=50, max_length=20)


def test_listops_files_written_once_with_checksums(tmp_path):
    spec = ListOpsSpec(n_train=20, n_valid=5, n_test=5, min_length=5, max_length=20, max_depth=4, max_args=3)
    files = write_listops(tmp_path, spec)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert set(manifest["sha256"]) == {"train", "valid", "test"}
    stamp = files["train"].stat().st_mtime_ns
    write_listops(tmp_path, spec)
    assert files["train"].stat().st_mtime_ns == stamp  # reused, not rewritten
    files["train"].write_text("Source\tTarget\n")  # damaged: regenerated
    write_listops(tmp_path, spec)
    rows = read_listops_tsv(files["train"])
    assert len(rows) == 20
    ids, label = rows[0]
    first = files["train"].read_text().splitlines()[1].split("\t")
    toks = [t for t in first[0].split() if t not in "()"]
    assert [listops.LISTOPS_VOCAB[i] for i in ids] == toks and label == int(first[1])
    bad = tmp_path / "bad.tsv"
    bad.write_text("x\ty\n")
    with pytest.raises(ValueError, match="Source"):
        read_listops_tsv(bad)


# ------------------------------------------------------------------------------------------- real formats


def _tar(path, members: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_imdb_archive_and_folder(tmp_path):
    members = {"aclImdb/train/pos/0_9.txt": b"Great film!", "aclImdb/train/neg/1_2.txt": b"Bad.",
               "aclImdb/test/pos/2_8.txt": "Très bien".encode(), "aclImdb/test/neg/3_1.txt": b"No",
               "aclImdb/train/unsup/4_0.txt": b"ignored", "aclImdb/README": b"readme"}
    _tar(tmp_path / "aclImdb_v1.tar.gz", members)
    data = read_imdb(tmp_path / "aclImdb_v1.tar.gz")
    assert data["train"] == [(b"Bad.", 0), (b"Great film!", 1)]  # sorted by file name
    assert sorted(data["test"]) == sorted([("Très bien".encode(), 1), (b"No", 0)])
    for name, blob in members.items():
        (tmp_path / "x" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "x" / name).write_bytes(blob)
    assert read_imdb(tmp_path / "x") == data
    splits = lra_tasks._text_splits(data, max_len=4)
    assert splits["valid"] is splits["test"]  # LRA evaluates on the IMDb test set
    row = [i for i in range(2) if int(splits["train"].labels[i]) == 1][0]
    assert splits["train"].tokens[row].tolist() == [b + 1 for b in b"Grea"]


def test_aan_pairs(tmp_path):
    lines = ["1\tp1\tp2\tabc\txy", "0.0\tp3\tp4\tq\thello"]
    for name in ("train", "eval", "test"):
        (tmp_path / f"new_aan_pairs.{name}.tsv").write_text("\n".join(lines) + "\n")
    rows = read_aan_tsv(tmp_path / "new_aan_pairs.train.tsv")
    assert rows == [(b"abc", b"xy", 1), (b"q", b"hello", 0)]
    s = lra_tasks._retrieval_splits(tmp_path, max_len=3)["valid"]
    assert s.tokens.tolist() == [[98, 99, 100], [114, 0, 0]] and s.lengths.tolist() == [3, 1]
    assert s.tokens2.tolist() == [[121, 122, 0], [105, 102, 109]] and s.labels.tolist() == [1, 0]
    (tmp_path / "bad.tsv").write_text("1\tonly\tthree\n")
    with pytest.raises(ValueError, match="5 tab-separated"):
        read_aan_tsv(tmp_path / "bad.tsv")


def _cifar_batch(x, y) -> bytes:
    return pickle.dumps({b"batch_label": b"x", b"labels": list(y), b"data": x, b"filenames": [b"a"] * len(y)},
                        protocol=2)


def test_cifar10_python_batches_to_grey(tmp_path):
    rng = np.random.default_rng(0)
    batches = {}
    for i in range(1, 6):
        batches[f"cifar-10-batches-py/data_batch_{i}"] = _cifar_batch(
            rng.integers(0, 256, (2, 3072), dtype=np.uint8), [i, 9 - i])
    test_x = np.zeros((1, 3072), dtype=np.uint8)
    test_x[0, 0], test_x[0, 1024], test_x[0, 2048] = 200, 100, 50  # pixel 0: R, G, B
    batches["cifar-10-batches-py/test_batch"] = _cifar_batch(test_x, [3])
    _tar(tmp_path / "cifar-10-python.tar.gz", batches)
    data = read_cifar10(tmp_path / "cifar-10-python.tar.gz")
    x, y = data["train"]
    assert x.shape == (10, 1024) and y.tolist() == [1, 8, 2, 7, 3, 6, 4, 5, 5, 4]
    tx, ty = data["test"]
    assert tx[0, 0] == round(0.2989 * 200 + 0.5870 * 100 + 0.1140 * 50) == 124 and tx[0, 1] == 0 and ty.tolist() == [3]
    splits = lra_tasks._image_splits(data, n_valid=2)
    assert len(splits["train"].labels) == 8 and len(splits["valid"].labels) == 2
    assert splits["test"].tokens[0, 0] == 125 and splits["test"].tokens[0, 1] == 1  # pixel + 1: black is not padding


def test_cifar_pickle_that_runs_code_is_refused():
    class Evil:
        def __reduce__(self):
            import os

            return os.system, ("true",)

    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        lra_sources.read_cifar_batch(pickle.dumps({b"data": Evil()}))


def test_pathfinder_png_and_metadata(tmp_path):
    from PIL import Image

    root = tmp_path / "curv_contour_length_14"
    (root / "imgs" / "0").mkdir(parents=True)
    (root / "metadata").mkdir()
    lines = []
    for i in range(4):
        img = np.full((32, 32), 10 * i, dtype=np.uint8)
        img[0, 0] = 255
        Image.fromarray(img).save(root / "imgs" / "0" / f"sample_{i}.png")
        lines.append(f"imgs/0 sample_{i}.png 0 {i % 2} 0.5 1")
    (root / "imgs" / "0" / "sample_4.png").write_bytes(b"")  # the release has a few empty files: skipped
    lines.append("imgs/0 sample_4.png 0 1 0.5 1")
    (root / "metadata" / "0.npy").write_text("\n".join(lines) + "\n")
    x, y = read_pathfinder(root)
    assert x.shape == (4, 1024) and y.tolist() == [0, 1, 0, 1]
    assert x[2, 0] == 255 and x[2, 1] == 20
    splits = lra_tasks._pathfinder_splits(np.repeat(x, 5, 0), np.repeat(y, 5), seed=0)
    assert [len(splits[s].labels) for s in ("train", "valid", "test")] == [16, 2, 2]


def test_extract_prefix_from_the_release_tarball(tmp_path):
    _tar(tmp_path / "lra_release.gz", {"lra_release/tsv_data/new_aan_pairs.train.tsv": b"1\ta\tb\tc\td\n",
                                       "lra_release/listops-1000/basic_train.tsv": b"Source\tTarget\n"})
    out = extract_prefix(tmp_path / "lra_release.gz", "lra_release/tsv_data/", tmp_path / "tsv")
    assert (out / "new_aan_pairs.train.tsv").read_bytes() == b"1\ta\tb\tc\td\n"
    assert not (out / "basic_train.tsv").exists()
    _tar(tmp_path / "evil.gz", {"lra_release/tsv_data/../../escape.txt": b"x"})
    with pytest.raises(ValueError, match="outside"):
        extract_prefix(tmp_path / "evil.gz", "lra_release/tsv_data/", tmp_path / "evil")


def test_data_module_serves_trimmed_padded_batches(tmp_path):
    spec = dict(n_train=40, n_valid=8, n_test=8, min_length=3, max_length=25, max_depth=5, max_args=4)
    dm = LRADataModule("listops", batch_size=8, eval_batch_size=8, max_len=25, listops=spec, name="t",
                       data_dir=str(tmp_path))
    dm.setup()
    batch = next(iter(dm.val_dataloader()))
    s = dm.splits["valid"]
    assert batch.tokens.shape[1] == int(s.lengths[:8].max())  # trimmed to the batch's longest example
    assert ((batch.tokens != 0).sum(1) == s.lengths[:8]).all()
    assert batch.labels.tolist() == s.labels[:8].tolist()
    (tmp_path / "cache" / "lra" / "t" / "train.pt").write_bytes(b"garbage")
    with pytest.raises(Exception, match="sha256"):
        LRADataModule("listops", max_len=25, listops=spec, name="t", data_dir=str(tmp_path)).setup()


def test_data_module_pads_to_the_reference_length(tmp_path):
    spec = dict(n_train=40, n_valid=8, n_test=8, min_length=3, max_length=25, max_depth=5, max_args=4)
    dm = LRADataModule("listops", batch_size=8, eval_batch_size=8, max_len=25, listops=spec, name="t",
                       data_dir=str(tmp_path), pad_to=30)
    dm.setup()
    batch = next(iter(dm.val_dataloader()))
    s = dm.splits["valid"]
    assert batch.tokens.shape == (8, 30) and dm.tgt_len == 30
    assert ((batch.tokens != 0).sum(1) == s.lengths[:8]).all()
    with pytest.raises(ValueError, match="pad to at least max_len"):
        LRADataModule("listops", max_len=25, pad_to=20)
    with pytest.raises(ValueError, match="pixel tasks"):
        LRADataModule("listops", max_len=25, black_is_padding=True)


def test_black_is_padding_gives_grey_level_zero_the_pad_id():
    split = lra_tasks.Split(torch.tensor([[1, 2, 256], [5, 1, 1]], dtype=torch.int16), torch.tensor([3, 3]),
                      torch.tensor([0, 1]))
    batch = lra._collate(split, black_is_padding=True)([0, 1])
    assert batch.tokens.tolist() == [[0, 1, 255], [4, 0, 0]]  # ids 1…256 are grey levels 0…255
    assert lra._collate(split)([0, 1]).tokens.tolist() == [[1, 2, 256], [5, 1, 1]]


# ---------------------------------------------------------------------------------------------- classifier

VARIANTS = ["softmax2", "mgk1", "smgk1", "mgk1_softe", "mgk1_harde", "linear2", "mlk1", "smlk1"]


@pytest.mark.parametrize("variant,dual",
                         [(v, False) for v in VARIANTS] + [(v, True) for v in ("softmax2", "mgk1", "mlk1")])
def test_padding_is_exact(variant, dual):
    torch.manual_seed(0)
    cfg = LRAConfig(n_token=20, num_classes=3, dual=dual, max_len=16, d_model=16, d_inner=24, d_head=8)
    model = LRAClassifier(cfg, Variant.parse(variant)).eval()
    x = torch.randint(1, 20, (3, 7))
    x[1, 5:] = 0  # a shorter example
    x2 = torch.randint(1, 20, (3, 5)) if dual else None
    ref = model(x, x2)
    pad = torch.nn.functional.pad
    more = model(pad(x, (0, 6)), pad(x2, (0, 3)) if dual else None)
    assert_close(more, ref, rtol=1e-5, atol=1e-6)
    alone = model(x[1:2, :5], x2[1:2] if dual else None)  # the short example without any padding
    assert_close(alone, ref[1:2], rtol=1e-5, atol=1e-6)


def test_mean_pooling_ignores_pads():
    torch.manual_seed(0)
    enc = LRAEncoder(LRAConfig(n_token=10, max_len=8, d_model=8, d_inner=16, d_head=4, n_layer=1),
                     Variant.parse("softmax2")).eval()
    x = torch.tensor([[3, 4, 5, 0, 0]])
    pooled = enc(x)
    # the same computation by hand, on the real tokens only
    h = enc.drop(enc.tok(x[:, :3]) + enc.pos.weight[:3])
    h = enc.norm(enc.layers[0](h, torch.zeros(1, 1, 1, 3, dtype=torch.bool)))
    assert_close(pooled, h.mean(1))


def test_padded_pooling_is_the_reference_mean_over_the_padded_length():
    torch.manual_seed(0)
    cfg = LRAConfig(n_token=10, max_len=8, d_model=8, d_inner=16, d_head=4, n_layer=1)
    enc = LRAEncoder(cfg, Variant.parse("softmax2")).eval()
    ref = LRAEncoder(replace(cfg, pooling="padded"), Variant.parse("softmax2")).eval()
    ref.load_state_dict(enc.state_dict())
    x = torch.tensor([[3, 4, 5, 0, 0]])
    # lra/model.py: norm(X) zeroed at the pads, then the mean over all 5 positions
    assert_close(ref(x), enc(x) * 3 / 5)
    with pytest.raises(ValueError, match="pooling is real or padded"):
        LRAConfig(pooling="sum")


@pytest.mark.parametrize("variant", ["softmax2", "mgk1", "linear2"])
def test_attention_fp32_runs_each_attention_in_float32_under_bf16_autocast(variant):
    """`attention_fp32` (the reference's `lra/attention.py`: autocast off, Q, K, V in float32): under bf16 autocast
    each layer's attention output is the float32 model's for the same layer input, bit for bit; without it, bf16."""
    torch.manual_seed(0)
    cfg = LRAConfig(n_token=20, num_classes=3, max_len=64, d_model=32, d_inner=48, d_head=16, attention_fp32=True)
    model = LRAClassifier(cfg, Variant.parse(variant)).eval()
    with torch.no_grad():  # weights far from their small initial values, so that bf16's rounding shows
        for p in model.parameters():
            p.mul_(10)
    x = torch.randint(1, 20, (2, 64))
    device = x.device.type  # the test device's autocast (REPRO_TEST_DEVICE): its attention_fp32 branch runs there
    seen = {}
    layer = model.encoder.layers[0]
    layer.attn.register_forward_hook(lambda m, i, o: seen.setdefault("a", []).append((i[0], o[0])))
    with torch.autocast(device, dtype=torch.bfloat16):
        model(x)
    (h, a), = seen.pop("a")
    assert h.dtype == a.dtype == torch.float32
    assert torch.equal(a, layer.attn(h, mem_BMD=None, mask_TK=torch.zeros(2, 1, 1, 64, dtype=torch.bool))[0])
    layer.attention_fp32 = False
    seen.clear()
    with torch.autocast(device, dtype=torch.bfloat16):
        model(x)
    (h, a), = seen.pop("a")
    assert a.dtype == torch.bfloat16
    assert (a.float() - layer.attn(h.float(), mem_BMD=None, mask_TK=torch.zeros(2, 1, 1, 64, dtype=torch.bool))[0]
            ).abs().max() > 1e-2


def test_variants_parse_and_build():
    assert Variant.parse("smgk4_softe") == Variant("smgk", 4, "soft_em")
    for bad in ("mgk", "softmax2_softe", "mgk0", "mlk2_harde"):
        with pytest.raises(ValueError):
            Variant.parse(bad)
    n = {v: sum(p.numel() for p in LRAClassifier(LRAConfig(n_token=10), Variant.parse(v)).parameters())
         for v in ("softmax8", "mgk4", "linear8", "mlk4")}
    # attention per layer, with the biases of lra/attention.py: softmax-8 q, k, v (64 → 256) and o (256 → 64);
    # MGK-4 q, 2 keys, v (64 → 128) and o + π logits 4·2 (form ours); linear has no π
    softmax8 = 4 * 64 * 256 + 3 * 256 + 64
    mgk4 = 5 * 64 * 128 + 4 * 128 + 64 + 8
    assert n["softmax8"] - n["mgk4"] == 2 * (softmax8 - mgk4)
    assert n["linear8"] - n["mlk4"] == 2 * (softmax8 - mgk4)
    official = sum(p.numel() for p in LRAClassifier(LRAConfig(n_token=10, form="official"),
                                                     Variant.parse("mgk4")).parameters())
    assert n["mgk4"] - official == 2 * (8 - 2)  # official: one clamped π pair per layer


def test_one_cycle_warm_up_outside_its_range_is_refused_in_one_line():
    """OneCycleLR divides by warmup_steps - 1 (a ZeroDivisionError deep in torch at 1): refused with the range."""
    from types import SimpleNamespace

    from papers.mgk.lra import LRAModule

    for warmup, ok in ((1, False), (2, True), (9, True), (10, False)):
        m = LRAModule(model={"n_token": 10, "max_len": 8}, optim={"warmup_steps": warmup})
        m._trainer = SimpleNamespace(max_steps=10)
        if ok:
            assert m.configure_optimizers()["lr_scheduler"]["scheduler"].total_steps == 10
        else:
            with pytest.raises(ValueError, match=r"warmup_steps must lie in \[2, max_steps = 10\)"):
                m.configure_optimizers()


def test_the_sdpa_forms_of_softmax_and_mgk_give_our_layers_outputs():
    """`repro bench-sdpa` times our layers against SDPA forms: first, that those compute the same attention (MGK-4
    as one softmax over its R·K augmented keys, padded keys masked), against torch's SDPA as the reference; a
    wrong sign in the augmented constant or a dropped π moves the output far beyond the tolerance."""
    from papers.mgk.bench_sdpa import layers, padding_mask, sdpa_mgk, sdpa_softmax

    torch.manual_seed(0)
    sm, mg = layers("cpu")
    assert mg.weights.kind == "gradient"
    with torch.no_grad():
        mg.weights.logits.normal_(0, 2.0)  # π far from uniform (uniform π cancels in the softmax)
        h, mask = torch.randn(2, 40, 64) * 3, padding_mask(2, 40, "cpu")
        for m, f in ((sm, sdpa_softmax), (mg, sdpa_mgk)):
            torch.testing.assert_close(f(m, h, mask), m(h, mask_TK=mask)[0], rtol=1e-5, atol=1e-5)
        ours = mg(h, mask_TK=mask)[0]
        assert (sdpa_mgk(mg, h, torch.zeros_like(mask)) - ours).abs().max() > 1e-2  # the mask matters
        mg.weights.logits.zero_()  # and π does: the check above would catch a form that dropped it
        assert (sdpa_mgk(mg, h, mask) - ours).abs().max() > 1e-2


def test_saved_activation_bytes_counts_each_storage_once():
    from papers.mgk.efficiency import saved_activation_bytes

    x = torch.randn(100, requires_grad=True)
    assert saved_activation_bytes(lambda: (x * x).sum()) == 400  # x (100 float32), saved once although used twice
    y = torch.randn(10, 20, requires_grad=True)
    saved = saved_activation_bytes(lambda: (y @ y.t()).exp().sum())
    assert saved == 10 * 20 * 4 + 10 * 10 * 4  # y for the product; exp's output for its backward


def test_saved_activation_bytes_leaves_no_saved_tensor_alive():
    """exp saves its own output for backward: a pack hook returning that tensor made a cycle autograd's graph
    holds and Python's collector cannot free (found on the GPU: the leaked attention maps of each measurement
    showed in the next one's CUDA peak)."""
    import gc
    import weakref

    from papers.mgk.efficiency import saved_activation_bytes

    y = torch.randn(10, 20, requires_grad=True)
    out = []

    def fn():
        e = (y @ y.t()).exp()
        out.append(weakref.ref(e))
        return e.sum()

    assert saved_activation_bytes(fn) == 10 * 20 * 4 + 10 * 10 * 4
    gc.collect()
    assert out[0]() is None


def test_tiny_lra_fit_through_the_cli(tmp_path, monkeypatch, root, capsys):
    """A fit through the Lightning CLI; its summary line shows a classifier's accuracy and loss, not the ppl and bpc
    it logs for the curves (found on the GPU's LRA runs: `val bpc 3.272` for an image classifier)."""
    from repro.cli.lightning_cli import ReproCLI

    monkeypatch.chdir(root)
    monkeypatch.setattr("sys.argv", ["repro"])
    rec = tmp_path / "fit.json"
    ReproCLI(args=["fit", "-c", "configs/mgk/tiny/lra_listops.yaml", "--model.init_args.variant", "mgk1",
                   "--run.tracking", "none", "--run.record", str(rec), "--trainer.max_steps", "4",
                   "--trainer.val_check_interval", "4", "--model.init_args.optim.warmup_steps", "2",
                   "--data.init_args.listops.n_train", "64", "--data.init_args.listops.n_valid", "16",
                   "--data.init_args.listops.n_test", "16", "--data.init_args.name", "embedded-listops-cli-test",
                   "--trainer.enable_model_summary", "false", "--trainer.logger", "false"])
    out = json.loads(rec.read_text())
    assert out["provenance"]["steps"] == 4 and 0 <= out["metrics"]["val/acc"] <= 1
    assert out["model"]["variant"] == "mgk1"
    assert "val/ppl" in out["metrics"]  # still logged (the curves' CSV reads it)
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("fit ")][-1]  # after the progress
    assert " val acc " in line and " val loss " in line and "ppl" not in line and "bpc" not in line, line


@pytest.mark.slow
def test_two_ddp_processes_evaluate_every_example_once(tmp_path, root):
    """Evaluation under DDP: the ranks share the examples without repeating any (501 do not split evenly) and the
    accuracy and loss are those of one process. (Before 2026-11-26 the sampler repeated an example to even the
    shares and the loss was rank 0's alone; Lightning's epoch mean with sync_dist gave 2.3734 against 2.3686.)"""
    import subprocess
    import sys

    common = ["validate", "-c", "configs/mgk/tiny/lra_listops.yaml", "--run.tracking", "none", "--run.untrained",
              "true", "--trainer.precision", "32-true", "--trainer.accelerator", "cpu",
              "--data.init_args.data_dir", str(tmp_path), "--data.init_args.eval_batch_size", "50",
              "--data.init_args.listops", "{n_train: 64, n_valid: 501, n_test: 10, min_length: 16, max_length: 64, "
              "max_depth: 6, max_args: 5, seed: 0}"]

    def run(*extra, out):
        done = subprocess.run([sys.executable, "-m", "repro", *common, *extra, "--run.record", str(tmp_path / out)],
                              cwd=root, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads((tmp_path / out).read_text())["metrics"]

    one = run(out="one.json")
    two = run("--trainer.devices", "2", "--trainer.strategy", "ddp", out="two.json")
    assert two["val/acc"] == pytest.approx(one["val/acc"], abs=1e-7)  # the same 501 examples, each once
    assert two["val/loss"] == pytest.approx(one["val/loss"], rel=1e-6)  # Lightning's synced epoch mean was not
