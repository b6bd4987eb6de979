"""Make the TensorFlow Transformer-XL parity fixtures from a checkout of kimiyoung/transformer-xl:
`/work/tfenv/bin/python tests/parity/make_transformer_xl_tf.py CHECKOUT` writes `tests/parity/transformer_xl_tf/<case>/`
and `tests/parity/transformer_xl_tf/cache.pkl` (+ `cache.json`).

What it is: files written by TensorFlow itself, running the authors' own `tf/model.py` `transformer(...)`, so that
our pure-Python reader of TF checkpoints and our converter to the PyTorch model are tested against real TF output.
Follows `tests/parity/make_transformer_xl.py` (the PyTorch fixtures: cases dict, fixed seeds, fp32, no dropout,
weights re-drawn large, >= 3 segments carrying the memory) and the spirit of `tests/parity/common.py`, but differs
in its file format: this script runs in a separate TensorFlow environment (`python3 -m venv /work/tfenv &&
/work/tfenv/bin/pip install tensorflow-cpu tf-keras numpy`) without torch or the `repro` package, so each case is a
folder holding what TF wrote, byte for byte (`checkpoint`, `model.ckpt-0.index`, `model.ckpt-0.data-00000-of-00001`
from `tf.compat.v1.train.Saver().save(sess, "model.ckpt", global_step=0, write_meta_graph=False)`: the `.meta` graph
of the released models is not written, a reader of the weights needs none of it) and a `fixture.json` with the
settings, every `transformer` argument, the token segments (time-major [tgt_len, batch], as `model.transformer`
takes them after `train_gpu.py`'s transpose), the per-token losses of every segment ([tgt_len, batch]: the input of
the `tf.reduce_mean` that ends `mask_adaptive_logsoftmax`, fetched from the graph as `loss.op.inputs[0]`, since
`transformer` returns the mean only), every variable (name, shape, dtype), the TF version and the authors' commit.

The memory follows `train_gpu.py`'s `evaluate`: the placeholders are [mem_len, batch, d_model] and the first segment
is fed zeros (not an empty memory: TF's first segment attends to mem_len zero vectors, which `_create_mask` leaves
unmasked); then each segment's `new_mems` is fed back as `mems`.

Cases (released layouts, `tf/sota/*.sh` with `train_gpu.py`'s flags mapped onto `transformer` arguments):
- `enwik8` (also text8): untie_r False (one r_w_bias/r_r_bias [n_head, d_head]), cutoffs [] (plain softmax), div_val
  1, d_embed == d_model (no proj_W), the released evaluation's clamp_len (smaller than tgt+mem) and same_length True;
- `wt103`: untie_r True ([n_layer, n_head, d_head]), div_val 4, cutoffs [10, 20, 30] of n_token 40,
  proj_share_all_but_first True (tie_projs [False, True, True, True]), proj_same_dim True (the default: cluster 0
  gets proj_W / proj although its width equals d_model), clamp_len and same_length as released;
- `wt103_shared_r`, `lm1b_shared_r`: the two above with untie_r False, so that their adaptive input and softmax
  are checked on their own;
- `lm1b`: untie_r True, div_val 4, cutoffs [10, 20, 30], proj_share_all_but_first False, proj_same_dim False (no
  projection where the cluster width equals d_model: cluster 0 of the input and of the softmax), clamp_len -1,
  same_length True.
d_model 64 in the adaptive cases: div_val 4 over four clusters needs 64 for the last width (64 / 4**3) to be 1.
`tie_weight` is a flag of `train_gpu.py` that nothing reads: `transformer` always reuses the embedding tables as
softmax weights; it is recorded as True.

Weights: the graph is built with `train_gpu.py`'s initializers (normal, init_std 0.02, proj_init_std 0.01), then every
variable is re-drawn in numpy (seeded per case) and loaded, like `enlarge_` does for the PyTorch fixtures, at scales
that keep the softmaxes unsaturated (per-token losses 5-9 nats) while every mechanism counts: dense kernels
N(0, 1.5/sqrt(fan_in)), lookup tables and cluster_W N(0, 1.5/sqrt(width)), proj_W / proj N(0, 1/sqrt(d_model)),
biases, LayerNorm betas and the zero-initialised softmax b / cluster_b N(0, 0.5) (the authors' zero cluster_W and
cluster_b would hide the order of the cluster logits), LayerNorm gammas 1 + N(0, 0.2), r_w_bias N(+0.5, 0.5) and
r_r_bias N(-0.5, 0.5) (standard deviations). Checked while writing this script: swapping r_w_bias and r_r_bias,
clamp_len -1 (enwik8, wt103), same_length False, layer 1 given layer 0's biases (untie_r cases) and reversed
cluster_W rows each move some per-token loss by 0.3 to 4 nats. fp32, is_training False, dropout 0, one CPU thread.

Run-time shims (the authors' files are never edited or copied; `CHECKOUT/tf` is put on sys.path):
- `TF_USE_LEGACY_KERAS=1` with the `tf-keras` package installed: since TF 2.16 `tf.compat.v1.layers.dense` /
  `.dropout` (model.py's `tf.layers`) exist only with Keras 2 (`tf_keras`); under Keras 3 they raise. These are the
  legacy TF1 layers themselves (variables `<name>/kernel`, `<name>/bias` via `tf.get_variable`).
- `tensorflow.compat.v1.disable_v2_behavior()` (graph mode, TF1 variable scoping, sessions).
- `sys.modules["tensorflow"] = tensorflow.compat.v1` while `import model` runs (restored after): model.py's
  `import tensorflow as tf` then binds the v1 API, where `tf.variable_scope`, `tf.get_variable`,
  `tf.matrix_band_part`, `tf.to_int64`, `tf.layers`, `tf.initializers` live.
- `tf.contrib.layers.layer_norm` (gone in TF 2): a namespace attached to the v1 module holding a re-statement of TF
  1.12's `tf.contrib.layers.layer_norm` (variable scope default name `LayerNorm`, variables `beta` (zeros) then
  `gamma` (ones) of shape inputs.shape[begin_params_axis:], `tf.nn.moments` over axes begin_norm_axis.., then
  `tf.nn.batch_normalization` with variance_epsilon 1e-12 (1e-3 for float16)); it uses `tf.get_variable` where
  contrib used `model_variable` (which also files the variable under MODEL_VARIABLES: no difference to the
  checkpoint or the output).

`cache.pkl`: the released `data/cache.pkl` is `data_utils.get_lm_corpus`'s `pickle.dump(corpus, fp, protocol=2)`
under Python 2.7 of a `data_utils.Corpus` holding a `vocabulary.Vocab`. Python 2 cannot run here, so `Py2Pickler`
below writes the opcodes Python 2.7's pure-Python `pickle.Pickler` (protocol 2; the authors `import pickle`, not
cPickle) emits for that object graph, for a small wt103-style corpus (special ["<eos>"], lower_case False, "<unk>" an
ordinary symbol, 40 symbols with distinct counts so that `most_common` has no ties, non-ASCII words):
- PROTO 2 first and STOP last; no FRAME (protocol 4) and no SHORT_BINUNICODE / BINUNICODE8 (protocol 4): none of the
  Python-3-only opcodes;
- the instances of the two new-style classes as `copy_reg.__reduce_ex__(2)` gives them: GLOBAL 'data_utils Corpus' /
  GLOBAL 'vocabulary Vocab' (module paths as the classes are defined, as Hugging Face's converter of these files
  registers them: `sys.modules["data_utils"]`, `sys.modules["vocabulary"]`; a corpus built by running
  `python data_utils.py` itself would name `__main__` instead), EMPTY_TUPLE, NEWOBJ, then the instance `__dict__`
  as EMPTY_DICT MARK ... SETITEMS and BUILD;
- every Python 2 `str` (attribute names, symbols, 'i8', the array bytes) as SHORT_BINSTRING (< 256 bytes) or
  BINSTRING: raw bytes with no encoding; the non-ASCII symbols are their UTF-8 bytes, as Python 2 read them from the
  text files (`tf.gfile.Open(path, 'r')` gives `str`, and neither file has `unicode_literals`), so the file holds
  no `unicode` and no BINUNICODE. In Python 3 they load with `pickle.load(f, encoding="latin1")` as latin-1 str
  ('cafÃ©'), to be re-encoded (`s.encode("latin1").decode("utf-8")`); `cache.json` lists the expected idx2sym as text;
- Python 2.7's `Counter.__reduce__` (GLOBAL 'collections Counter', a 1-tuple of a plain dict, REDUCE) and
  `OrderedDict.__reduce__` (GLOBAL 'collections OrderedDict', a 1-tuple of a list of [key, value] lists, REDUCE:
  not Python 3's EMPTY_TUPLE REDUCE + SETITEMS);
- numpy 1.x's `ndarray.__reduce__` for train/valid/test (GLOBAL 'numpy.core.multiarray _reconstruct', (GLOBAL 'numpy
  ndarray', (0,), 'b') REDUCE, then BUILD of (1, shape, dtype, False, bytes)), and the dtype as GLOBAL 'numpy dtype',
  ('i8', 0, 1) REDUCE, BUILD (3, '<', None, None, None, -1, -1, 0); the builtin int64 dtype is one object, so the
  second and third arrays refer to it by BINGET;
- ints as BININT1 / BININT2 / BININT, None as NONE, bools as NEWFALSE / NEWTRUE, tuples of 1-3 as TUPLE1-3 and
  longer as MARK ... TUPLE, lists as EMPTY_LIST + MARK ... APPENDS (APPEND for one item), dicts with SETITEMS (SETITEM
  for one item);
- the memo as Python 2's does it, by object identity: BINPUT after every str, tuple, list, dict, global and reduced
  object (LONG_BINPUT / LONG_BINGET past index 255: this small file stays below), and BINGET for a second reference:
  the symbols are one object each in the Counter, idx2sym and sym2idx (build_vocab iterates
  `counter.most_common()`), so the Counter writes them and idx2sym / sym2idx refer back by BINGET; single-character
  strings ('<', 'b') are CPython 2's cached one-character objects.
The file's opcodes, all of them (checked when it is written): PROTO, GLOBAL, BINPUT, BINGET, EMPTY_TUPLE, NEWOBJ,
EMPTY_DICT, EMPTY_LIST, MARK, SETITEMS, APPENDS, APPEND, SHORT_BINSTRING, BINSTRING (the train array's bytes),
BININT1, BININT2, BININT (-1), NONE, NEWFALSE, TUPLE1, TUPLE3, TUPLE, REDUCE, BUILD, STOP. Python 3's
`pickle.load` with its default encoding ('ASCII') cannot read it (the UTF-8 bytes of the non-ASCII symbols).
Dict items are written in insertion order, where Python 2 wrote its hash order: no reader may depend on it.
`cache.json` also holds `corpus-info.json` as get_lm_corpus writes it and the opcodes the file uses.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import pickletools
import random
import struct
import subprocess
import sys
import types
from collections import Counter, OrderedDict
from pathlib import Path

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.compat.v1.layers needs Keras 2 (tf_keras)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "transformer_xl_tf"
REPO = "kimiyoung/transformer-xl"
B = 2
SEGMENTS = 4

# case → the `transformer` arguments that differ between the released layouts, and the segment lengths.
# Lengths: tgt 4, mem 6 (memory longer than the segment, as in the released evaluations: 128/3800, 128/1600, 32/128).
CASES = {
    # tf/sota/enwik8.sh, text8.sh: 24L/1024d, no adaptive softmax, untie_r False; test: clamp_len 1000 < 128 + 3800,
    # same_length True. Here clamp_len 5 < 4 + 6.
    "enwik8": dict(model=dict(n_token=40, n_layer=2, d_model=16, d_embed=16, n_head=2, d_head=8, d_inner=32,
                              cutoffs=[], div_val=1, untie_r=False, proj_share_all_but_first=False,
                              proj_same_dim=True, same_length=True, clamp_len=5),
                   tgt=4, mem=6),
    # tf/sota/wt103.sh: div_val 4, untie_r, proj_share_all_but_first, proj_same_dim default (True); test: clamp_len
    # 1000 < 128 + 1600, same_length True. Here clamp_len 7 < 4 + 6.
    "wt103": dict(model=dict(n_token=40, n_layer=2, d_model=64, d_embed=64, n_head=2, d_head=4, d_inner=16,
                             cutoffs=[10, 20, 30], div_val=4, untie_r=True, proj_share_all_but_first=True,
                             proj_same_dim=True, same_length=True, clamp_len=5),
                  tgt=4, mem=6),
    # tf/sota/lm1b.sh: div_val 4, untie_r, proj_share_all_but_first False, proj_same_dim False; test: clamp_len -1,
    # same_length True.
    "lm1b": dict(model=dict(n_token=40, n_layer=2, d_model=64, d_embed=64, n_head=2, d_head=4, d_inner=16,
                            cutoffs=[10, 20, 30], div_val=4, untie_r=True, proj_share_all_but_first=False,
                            proj_same_dim=False, same_length=True, clamp_len=-1),
                 tgt=4, mem=6),
    # the two adaptive layouts with one pair of attention biases (untie_r False): their embedding and softmax
    # conversion checked before the backbone holds per-layer biases (appended last: the seeds above stay)
    "wt103_shared_r": dict(model=dict(n_token=40, n_layer=2, d_model=64, d_embed=64, n_head=2, d_head=4, d_inner=16,
                                      cutoffs=[10, 20, 30], div_val=4, untie_r=False, proj_share_all_but_first=True,
                                      proj_same_dim=True, same_length=True, clamp_len=5),
                           tgt=4, mem=6),
    "lm1b_shared_r": dict(model=dict(n_token=40, n_layer=2, d_model=64, d_embed=64, n_head=2, d_head=4, d_inner=16,
                                     cutoffs=[10, 20, 30], div_val=4, untie_r=False, proj_share_all_but_first=False,
                                     proj_same_dim=False, same_length=True, clamp_len=-1),
                          tgt=4, mem=6),
}


# --------------------------------------------------------------------------------------------- the authors' model


def layer_norm_v1(tf):
    """TF 1.12's `tf.contrib.layers.layer_norm`, restated on `tf.compat.v1` (see the module docstring)."""

    def layer_norm(inputs, center=True, scale=True, activation_fn=None, reuse=None, variables_collections=None,
                   outputs_collections=None, trainable=True, begin_norm_axis=1, begin_params_axis=-1, scope=None):
        with tf.variable_scope(scope, "LayerNorm", [inputs], reuse=reuse):
            inputs = tf.convert_to_tensor(inputs)
            inputs_shape = inputs.shape
            inputs_rank = inputs_shape.ndims
            if inputs_rank is None:
                raise ValueError(f"Inputs {inputs.name} has undefined rank.")
            dtype = inputs.dtype.base_dtype
            if begin_norm_axis < 0:
                begin_norm_axis = inputs_rank + begin_norm_axis
            if begin_params_axis >= inputs_rank or begin_norm_axis >= inputs_rank:
                raise ValueError(f"begin_params_axis ({begin_params_axis}) and begin_norm_axis ({begin_norm_axis}) "
                                 f"must be < rank(inputs) ({inputs_rank})")
            params_shape = inputs_shape[begin_params_axis:]
            if not params_shape.is_fully_defined():
                raise ValueError(f"Inputs {inputs.name}: shape[begin_params_axis:] is not fully defined: "
                                 f"{params_shape}")
            beta = gamma = None
            if center:
                beta = tf.get_variable("beta", shape=params_shape, dtype=dtype,
                                       initializer=tf.zeros_initializer(), trainable=trainable)
            if scale:
                gamma = tf.get_variable("gamma", shape=params_shape, dtype=dtype,
                                        initializer=tf.ones_initializer(), trainable=trainable)
            norm_axes = list(range(begin_norm_axis, inputs_rank))
            mean, variance = tf.nn.moments(inputs, norm_axes, keep_dims=True)
            variance_epsilon = 1e-12 if dtype != tf.float16 else 1e-3
            outputs = tf.nn.batch_normalization(inputs, mean, variance, offset=beta, scale=gamma,
                                                variance_epsilon=variance_epsilon)
            outputs.set_shape(inputs_shape)
            if activation_fn is not None:
                outputs = activation_fn(outputs)
            return outputs

    return layer_norm


