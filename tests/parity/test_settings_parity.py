"""The paper configs against the authors' released run scripts: every training and evaluation setting, one by one.

`configs/<paper>/paper/*.yaml` claim the authors' exact settings. Their runs' settings are the flags of each
released script (or README command) plus the defaults of the program it calls (`tests/parity/settings.json`,
written by `make_settings.py` from the checkouts: their scripts, commands and the programs' argparse or dataclass
defaults, read as text; for the ∞-former's dialogue, which has no released command, the program's defaults).
Each of our configs is
parsed exactly as `repro fit` parses it (dataclass defaults filled in), and compared field by field with the
script it follows: the model's shape, dropout, initialisation, memory, clamp and same_length, the optimiser and
its schedule, batch and segment lengths, steps, clipping, validation interval, seed, precision, and the
evaluation command's protocol (memory, clamp, same_length, segment, batch).

Where a config departs from its script on purpose, the expected value says how and the comment names the README
entry that documents it (e.g. LaMemo's global batch is its per-GPU batch × 2 GPUs). Every flag a script sets
must be compared here or listed as not a setting of the run (paths, logging, device placement), so a flag
added to a script, or one of ours edited away from it, fails this test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.parity.common import parsed_config as ours

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SETTINGS = json.loads((HERE / "settings.json").read_text())


def theirs(paper: str, script: str, command: str, **override) -> dict:
    """A script command's settings: its program's defaults and module constants, updated by its flags."""
    cmd = SETTINGS[paper]["scripts"][script][command]
    program = SETTINGS[paper]["programs"][cmd["program"]]
    return {**program["constants"], **program["defaults"], **cmd["explicit"], **override}


def explicit(paper: str, script: str, command: str) -> set[str]:
    return set(SETTINGS[paper]["scripts"][script][command]["explicit"])


def compare(rows: list[tuple[str, object, object]]) -> list[str]:
    return [f"{name}: ours {a!r}, theirs {b!r}" for name, a, b in rows if a != b]


# flags that set where or how a run is placed, logged or saved, not what it computes
NOT_SETTINGS = {"cuda", "data", "work_dir", "multi_gpu", "gpu0_bsz", "split", "log_interval", "use_wandb",
                "project_name", "job_name", "name"}
# attn_type of the reference → our attention
ATTENTION = {0: "relative", 2: "absolute", 200: "absolute", 400: "absolute"}  # MGK: 200 MGK, 400 MLK


def unsupported_off(t: dict) -> list[tuple[str, object, object]]:
    """Options of their programs that our configs do not offer: each must be off in the script."""
    return [("varlen", False, t["varlen"]), ("sample_softmax", -1, t["sample_softmax"]), ("ext_len", 0, t["ext_len"]),
            ("clip_nonemb", False, t["clip_nonemb"]), ("init", "normal", t["init"]),
            ("emb_init", "normal", t["emb_init"]), ("restart (a fresh run)", False, bool(t["restart"])),
            ("batch_chunk (1: one pass per batch)", 1, t["batch_chunk"])]


def training_rows(o: dict, t: dict) -> list[tuple[str, object, object]]:
    """The settings every Transformer-XL-derived training script shares with our LM configs."""
    return [
        *[(f"model.{k}", o[f"model.{k}"], t[k]) for k in ("n_layer", "d_model", "n_head", "d_head", "d_inner",
                                                           "dropout", "dropatt", "div_val", "pre_lnorm",
                                                           "init_std", "proj_init_std")],
        ("model.d_embed", o["model.d_embed"], None if t["d_embed"] == -1 else t["d_embed"]),
        ("model.tie_weight", o["model.tie_weight"], not t["not_tied"]),
        # a model without memory (MGK's language model) has none of these settings: no memory, no clamp
        ("memory.mem_len", o.get("model.memory.mem_len", 0), t["mem_len"]),
        ("memory.clamp_len", o.get("model.memory.clamp_len", -1), t["clamp_len"]),
        ("memory.same_length", o.get("model.memory.same_length", False), t["same_length"]),
        ("optim (Adam)", "adam", t["optim"]),
        ("optim.lr", o["model.optim.lr"], t["lr"]),
        ("optim.warmup_steps", o["model.optim.warmup_steps"], t["warmup_step"]),
        ("optim.schedule", o["model.optim.schedule"], t["scheduler"]),
        ("optim.eta_min", o["model.optim.eta_min"], t["eta_min"]),
        ("optim.weight_decay", o["model.optim.weight_decay"], t.get("weight_decay", 0.0)),
        ("data.tgt_len", o["data.tgt_len"], t["tgt_len"]),
        ("data.eval_tgt_len (validation)", o["data.eval_tgt_len"], t["eval_tgt_len"]),
        ("trainer.max_steps", o["trainer.max_steps"], t["max_step"]),
        ("trainer.val_check_interval", o["trainer.val_check_interval"], t["eval_interval"]),
        ("trainer.accumulate_grad_batches", o["trainer.accumulate_grad_batches"], 1),
        ("seed_everything", o["seed_everything"], t["seed"]),
        *unsupported_off(t),
    ]


def eval_rows(o: dict, e: dict) -> list[tuple[str, object, object]]:
    """An evaluation command (eval.py / eval_ddp.py) against the evaluation our config runs."""
    return [("eval_memory.mem_len", o["model.eval_memory.mem_len"], e["mem_len"]),
            ("eval_memory.clamp_len", o["model.eval_memory.clamp_len"], e["clamp_len"]),
            ("eval_memory.same_length", o["model.eval_memory.same_length"], e["same_length"]),
            ("eval_protocol.kind", o["model.eval_protocol.kind"], "memory"),
            ("data.eval_tgt_len", o["data.eval_tgt_len"], e["tgt_len"]),
            ("data.eval_batch_size", o["data.eval_batch_size"], e["batch_size"]),
            ("eval ext_len", 0, e["ext_len"])]


def unmapped(paper: str, script: str, command: str, mapped: set[str]) -> set[str]:
    return explicit(paper, script, command) - mapped - NOT_SETTINGS


TRAIN_MAPPED = {"n_layer", "d_model", "n_head", "d_head", "d_inner", "dropout", "dropatt", "div_val", "pre_lnorm",
                "init_std", "proj_init_std", "d_embed", "not_tied", "mem_len", "clamp_len", "same_length", "optim",
                "lr", "warmup_step", "scheduler", "eta_min", "weight_decay", "tgt_len", "eval_tgt_len", "max_step",
                "eval_interval", "seed", "dataset", "adaptive", "batch_size", "clip", "fp16", "attn_type",
                "eval_batch_size", "roll", "varlen", "sample_softmax", "ext_len", "clip_nonemb", "init", "emb_init",
                "restart", "batch_chunk"}
EVAL_MAPPED = {"mem_len", "clamp_len", "same_length", "tgt_len", "batch_size", "dataset", "ext_len"}

# ---------------------------------------------------------------------------------------------------- Transformer-XL

TXL = {"wt103_base": "run_wt103_base", "wt103_large": "run_wt103_large", "enwik8_12l": "run_enwik8_base",
       "enwik8_24l": "run_enwik8_large", "text8_24l": "run_text8_large", "lm1b_base": "run_lm1b_base",
       "lm1b_large": "run_lm1b_large"}
# train.py, `if args.adaptive:` (code, not a flag): its cutoffs and projection ties per dataset
TXL_ADAPTIVE = {"wt103": ([20000, 40000, 200000], [False, True, True, True]),
                "lm1b": ([60000, 100000, 640000], [False, False, False, False])}


@pytest.mark.parametrize("config", sorted(TXL))
def test_transformer_xl_paper_config_equals_its_script(config):
    script = TXL[config]
    t, e = theirs("transformer_xl", script, "train"), theirs("transformer_xl", script, "eval")
    o = ours(f"configs/transformer_xl/paper/{config}.yaml")
    cutoffs, tie_projs = TXL_ADAPTIVE[t["dataset"]] if t["adaptive"] else ([], None)
    rows = training_rows(o, t) + [
        ("model.attention", o["model.attention"], ATTENTION[t["attn_type"]]),
        ("model.cutoffs", list(o["model.cutoffs"]), cutoffs),
        ("data.corpus", o["data.corpus"], t["dataset"]),
        # global batch; the reference splits it over its GPUs with DataParallel (README: Multi-GPU)
        ("data.batch_size", o["data.batch_size"], t["batch_size"]),
        ("data.eval_batch_size (validation)", o["data.eval_batch_size"], t["eval_batch_size"]),  # train.py constant
        ("trainer.gradient_clip_val", o["trainer.gradient_clip_val"], t["clip"]),
        ("trainer.precision", o["trainer.precision"], "16-mixed" if t["fp16"] else "32-true"),
    ]
    if cutoffs:  # the adaptive softmax's projection ties (without cutoffs there are none)
        rows.append(("model.tie_projs", list(o["model.tie_projs"]), tie_projs))
    oe = ours(f"configs/transformer_xl/paper/{config}.yaml", f"configs/transformer_xl/paper/{config}.eval.yaml")
    rows += eval_rows(oe, e) + [("eval data.corpus", oe["data.corpus"], e["dataset"])]
    assert compare(rows) == []
    assert unmapped("transformer_xl", script, "train", TRAIN_MAPPED) == set()
    assert unmapped("transformer_xl", script, "eval", EVAL_MAPPED) == set()


# ---------------------------------------------------------------------------------------------------- LaMemo

GPUS = 2  # run_*_ddp.sh: CUDA_VISIBLE_DEVICES=0,1, one process per GPU
LAMEMO_VARIANT = {3: "disentangled", 31: "txl", 32: "disentangled_v2", 33: "full"}


@pytest.mark.parametrize("config", [f"{d}_{m}" for d in ("wt103", "enwik8", "text8") for m in ("lamemo", "txl")])
def test_lamemo_paper_config_equals_its_script(config):
    data, model = config.split("_")
    script = f"run_{data}_base_ddp"
    # the Transformer-XL baseline is the same script with attn_type 0 (the reference's original attention)
    t = theirs("lamemo", script, "train", **({"attn_type": 0} if model == "txl" else {}))
    e = theirs("lamemo", script, "eval")
    o = ours(f"configs/lamemo/paper/{config}.yaml")
    rows = training_rows(o, t) + [
        # the baseline configs build Transformer-XL's own module (LaMemo's `look_ahead: false` is the same model)
        ("look-ahead memory", o.get("model.lamemo.look_ahead", False), t["attn_type"] != 0),
        ("module", o["model.class_path"].rsplit(".", 1)[-1], "LaMemoLM" if t["attn_type"] else "TransformerXLLM"),
        *([("lamemo.variant", o["model.lamemo.variant"], LAMEMO_VARIANT[t["attn_type"]])] if t["attn_type"] else []),
        # train_ddp.py sets cutoffs only for lm1b and mn_dataset: `--adaptive` on wt103 leaves a full softmax
        # (README: WikiText-103 softmax)
        ("model.cutoffs", list(o["model.cutoffs"]), []),
        ("data.corpus", o["data.corpus"], t["dataset"]),
        ("data.roll", o["data.roll"], t["roll"]),
        # global batch: per GPU × 2 GPUs, each rank its own slice of the streams (README: rank-sharded streams)
        ("data.batch_size", o["data.batch_size"], t["batch_size"] * GPUS),
        ("data.eval_batch_size (validation)", o["data.eval_batch_size"], t["eval_batch_size"]),
        # their loop backprops (loss + mem_loss) / 2 with mem_loss 0 and clips at 0.25: the same update as
        # clipping the whole loss's gradient at 0.5 (the config's comment)
        ("trainer.gradient_clip_val", o["trainer.gradient_clip_val"], 2 * t["clip"]),
        ("half_loss / calc_mem_loss / enhance_recurrence / attn_norm_type / luna_parallel (off)",
         (False, False, False, 0, False),
         (t["half_loss"], t["calc_mem_loss"], t["enhance_recurrence"], t["attn_norm_type"], t["luna_parallel"])),
        ("max_step_scheduler (the cosine spans max_steps)", None, t["max_step_scheduler"]),
        # apex fp16 O2 in the scripts; the configs train in fp32 (README: Precision)
        ("trainer.precision", o["trainer.precision"], {"O2": "32-true"}[t["fp16"]]),
    ]
    # LaMemo's protocol (eval_ddp.py, the script's eval command) is the training config's own evaluation
    rows += eval_rows(o, e) + [("eval data.corpus", o["data.corpus"], e["dataset"])]
    # the .eval.yaml is Transformer-XL's protocol: kimiyoung/transformer-xl's base script for the same data
    te = theirs("transformer_xl", f"run_{data}_base", "eval")
    oe = ours(f"configs/lamemo/paper/{config}.yaml", f"configs/lamemo/paper/{config}.eval.yaml")
    rows += [(f"{name} (.eval.yaml, Transformer-XL's protocol)", a, b) for name, a, b in eval_rows(oe, te)]
    assert compare(rows) == []
    assert unmapped("lamemo", script, "train", TRAIN_MAPPED) == set()
    assert unmapped("lamemo", script, "eval", EVAL_MAPPED) == set()


# ---------------------------------------------------------------------------------------------------- MGK

MGK_SHARED = {"adaptive", "batch_size", "d_head", "d_inner", "d_model", "dataset", "dropatt", "dropout",
              "eval_tgt_len", "lr", "max_step", "mem_len", "n_layer", "optim", "tgt_len", "warmup_step"}


def test_mgk_script_commands_share_every_training_setting():
    """The basis of the comparison below: script.sh's commands (softmax and the MGK variants, one per line) differ
    only in the attention (attn_type, update_mode, n_head, pi_reg, md_reg) and in names and paths."""
    commands = SETTINGS["mgk"]["scripts"]["script"]
    base = theirs("mgk", "script", "softmax-seed-1111")
    for key in commands:
        t = theirs("mgk", "script", key)
        assert {k: t[k] for k in MGK_SHARED} == {k: base[k] for k in MGK_SHARED}, key


# our config → the command it follows: lmtool-fwms/README.md's Softmax, MGK and MLK commands (8 heads; the 4-head
# models are the same commands with --n_head 4); sMGK and linear have none there, script.sh's softmax command gives
# their shared settings
MGK_COMMAND = {"wt103_softmax8": ("mgk_lm_readme", "README", "Softmax"),
               "wt103_mgk4": ("mgk_lm_readme", "README", "MGK"),
               "wt103_mgk8": ("mgk_lm_readme", "README", "MGK"), "wt103_mlk4": ("mgk_lm_readme", "README", "MLK"),
               "wt103_mlk8": ("mgk_lm_readme", "README", "MLK"), "wt103_smgk8": ("mgk", "script", "softmax-seed-1111"),
               "wt103_linear8": ("mgk", "script", "softmax-seed-1111")}


def test_mgk_readme_commands_share_the_scripts_training_settings():
    base = theirs("mgk", "script", "softmax-seed-1111")
    for key in ("Softmax", "MGK", "MLK"):
        t = theirs("mgk_lm_readme", "README", key)
        assert {k: t[k] for k in MGK_SHARED} == {k: base[k] for k in MGK_SHARED}, key


@pytest.mark.parametrize("config", sorted(MGK_COMMAND))
def test_mgk_paper_config_equals_its_command(config):
    paper, script, command = MGK_COMMAND[config]
    t = theirs(paper, script, command, n_head=int(config[-1]))
    o = ours(f"configs/mgk/paper/{config}.yaml")
    cutoffs, tie_projs = TXL_ADAPTIVE[t["dataset"]]  # lmtool-fwms train.py: the same branch as Transformer-XL's
    rows = training_rows(o, t) + [
        ("model.attention (positions)", o["model.attention"], ATTENTION[t["attn_type"]]),
        ("model.cutoffs", list(o["model.cutoffs"]), cutoffs),
        ("model.tie_projs", list(o["model.tie_projs"]), tie_projs),
        ("data.corpus", o["data.corpus"], t["dataset"]),
        ("data.batch_size", o["data.batch_size"], t["batch_size"]),  # global, as Transformer-XL's
        ("data.eval_batch_size (validation)", o["data.eval_batch_size"], t["eval_batch_size"]),
        ("trainer.gradient_clip_val", o["trainer.gradient_clip_val"], t["clip"]),
        ("trainer.precision", o["trainer.precision"], "16-mixed" if t["fp16"] else "32-true"),
    ]
    if command in ("MGK", "MLK"):  # attn_type 200 / 400 with two keys per head (`rbf2keys`): ours `keys: separate`
        rows += [("mgk.attention", o["model.mgk.attention"], {200: "mgk", 400: "mlk"}[t["attn_type"]]),
                 ("mgk.keys", o["model.mgk.keys"], {"rbf2keys": "separate"}[t["update_mode"]])]
    assert compare(rows) == []
    assert unmapped(paper, script, command, TRAIN_MAPPED | {"update_mode"}) == set()
    # the sliding-window test of the README (split test; the valid one differs only in its split)
    e = next(theirs("mgk_lm_readme", "README", k) for k, c in SETTINGS["mgk_lm_readme"]["scripts"]["README"].items()
             if c["program"] == "eval_sliding_window.py" and c["explicit"]["split"] == "test")
    oe = ours(f"configs/mgk/paper/{config}.yaml", f"configs/mgk/paper/{config}.eval.yaml")
    rows = [("eval_protocol.kind", oe["model.eval_protocol.kind"], "sliding"),
            ("eval_protocol.window", oe["model.eval_protocol.window"], e["tgt_len"]),
            # every token scored from the window that ends at it (their LMSlidingWindowIterator steps by one)
            ("eval_protocol.stride", oe["model.eval_protocol.stride"], 1),
            ("data.eval_batch_size", oe["data.eval_batch_size"], e["batch_size"]),
            ("eval memory (none)", oe.get("model.eval_memory.mem_len", 0), e["mem_len"]),
            # absolute positions within a window of 256: their clamp at 256 never applies
            ("clamp_len beyond the window", True, e["clamp_len"] >= e["tgt_len"] + e["mem_len"]),
            ("eval data.corpus", oe["data.corpus"], e["dataset"])]
    assert compare(rows) == []


# ---------------------------------------------------------------------------------------------------- ∞-former

# sorting/run_sort_inftyformer.sh passes four flags that the released sorting/train.py does not define: argparse
# stops at `--augment` (an abbreviation of `--augment_len`, which then lacks its value), and the model call reads
# `args.continuous_attention` and passes `nfinite_memory=`, which MemTransformerLM does not take. What the flags
# ask for is what the configs follow; these four set nothing a run computes differently:
INFTY_UNDEFINED = {"affines": True,  # μ and σ² are affine maps of the scores in their LongTermAttention either way
                   "augment": True,  # the memory update keeps mem_len + augment_len states (the README's shim)
                   "continuous": True,  # the continuous attention is the long-term attention (no other kind)
                   "data": "../data/"}  # a path
INFTY_MAPPED = {"n_layer", "d_model", "n_head", "d_head", "d_inner", "dropout", "dropatt", "optim", "lr",
                "warmup_step", "max_step", "tgt_len", "mem_len", "eval_tgt_len", "batch_size", "dataset",
                "long_term_attention", "long_term_attention_basis", "long_term_attention_norm", "infinite_memory",
                "augment_len", "mask", "mask_type", "kl_regularizer", "kl_m", "sigma_0", "name"}
SORT_CONFIGS = sorted(p.stem for p in (ROOT / "configs" / "infinity_former" / "paper").glob("sort_*.yaml"))


@pytest.mark.parametrize("config", SORT_CONFIGS)
def test_infinity_former_sorting_config_equals_the_script(config):
    import math

    t = theirs("infinity_former", "run_sort_inftyformer", "train")
    o = ours(f"configs/infinity_former/paper/{config}.yaml")
    length, model = int(config.split("_")[1]), config.split("_", 2)[2]
    segments = math.ceil(length / t["tgt_len"])
    rows = [
        *[(f"model.{k}", o[f"model.{k}"], t[k]) for k in ("n_layer", "d_model", "n_head", "d_head", "d_inner",
                                                           "dropout", "dropatt")],
        ("model.attention", o["model.attention"], ATTENTION[t["attn_type"]]),
        ("optim (Adam)", "adam", t["optim"]),
        ("optim.lr", o["model.optim.lr"], t["lr"]),
        ("optim.warmup_steps", o["model.optim.warmup_steps"], t["warmup_step"]),
        ("optim.schedule", o["model.optim.schedule"], t["scheduler"]),
        ("optim.eta_min", o["model.optim.eta_min"], t["eta_min"]),
        ("clip", o["model.clip"], t["clip"]),
        ("data.batch_size", o["data.batch_size"], t["batch_size"]),
        ("data.tgt_len", o["data.tgt_len"], t["tgt_len"]),
        ("data.eval_tgt_len", o["data.eval_tgt_len"] or o["data.tgt_len"], t["eval_tgt_len"]),
        # the script's data_sort_8000; Figure 3 (left) varies the length: 4000, 8000, 16000
        ("data.length", o["data.length"], length if length != 8000 else int(t["dataset"].rsplit("_", 1)[1])),
        ("trainer.max_steps", o["trainer.max_steps"], t["max_step"]),
        # --eval-interval counts groups of 8 sequences; a batch here is one segment of them (README: Model selection)
        ("trainer.val_check_interval", o["trainer.val_check_interval"], t["eval_interval"] * segments),
        ("seed_everything", o["seed_everything"], t["seed"]),
        ("trainer.precision", o["trainer.precision"], "16-mixed" if t["fp16"] else "32-true"),
        *unsupported_off(t),
    ]
    ltm = {"infty": "linear", "infty_sticky": "sticky"}.get(model.split("_n")[0] if "_n" in model else model)
    if ltm:
        # the figure's N = 1024 where the script says 512 (README: Configs); Figure 3 (right) varies it
        n_basis = int(model.rsplit("_n", 1)[1]) if "_n" in model else 1024
        rows += [("memory.mem_len", o["model.memory.mem_len"], t["mem_len"]),
                 ("ltm.n_basis", o["model.ltm.n_basis"], n_basis),
                 ("ltm (Gaussian densities: softmax)", "softmax", t["long_term_attention_norm"]),
                 ("long-term attention, unbounded", True, t["long_term_attention"] and t["infinite_memory"]),
                 # what enters the LTM is one segment of states: augment_len = tgt_len = mem_len (README)
                 ("augment_len", t["tgt_len"], t["augment_len"]),
                 ("ltm.gate (Conv1d mask)", o["model.ltm.gate"], t["mask"] and t["mask_type"] == "cnn"),
                 ("ltm.sigma_0", o["model.ltm.sigma_0"], t["sigma_0"]),
                 ("ltm.mu_0", o["model.ltm.mu_0"], t["mu_0"]),
                 ("ltm.kl_weight", o["model.ltm.kl_weight"], t["kl_m"] if t["kl_regularizer"] else 0.0),
                 ("ltm.sampling", o["model.ltm.sampling"], ltm)]
    elif model == "txl":  # the paper's equal budget (§4.1): Transformer-XL with memory 2048
        rows += [("memory.mem_len", o["model.memory.mem_len"], 2 * t["mem_len"]), ("ltm", o["model.ltm"], None)]
    else:  # compressive: 1024 memory + 1024 compressed slots (README: Configs)
        rows += [("memory.mem_len", o["model.memory.mem_len"], t["mem_len"]),
                 ("compressive.cmem_len", o["model.compressive.cmem_len"], t["mem_len"])]
    assert compare(rows) == []
    cmd = SETTINGS["infinity_former"]["scripts"]["run_sort_inftyformer"]["train"]
    assert cmd["undefined"] == INFTY_UNDEFINED
    assert set(cmd["explicit"]) - INFTY_MAPPED - NOT_SETTINGS == set()


# MGK's Long Range Arena: lra/README.md gives the commands of Retrieval only (run_tasks.py), against
# lra_retrieval.yaml; the other tasks below.
LRA_MAPPED = {"model", "task", "batch_size", "warmup", "learning_rate", "weight_decay", "num_layers", "max_seq_len",
              "num_train_steps", "eval_frequency", "num_head", "key2", "multi_gauss", "hard_em", "soft_em",
              # not settings of a run here: the split sizes (ours reads every example of each split: the same
              # 147,086 / 18,090 / 17,437), the development batches (ours scores the whole split; theirs 565
              # batches of an endless reshuffled iterator: the config's comment), the seed (the paper profile runs
              # seeds 1-5, params.paper.yaml; the README's commands show one), pi0 (drawn, never used)
              "n_train_samples", "n_dev_samples", "n_test_samples", "num_eval_steps", "seed", "pi0"}


def lra_model_rows(o: dict, t: dict) -> list[tuple[str, object, object]]:
    """The classifier and optimiser settings of run_tasks.py that every LRA config shares."""
    return [("model.n_layer", o["model.n_layer"], t["num_layers"]),
            ("model.d_model (embedding)", o["model.d_model"], t["embedding_dim"]),
            ("model.d_model (transformer)", o["model.d_model"], t["transformer_dim"]),
            ("model.d_inner", o["model.d_inner"], t["transformer_hidden_dim"]),
            ("model.d_head", o["model.d_head"], t["head_dim"]),
            ("model.dropout", o["model.dropout"], t["dropout_prob"]),
            ("model.dropatt", o["model.dropatt"], t["attention_dropout"]),
            ("model.pooling (mean over the padded length)", o["model.pooling"], {"MEAN": "padded"}[t["pooling_mode"]]),
            ("positions learned, untied, no CLS token", (1, False, False, False),
             (t["learn_pos_emb"], t["tied_weights"], t["cls_token"], t["fixed_pos_emb"])),
            ("optim.lr", o["model.optim.lr"], t["learning_rate"]),
            ("optim.weight_decay", o["model.optim.weight_decay"], t["weight_decay"]),
            ("optim.adam_eps", o["model.optim.adam_eps"], t["adam_eps"]),
            ("trainer.accumulate_grad_batches", o["trainer.accumulate_grad_batches"], t["accu_grad_step"]),
            # lra/attention.py turns autocast off for the attention and runs it in float32
            ("model.attention_fp32", o["model.attention_fp32"], True)]


@pytest.mark.parametrize("command", sorted(SETTINGS["mgk_lra"]["scripts"]["README"]))
def test_mgk_lra_retrieval_config_equals_the_readme_commands(command):
    t = theirs("mgk_lra", "README", command)
    o = ours("configs/mgk/paper/lra_retrieval.yaml")
    rows = lra_model_rows(o, t) + [
            ("data.task", o["data.task"], t["task"]),
            ("model.num_classes", o["model.num_classes"], t["num_classes"]),
            ("model.max_len", o["model.max_len"], t["max_seq_len"]),
            ("data.pad_to", o["data.pad_to"], t["max_seq_len"]),
            ("optim.warmup_steps", o["model.optim.warmup_steps"], t["warmup"]),
            ("optim.schedule (OneCycleLR, linear)", "linear", t["lr_decay"] if not t["fixed_lr"] else "constant"),
            ("data.batch_size", o["data.batch_size"], t["batch_size"]),
            ("data.eval_batch_size", o["data.eval_batch_size"], t["batch_size"]),
            ("trainer.max_steps", o["trainer.max_steps"], t["num_train_steps"]),
            ("trainer.val_check_interval", o["trainer.val_check_interval"], t["eval_frequency"]),
            ("trainer.gradient_clip_val (none)", o["trainer.gradient_clip_val"], None),
            # run_tasks.py always trains in fp16 autocast with a gradient scaler; the configs use bf16-mixed
            # (16-mixed cannot run on the CPU), with the attention in float32 as theirs (MGK README: Precision)
            ("trainer.precision", o["trainer.precision"], "bf16-mixed")]
    assert compare(rows) == []
    assert set(SETTINGS["mgk_lra"]["scripts"]["README"][command]["explicit"]) - LRA_MAPPED == set()


@pytest.mark.parametrize("task", ["listops", "text", "retrieval", "image", "pathfinder"])
def test_mgk_lra_configs_keep_run_tasks_model_and_optimiser(task):
    """run_tasks.py's defaults that no released command overrides, for every LRA task: the classifier's shape,
    dropout, pooling and the optimiser (each task's batch, steps, warm-up and validation: the next test)."""
    o = ours(f"configs/mgk/paper/lra_{task}.yaml")
    assert compare(lra_model_rows(o, theirs("mgk_lra", "README", "Softmax 1 heads"))) == []


# where each LRA config's batch, steps, warm-up and validation interval come from (the configs' header comments):
# ListOps and Text run run_tasks.py's defaults (for Text the same as Nyströmformer's lra_config.py, whose pipeline
# MGK's code reuses), Retrieval the MGK README's commands (above), Image and Pathfinder Nyströmformer's lra_config.py
LRA_TRAINING = {"listops": "run_tasks.py", "text": "run_tasks.py", "image": "image", "pathfinder": "pathfinder32"}


@pytest.mark.parametrize("task", sorted(LRA_TRAINING))
def test_mgk_lra_training_settings_equal_their_source(task):
    source = LRA_TRAINING[task]
    if source == "run_tasks.py":
        t = SETTINGS["mgk_lra"]["programs"]["run_tasks.py"]["defaults"]
    else:
        t = SETTINGS["nystromformer_lra"]["config"][source]["training"]
    o = ours(f"configs/mgk/paper/lra_{task}.yaml")
    rows = [("data.batch_size", o["data.batch_size"], t["batch_size"]),
            ("optim.lr", o["model.optim.lr"], t["learning_rate"]),
            ("optim.warmup_steps", o["model.optim.warmup_steps"], t["warmup"]),
            ("optim.schedule (OneCycleLR, linear)", "linear", t["lr_decay"]),
            ("optim.weight_decay", o["model.optim.weight_decay"], t["weight_decay"]),
            ("trainer.max_steps", o["trainer.max_steps"], t["num_train_steps"]),
            ("trainer.val_check_interval", o["trainer.val_check_interval"], t["eval_frequency"])]
    if task == "text":  # the two sources agree
        n = SETTINGS["nystromformer_lra"]["config"]["text"]["training"]
        rows += [(f"text: run_tasks.py {k} = Nyströmformer's", t[k], n[k])
                 for k in ("batch_size", "learning_rate", "warmup", "num_train_steps", "eval_frequency")]
    assert compare(rows) == []


# GPT-2 with memories. Table 1: the README's run_clm.py command (HfArgumentParser over run_clm.py's dataclasses and
# the vendored Trainer's TrainingArguments). Its last two lines, `--kl_regularizer` and `--kl_m=.000001`, follow a
# line without `\\`: a shell would not pass them. The configs follow what they ask for (λ_KL = 1e-6, README).
GPT2_MAPPED = {"model_name_or_path", "model_type", "config_name", "per_device_train_batch_size",
               "per_device_eval_batch_size", "block_size", "kl_regularizer", "kl_m",
               # the run's files and what to run: data paths (the data module's source), the output folder
               "train_file", "validation_file", "output_dir", "do_train", "do_eval"}
GPT2_CONFIGS = [f"gpt2_{d}_{m}" for d in ("wt103", "pg19") for m in ("gpt2", "compressive", "inftyformer",
                                                                    "inftyformer_sticky")]


@pytest.mark.parametrize("config", GPT2_CONFIGS)
def test_infinity_former_gpt2_lm_config_equals_the_readme_command(config):
    key = next(k for k in SETTINGS["infinity_former_gpt2"]["scripts"]["README"] if "fine-tune" in k)
    cmd = SETTINGS["infinity_former_gpt2"]["scripts"]["README"][key]
    t = theirs("infinity_former_gpt2", "README", key, **cmd["detached"])
    o = ours(f"configs/infinity_former/paper/{config}.yaml")
    memory = not config.endswith("_gpt2")
    rows = [("model.pretrained", o["model.pretrained"], t["model_name_or_path"]),
            ("optim.lr", o["model.optim.lr"], t["learning_rate"]),
            *([("optim.lr_memory", o["model.optim.lr_memory"], t["learning_rate_ltm"])] if memory else []),
            ("optim.schedule", o["model.optim.schedule"], t["lr_scheduler_type"]),
            ("optim.warmup_steps", o["model.optim.warmup_steps"], t["warmup_steps"]),
            ("optim.weight_decay", o["model.optim.weight_decay"], t["weight_decay"]),
            ("optim.betas", tuple(o["model.optim.betas"]), (t["adam_beta1"], t["adam_beta2"])),
            ("optim.eps", o["model.optim.eps"], t["adam_epsilon"]),
            ("trainer.gradient_clip_val", o["trainer.gradient_clip_val"], t["max_grad_norm"]),
            ("trainer.max_epochs", o["trainer.max_epochs"], t["num_train_epochs"]),
            ("trainer.max_steps", o["trainer.max_steps"], t["max_steps"]),
            ("trainer.accumulate_grad_batches", o["trainer.accumulate_grad_batches"], t["gradient_accumulation_steps"]),
            ("data.block_size", o["data.block_size"], t["block_size"]),
            ("data.batch_size", o["data.batch_size"], t["per_device_train_batch_size"]),
            ("data.eval_batch_size", o["data.eval_batch_size"], t["per_device_eval_batch_size"]),
            ("seed_everything", o["seed_everything"], t["seed"]),
            ("trainer.precision", o["trainer.precision"], "16-mixed" if t["fp16"] else "32-true")]
    if memory and "inftyformer" in config:
        rows += [("ltm.kl_weight", o["model.memory_hook.args.ltm.kl_weight"],
                  t["kl_m"] if t["kl_regularizer"] else 0.0),
                 ("ltm.sampling", o["model.memory_hook.args.ltm.sampling"],
                  "sticky" if config.endswith("sticky") else "linear")]
    assert compare(rows) == []
    assert (set(cmd["explicit"]) | set(cmd["detached"])) - GPT2_MAPPED == set()


@pytest.mark.parametrize("config", [f"gpt2_dog_{m}" for m in ("gpt2", "nodoc", "compressive", "inftyformer",
                                                             "inftyformer_sticky")])
def test_infinity_former_dialogue_config_keeps_train_py_defaults(config):
    """Table 2: no command was released; document_grounded_generation/train.py's and eval.py's defaults."""
    t = SETTINGS["infinity_former_dialogue"]["programs"]["train.py"]["defaults"]
    o = ours(f"configs/infinity_former/paper/{config}.yaml")
    rows = [("optim.lr", o["model.optim.lr"], t["lr"]),
            ("optim.lr_memory (one rate: --lr_ltm 0)", o["model.optim.lr_memory"], t["lr_ltm"] or None),
            ("optim.clip (per conversation step)", o["model.optim.clip"], t["max_norm"]),
            ("optim.step_per", o["model.optim.step_per"], "conversation"),  # one update per conversation, batch 1
            ("data.block_size", o["data.block_size"], t["max_len"]),
            ("trainer.max_epochs", o["trainer.max_epochs"], t["n_epochs"]),
            ("trainer.accumulate_grad_batches", o["trainer.accumulate_grad_batches"], t["gradient_accumulation_steps"]),
            ("seed_everything", o["seed_everything"], t["seed"]),
            ("trainer.precision", o["trainer.precision"], "32-true" if not t["fp16"] else "16-mixed")]
    if "inftyformer" in config:  # --kl_m's default, with the regulariser on (README: λ_KL of the dialogue script)
        rows += [("ltm.kl_weight", o["model.memory_hook.args.ltm.kl_weight"], t["kl_m"])]
    assert compare(rows) == []
    # Table 2's test: eval.py's defaults (sampling, lengths, seed) against the .eval.yaml
    e = SETTINGS["infinity_former_dialogue"]["programs"]["eval.py"]["defaults"]
    oe = ours(f"configs/infinity_former/paper/{config}.yaml", f"configs/infinity_former/paper/{config}.eval.yaml")
    rows = [("generation.enabled", oe["model.generation.enabled"], True),
            ("generation.top_p", oe["model.generation.top_p"], e["top_p"]),
            ("generation.temperature", oe["model.generation.temperature"], e["temperature"]),
            ("top_k (off: nucleus sampling only)", 0, e["top_k"]),
            ("generation.max_tokens", oe["model.generation.max_tokens"], e["max_length"]),
            # --min_length 1: a special token drawn as the first token is drawn again
            ("generation.first_special", oe["model.generation.first_special"],
             "redraw" if e["min_length"] >= 1 else "ban"),
            ("generation.seed", oe["model.generation.seed"], e["seed"]),
            # build_input_from_segments_ scores utterance i + 1 once `i >= min_history`: ≥ 3 previous utterances at 2
            ("data.min_history", oe["data.min_history"], e["min_history"] + 1)]
    assert compare(rows) == []


def test_a_changed_setting_is_caught():
    """The comparison is not vacuous: one of Transformer-XL's settings moved in an override fails it."""
    t = theirs("transformer_xl", "run_wt103_base", "train")
    o = ours("configs/transformer_xl/paper/wt103_base.yaml")
    assert compare(training_rows(o, t)) == []
    o["model.optim.warmup_steps"] = 1000
    assert compare(training_rows(o, t)) == ["optim.warmup_steps: ours 1000, theirs 0"]
    assert compare(training_rows(o, theirs("transformer_xl", "run_wt103_base", "train", clamp_len=400))) != []
