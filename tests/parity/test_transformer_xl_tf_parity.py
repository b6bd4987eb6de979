"""The authors' TF Transformer-XL (`tf/model.py`, run by tests/parity/make_transformer_xl_tf.py under TensorFlow)
against our `TransformerXL` with its weights read by `repro.weights.tf_bundle` and converted by
`papers.transformer_xl.released`: per-token losses of 4 segments carrying the memory, from the checkpoint files
TensorFlow wrote, in the TF evaluation protocol (a first memory of zeros, TF's `same_length` window, clamp_len).
The weights are large enough that swapping the two attention biases or dropping same_length or clamp_len moves a
loss by 0.3-4 nats (the fixture script's docstring). The layouts with per-layer biases are refused in one line
until the backbone holds them."""

import json
from pathlib import Path

import pytest
import torch

from papers.transformer_xl.released import Layout, TFProtocol, load_tf, tf_protocol_nll
from repro.weights.tf_bundle import CheckpointError
from tests.parity.common import TOLERANCE

HERE = Path(__file__).resolve().parent / "transformer_xl_tf"


def _case(name: str):
    meta = json.loads((HERE / name / "fixture.json").read_text())
    args = meta["transformer_args"]
    layout = Layout(n_head=args["n_head"], d_head=args["d_head"], cutoffs=tuple(args["cutoffs"]),
                    div_val=args["div_val"], untie_r=args["untie_r"], proj_same_dim=args["proj_same_dim"],
                    proj_share_all_but_first=meta["train_gpu_flags"]["proj_share_all_but_first"])
    # time-major [segment][T][B] in the fixture; batch-first here
    segments = [(torch.tensor(x).T.contiguous(), torch.tensor(y).T.contiguous())
                for x, y in zip(meta["inputs"], meta["targets"])]
    losses = [torch.tensor(loss).T for loss in meta["loss"]]
    protocol = TFProtocol(mem_len=meta["mem_len"], clamp_len=meta["clamp_len"], same_length=meta["same_length"])
    return meta, layout, segments, losses, protocol


@pytest.mark.parametrize("case", ["enwik8", "wt103_shared_r", "lm1b_shared_r"])
def test_the_released_layouts_give_the_authors_tf_losses(case):
    """enwik8/text8 as released; the WikiText-103 and One Billion Word layouts' adaptive input and softmax (div_val
    4, tied or own projections, the identity where TF has none, TF's cluster order) with one pair of biases."""
    meta, layout, segments, losses, protocol = _case(case)
    assert len(segments) >= 3 and protocol.same_length
    model = load_tf(HERE / case / meta["checkpoint"], layout)
    ours = tf_protocol_nll(model, segments, protocol)
    for k, (a, b) in enumerate(zip(ours, losses)):
        torch.testing.assert_close(a, b, rtol=0, atol=TOLERANCE, msg=f"{case} segment {k}")


def test_the_pytorch_same_length_window_is_not_tfs():
    """The bridge is needed: with the PyTorch mask's own mem_len the losses move far beyond the tolerance."""
    meta, layout, segments, losses, protocol = _case("enwik8")
    model = load_tf(HERE / "enwik8" / meta["checkpoint"], layout)
    mems = protocol.first_memory(model, segments[0][0].shape[0])
    worst = 0.0
    with torch.no_grad():
        for (x, y), ref in zip(segments, losses):
            h, mems = model(x, mems, mem_len=protocol.mem_len, clamp_len=protocol.clamp_len, same_length=True)
            worst = max(worst, (model.nll(h, y) - ref).abs().max().item())
    assert worst > 100 * TOLERANCE


@pytest.mark.parametrize("case", ["wt103", "lm1b"])
def test_per_layer_biases_are_refused_in_one_line(case):
    meta, layout, *_ = _case(case)
    with pytest.raises(CheckpointError) as err:
        load_tf(HERE / case / meta["checkpoint"], layout)
    assert "per-layer attention biases" in str(err.value) and "\n" not in str(err.value)