def import_authors(checkout: Path):
    """(tf.compat.v1, the authors' `model` module) with the shims of the module docstring."""
    import tensorflow
    import tensorflow.compat.v1 as tf

    tf.disable_v2_behavior()
    tf.logging.set_verbosity(tf.logging.ERROR)
    if not hasattr(tf, "contrib"):
        tf.contrib = types.SimpleNamespace(layers=types.SimpleNamespace(layer_norm=layer_norm_v1(tf)))
    tf.layers.dense  # noqa: B018 -- fails here, not inside the model, when tf_keras is missing
    path = str((checkout / "tf").resolve())
    sys.path.insert(0, path)
    sys.modules["tensorflow"] = tf
    try:
        import model
    finally:
        sys.modules["tensorflow"] = tensorflow
        sys.path.remove(path)
    assert model.tf is tf
    return tensorflow, tf, model


def checkout_commit(checkout: Path) -> str:
    out = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if out.returncode == 0:
        return out.stdout.strip()
    marker = checkout / "COMMIT"
    if marker.is_file():
        return marker.read_text().strip()
    raise SystemExit(f"{checkout}: no git history and no COMMIT file; clone {REPO} there")


def draw_tokens(n_token: int, cutoffs: list[int], rng: np.random.Generator) -> np.ndarray:
    """A time-major stream (SEGMENTS * tgt + 1, B) in which every adaptive cluster has a token among each segment's
    inputs and among its targets, so that every cluster's embedding and softmax path is exercised."""
    bounds = [0, *cutoffs, n_token]
    tgt = 4
    while True:
        x = rng.integers(0, n_token, size=(SEGMENTS * tgt + 1, B))
        ok = True
        for s in range(SEGMENTS):
            for part in (x[s * tgt:(s + 1) * tgt], x[s * tgt + 1:(s + 1) * tgt + 1]):
                ok &= all(((part >= lo) & (part < hi)).any() for lo, hi in zip(bounds, bounds[1:]))
        if ok:
            return x


def redraw(tf, sess, rng: np.random.Generator) -> None:
    """Every variable re-drawn by its role (module docstring) and loaded into the session."""
    for v in tf.global_variables():
        name, shape = v.op.name, v.shape.as_list()
        leaf = name.rsplit("/", 1)[-1]
        if leaf == "r_w_bias":
            value = 0.5 + 0.5 * rng.standard_normal(shape)
        elif leaf == "r_r_bias":
            value = -0.5 + 0.5 * rng.standard_normal(shape)
        elif leaf == "gamma":
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        elif leaf in ("beta", "bias", "b", "cluster_b"):
            value = 0.5 * rng.standard_normal(shape)
        elif leaf == "kernel":  # [in, out]
            value = 1.5 / np.sqrt(shape[0]) * rng.standard_normal(shape)
        elif leaf in ("proj_W", "proj"):  # [cluster width, d_model], used both ways: scaled by d_model
            value = 1.0 / np.sqrt(shape[1]) * rng.standard_normal(shape)
        elif leaf in ("lookup_table", "cluster_W"):  # [n, cluster width]; the tables are the softmax's weights too
            value = 1.5 / np.sqrt(shape[1]) * rng.standard_normal(shape)
        else:
            raise KeyError(f"no drawing rule for variable {name}")
        v.load(value.astype(np.float32), sess)


def make_case(tensorflow, tf, model, name: str, case: dict, commit: str, seed: int) -> dict:
    m = dict(case["model"])
    tgt, mem = case["tgt"], case["mem"]
    rng = np.random.default_rng(seed)
    stream = draw_tokens(m["n_token"], m["cutoffs"], rng)
    # train_gpu.py get_model_fn: tie_projs from proj_share_all_but_first; initializers from init/init_std/proj_init_std
    tie_projs = [False] + [bool(m["proj_share_all_but_first"])] * len(m["cutoffs"])
    args = dict(n_token=m["n_token"], n_layer=m["n_layer"], d_model=m["d_model"], d_embed=m["d_embed"],
                n_head=m["n_head"], d_head=m["d_head"], d_inner=m["d_inner"], dropout=0.0, dropatt=0.0,
                is_training=False, mem_len=mem, cutoffs=list(m["cutoffs"]), div_val=m["div_val"],
                tie_projs=tie_projs, same_length=m["same_length"], clamp_len=m["clamp_len"], use_tpu=False,
                input_perms=None, target_perms=None, head_target=None, untie_r=m["untie_r"],
                proj_same_dim=m["proj_same_dim"])
    graph = tf.Graph()
    with graph.as_default():
        tf.set_random_seed(seed)
        inp = tf.placeholder(tf.int32, [tgt, B], name="inp")
        target = tf.placeholder(tf.int32, [tgt, B], name="tgt")
        mems = [tf.placeholder(tf.float32, [mem, B, m["d_model"]], name=f"mems_{i}") for i in range(m["n_layer"])]
        initializer = tf.initializers.random_normal(stddev=0.02, seed=None)
        proj_initializer = tf.initializers.random_normal(stddev=0.01, seed=None)
        loss, new_mems = model.transformer(dec_inp=inp, target=target, mems=mems, initializer=initializer,
                                           proj_initializer=proj_initializer, **args)
        assert loss.op.type == "Mean", loss.op.type
        nll = loss.op.inputs[0]  # the per-token NLL [tgt_len, B] that mask_adaptive_logsoftmax averages
        assert nll.shape.as_list() == [tgt, B], nll.shape
        saver = tf.train.Saver()
        config = tf.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        with tf.Session(graph=graph, config=config) as sess:
            sess.run(tf.global_variables_initializer())
            redraw(tf, sess, rng)
            mems_np = [np.zeros([mem, B, m["d_model"]], np.float32) for _ in range(m["n_layer"])]  # train_gpu.py
            inputs, targets, losses, means = [], [], [], []
            for s in range(SEGMENTS):
                x, y = stream[s * tgt:(s + 1) * tgt], stream[s * tgt + 1:(s + 1) * tgt + 1]
                feed = {inp: x, target: y, **dict(zip(mems, mems_np))}
                nll_np, loss_np, mems_np = sess.run([nll, loss, new_mems], feed_dict=feed)
                assert abs(float(nll_np.mean()) - float(loss_np)) < 1e-5
                inputs.append(x.tolist())
                targets.append(y.tolist())
                losses.append([[float(v) for v in row] for row in nll_np])
                means.append(float(loss_np))
            variables = [{"name": v.op.name, "shape": v.shape.as_list(), "dtype": v.dtype.base_dtype.name}
                         for v in tf.global_variables()]
            folder = OUT / name
            folder.mkdir(parents=True, exist_ok=True)
            for stale in folder.iterdir():
                stale.unlink()
            cwd = os.getcwd()
            os.chdir(folder)  # a relative save path: the `checkpoint` file names "model.ckpt-0", not this machine's
            try:
                saver.save(sess, "model.ckpt", global_step=0, write_meta_graph=False)
            finally:
                os.chdir(cwd)
    fixture = {
        "repo": REPO, "commit": commit, "file": "tf/model.py", "case": name,
        "tf_version": tensorflow.__version__,
        "transformer_args": {**args, "scope": "transformer",
                             "initializer": "tf.initializers.random_normal(stddev=0.02) (train_gpu.py init normal), "
                                            "then every variable re-drawn (make_transformer_xl_tf.py redraw)",
                             "proj_initializer": "tf.initializers.random_normal(stddev=0.01)"},
        "train_gpu_flags": {"untie_r": m["untie_r"], "proj_share_all_but_first": m["proj_share_all_but_first"],
                            "proj_same_dim": m["proj_same_dim"], "div_val": m["div_val"], "tie_weight": True,
                            "same_length": m["same_length"], "clamp_len": m["clamp_len"], "tgt_len": tgt,
                            "mem_len": mem, "dropout": 0.0, "dropatt": 0.0},
        "tgt_len": tgt, "mem_len": mem, "clamp_len": m["clamp_len"], "same_length": m["same_length"],
        "batch": B, "segments": SEGMENTS, "layout": "time-major: inputs/targets [segment][tgt_len][batch]",
        "initial_mems": "zeros [mem_len, batch, d_model] per layer (train_gpu.py evaluate); then new_mems fed back",
        "seed": seed,
        "inputs": inputs, "targets": targets,
        "loss": losses,  # [segment][tgt_len][batch]: -log p(target) per token
        "loss_mean": means,
        "variables": variables,
        "checkpoint": "model.ckpt-0",
    }
    (OUT / name / "fixture.json").write_text(json.dumps(fixture, indent=1) + "\n")
    return fixture


# --------------------------------------------------------------------------------- cache.pkl (Python 2 pickle)


class Py2Str(bytes):
    """A Python 2 `str` (bytes); a distinct object per instance, like the str objects the memo tells apart."""


class Global:
    """A class or function, written as GLOBAL 'module\\nname\\n' (one object per name, memoised as Python 2 does)."""

    _made: dict = {}

    def __new__(cls, module: str, name: str):
        key = (module, name)
        if key not in cls._made:
            obj = super().__new__(cls)
            obj.module, obj.name = module, name
            cls._made[key] = obj
        return cls._made[key]


class Reduced:
    """An object written as `func args REDUCE` (then `state BUILD` if state is not None): a __reduce__ result."""

    def __init__(self, func: Global, args: tuple, state=None):
        self.func, self.args, self.state = func, args, state


class NewObj:
    """A new-style instance as copy_reg's reduce_2 gives it: `cls () NEWOBJ`, then its __dict__ and BUILD."""

    def __init__(self, cls: Global, state: dict):
        self.cls, self.state = cls, state


class Py2Pickler:
    """Python 2.7 `pickle.Pickler(file, 2)` for the object kinds above, str as Py2Str, int, bool, None, tuple, list,
    dict (save, memoize, save_reduce, save_global, save_string, save_int, save_tuple, save_list, save_dict and the
    batching of pickle.py 2.7, batches of 1000)."""

    def __init__(self):
        self.out = io.BytesIO()
        self.memo: dict[int, int] = {}
        self.keep = []  # the objects memoised, alive so that their ids stay theirs (pickle.py keeps them too)

    def dumps(self, obj) -> bytes:
        self.out.write(b"\x80\x02")  # PROTO 2
        self.save(obj)
        self.out.write(b".")  # STOP
        return self.out.getvalue()

    def memoize(self, obj) -> None:
        i = len(self.memo)
        self.out.write(b"q" + bytes([i]) if i < 256 else b"r" + struct.pack("<i", i))  # BINPUT / LONG_BINPUT
        self.memo[id(obj)] = i
        self.keep.append(obj)

    def save(self, obj) -> None:
        w = self.out.write
        if id(obj) in self.memo:
            i = self.memo[id(obj)]
            w(b"h" + bytes([i]) if i < 256 else b"j" + struct.pack("<i", i))  # BINGET / LONG_BINGET
            return
        if obj is None:
            w(b"N")
        elif obj is True or obj is False:
            w(b"\x88" if obj else b"\x89")  # NEWTRUE / NEWFALSE
        elif isinstance(obj, int):
            if 0 <= obj <= 0xFF:
                w(b"K" + bytes([obj]))  # BININT1
            elif 0 <= obj <= 0xFFFF:
                w(b"M" + struct.pack("<H", obj))  # BININT2
            elif -(2 ** 31) <= obj < 2 ** 31:
                w(b"J" + struct.pack("<i", obj))  # BININT
            else:
                raise ValueError("a Python 2 long: not used here")
        elif isinstance(obj, Py2Str):
            n = len(obj)
            # SHORT_BINSTRING / BINSTRING
            w((b"U" + bytes([n]) if n < 256 else b"T" + struct.pack("<i", n)) + bytes(obj))
            self.memoize(obj)
        elif isinstance(obj, tuple):
            self.save_tuple(obj)
        elif isinstance(obj, list):
            w(b"]")  # EMPTY_LIST
            self.memoize(obj)
            self.batch(obj, b"a", b"e")  # APPEND / APPENDS
        elif isinstance(obj, dict):
            w(b"}")  # EMPTY_DICT
            self.memoize(obj)
            self.batch(list(obj.items()), b"s", b"u")  # SETITEM / SETITEMS
        elif isinstance(obj, Global):
            w(b"c" + obj.module.encode() + b"\n" + obj.name.encode() + b"\n")  # GLOBAL
            self.memoize(obj)
        elif isinstance(obj, NewObj):
            self.save(obj.cls)
            self.save(())  # args[1:] of (cls,): EMPTY_TUPLE
            w(b"\x81")  # NEWOBJ
            self.memoize(obj)
            self.save(obj.state)
            w(b"b")  # BUILD
        elif isinstance(obj, Reduced):
            self.save(obj.func)
            self.save(obj.args)
            w(b"R")  # REDUCE
            self.memoize(obj)
            if obj.state is not None:
                self.save(obj.state)
                w(b"b")  # BUILD
        else:
            raise TypeError(f"no Python 2 form for {type(obj)}")

    def save_tuple(self, obj: tuple) -> None:
        w = self.out.write
        n = len(obj)
        if n == 0:
            w(b")")  # EMPTY_TUPLE (not memoised)
            return
        if n <= 3:
            for x in obj:
                self.save(x)
            if id(obj) in self.memo:
                raise AssertionError("recursive tuple: not used here")
            w({1: b"\x85", 2: b"\x86", 3: b"\x87"}[n])  # TUPLE1..3
            self.memoize(obj)
            return
        w(b"(")  # MARK
        for x in obj:
            self.save(x)
        w(b"t")  # TUPLE
        self.memoize(obj)

    def batch(self, items: list, one: bytes, many: bytes) -> None:
        """pickle.py 2.7 _batch_appends / _batch_setitems (bin): batches of 1000; a batch of one item without MARK."""
        for start in range(0, len(items), 1000):
            chunk = items[start:start + 1000]
            if len(chunk) > 1:
                self.out.write(b"(")  # MARK
            for x in chunk:
                if one == b"s":
                    self.save(x[0])
                    self.save(x[1])
                else:
                    self.save(x)
            self.out.write(many if len(chunk) > 1 else one)


CACHE_OPCODES = ["PROTO", "GLOBAL", "BINPUT", "BINGET", "EMPTY_TUPLE", "NEWOBJ", "EMPTY_DICT", "EMPTY_LIST", "MARK",
                 "SETITEMS", "APPENDS", "APPEND", "SHORT_BINSTRING", "BINSTRING", "BININT1", "BININT2", "BININT",
                 "NONE", "NEWFALSE", "TUPLE1", "TUPLE3", "TUPLE", "REDUCE", "BUILD", "STOP"]

# the wt103-style corpus: "<unk>" is an ordinary word there (special is ["<eos>"] only), non-ASCII words as UTF-8
WORDS = ["the", ",", ".", "of", "and", "in", "to", "a", "=", "<unk>", "was", "@-@", "'s", "The", "on", "as", "for",
         "with", "by", "that", "café", "is", "from", "his", "at", "Zürich", "he", "it", "(", ")", "naïve", "were",
         "an", "–", "had", "which", "Ελλάδα", "東京", "éclair"]


def ndarray_py2(values: np.ndarray, dtype_obj: Reduced) -> Reduced:
    """numpy 1.x `ndarray.__reduce__` under Python 2: _reconstruct(ndarray, (0,), 'b') + BUILD (1, shape, dtype,
    is_fortran, bytes)."""
    data = np.asarray(values, dtype="<i8")
    return Reduced(Global("numpy.core.multiarray", "_reconstruct"), (Global("numpy", "ndarray"), (0,), ONE_CHAR[b"b"]),
                   (1, (int(data.shape[0]),), dtype_obj, False, Py2Str(data.tobytes())))


ONE_CHAR = {c: Py2Str(c) for c in (b"b", b"<")}  # CPython 2 caches its one-character strings: one object each


def write_cache_pkl() -> None:
    rnd = random.Random(0)
    # counts 39, 38, ..., 1: distinct, so that Counter.most_common (and so idx2sym) has one order whatever Python 2's
    # dict order was
    tokens = [w for k, w in enumerate(WORDS) for _ in range(len(WORDS) - k)]
    rnd.shuffle(tokens)
    train_lines = [tokens[i:i + 10] for i in range(0, len(tokens), 10)]
    valid_lines = [rnd.sample(WORDS, 6) for _ in range(3)]
    test_lines = [rnd.sample(WORDS, 5) for _ in range(3)]

    # Vocab(special=["<eos>"], lower_case=False); count_file(train.txt) (add_eos False); build_vocab()
    sym = {w: Py2Str(w.encode("utf-8")) for w in WORDS}  # one str object per word, as the counter holds them
    eos = Py2Str(b"<eos>")
    counter = Counter()
    for line in train_lines:
        counter.update(sym[w] for w in line)
    idx2sym, sym2idx = [eos], OrderedDict([(eos, 0)])
    for s, _ in counter.most_common():
        idx2sym.append(s)
        sym2idx[s] = len(idx2sym) - 1
    assert [bytes(s).decode() for s in idx2sym[1:]] == WORDS

    def encode(lines):  # encode_file(ordered=True, add_eos=True)
        return np.array([i for line in lines for i in [sym2idx[sym[w]] for w in line] + [sym2idx[eos]]],
                        dtype=np.int64)

    train, valid, test = encode(train_lines), encode(valid_lines), encode(test_lines)
    cutoffs = [0, 20000, 40000, 200000] + [len(idx2sym)]  # data_utils.Corpus for wt103, whatever the vocabulary size

    def s(text):  # an attribute name or literal: a Python 2 str
        return Py2Str(text.encode())

    dtype_i8 = Reduced(Global("numpy", "dtype"), (s("i8"), 0, 1), (3, ONE_CHAR[b"<"], None, None, None, -1, -1, 0))
    vocab_state = {
        s("counter"): Reduced(Global("collections", "Counter"), (dict(counter),)),
        s("special"): [eos],
        s("min_freq"): 0,
        s("max_size"): None,
        s("lower_case"): False,
        s("delimiter"): None,
        s("vocab_file"): None,
        s("idx2sym"): idx2sym,
        s("sym2idx"): Reduced(Global("collections", "OrderedDict"), ([[k, v] for k, v in sym2idx.items()],)),
        s("eos_idx"): 0,
    }
    corpus_state = {
        s("dataset"): s("wt103"),
        s("vocab"): NewObj(Global("vocabulary", "Vocab"), vocab_state),
        s("train"): ndarray_py2(train, dtype_i8),
        s("valid"): ndarray_py2(valid, dtype_i8),
        s("test"): ndarray_py2(test, dtype_i8),
        s("cutoffs"): cutoffs,
    }
    data = Py2Pickler().dumps(NewObj(Global("data_utils", "Corpus"), corpus_state))
    (OUT / "cache.pkl").write_bytes(data)

    opcodes = sorted({op.name for op, _, _ in pickletools.genops(data)})
    assert opcodes == sorted(CACHE_OPCODES), opcodes  # the list the module docstring gives
    expected = {
        "dataset": "wt103",
        "idx2sym": [bytes(x).decode("utf-8") for x in idx2sym],
        "idx2sym_bytes_hex": [bytes(x).hex() for x in idx2sym],
        "eos_idx": 0,
        "special": ["<eos>"],
        "lower_case": False,
        "counter": {bytes(k).decode("utf-8"): v for k, v in counter.items()},
        "train": train.tolist(), "valid": valid.tolist(), "test": test.tolist(),
        "cutoffs": cutoffs,
        "corpus_info": {"vocab_size": len(idx2sym), "cutoffs": cutoffs, "dataset": "wt103"},
        "classes": ["data_utils.Corpus", "vocabulary.Vocab", "collections.Counter", "collections.OrderedDict",
                    "numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype"],
        "opcodes": opcodes,
        "load": "pickle.load(f, encoding='latin1') with data_utils / vocabulary classes registered; symbols come "
                "back latin-1 decoded: s.encode('latin1').decode('utf-8') gives idx2sym",
    }
    (OUT / "cache.json").write_text(json.dumps(expected, indent=1, ensure_ascii=False) + "\n")
    check_cache(data, expected)


def check_cache(data: bytes, expected: dict) -> None:
    """Load the file as Python 3 loads a Python 2 pickle (encoding='latin1') and compare with cache.json."""
    forbidden = {"FRAME", "SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "BINBYTES", "SHORT_BINBYTES", "BINBYTES8",
                 "STACK_GLOBAL", "MEMOIZE", "NEWOBJ_EX", "EMPTY_SET", "ADDITEMS", "FROZENSET", "BYTEARRAY8"}
    assert not forbidden & set(expected["opcodes"]), forbidden & set(expected["opcodes"])
    pickletools.dis(data, out=io.StringIO())  # well formed, memo consistent

    class Corpus:
        pass

    class Vocab:
        pass

    class Loader(pickle.Unpickler):
        def find_class(self, module, name):
            return {("data_utils", "Corpus"): Corpus, ("vocabulary", "Vocab"): Vocab}.get(
                (module, name)) or super().find_class(module, name)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # numpy 2 warns on numpy.core
        corpus = Loader(io.BytesIO(data), encoding="latin1").load()
    v = corpus.vocab
    idx2sym = [x.encode("latin1").decode("utf-8") for x in v.idx2sym]
    assert idx2sym == expected["idx2sym"]
    assert [k.encode("latin1").decode("utf-8") for k in v.sym2idx] == expected["idx2sym"]
    assert list(v.sym2idx.values()) == list(range(len(idx2sym)))
    assert any(x != y for x, y in zip(v.idx2sym, idx2sym))  # the latin-1 trap is there
    assert v.eos_idx == 0 and v.special == ["<eos>"] and isinstance(v.counter, Counter)
    for split in ("train", "valid", "test"):
        arr = getattr(corpus, split)
        assert arr.dtype == np.int64 and arr.tolist() == expected[split], split
    assert corpus.cutoffs == expected["cutoffs"] and corpus.dataset == "wt103"


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: /work/tfenv/bin/python tests/parity/make_transformer_xl_tf.py PATH/TO/transformer-xl")
    checkout = Path(sys.argv[1])
    if not (checkout / "tf" / "model.py").is_file():
        raise SystemExit(f"{checkout}: no tf/model.py; pass a checkout of {REPO}")
    commit = checkout_commit(checkout)
    tensorflow, tf, model = import_authors(checkout)
    OUT.mkdir(parents=True, exist_ok=True)
    for seed, (name, case) in enumerate(CASES.items()):
        fx = make_case(tensorflow, tf, model, name, case, commit, seed)
        size = sum(p.stat().st_size for p in (OUT / name).iterdir())
        print(f"{name}: {len(fx['variables'])} variables, {size / 1024:.1f} KB, loss/segment "
              + " ".join(f"{x:.4f}" for x in fx["loss_mean"]))
    write_cache_pkl()
    print(f"cache.pkl: {(OUT / 'cache.pkl').stat().st_size} bytes, opcodes "
          + " ".join(json.loads((OUT / 'cache.json').read_text())["opcodes"]))


if __name__ == "__main__":
    main()
