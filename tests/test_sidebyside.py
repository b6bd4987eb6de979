"""`repro.ops.sidebyside`, the machinery of the side-by-side commands, on toy codes that need no paper and no
checkout: the order of the turns, the memory carried and reset, the FLOPs of a step at full memory against a count
by hand, the token stream, a checkout's modules imported and forgotten, and the command's shared options and
refusals. The papers' parts are tested in tests/test_bench_authors.py."""

import argparse
import importlib
import json
import sys

import pytest
import torch
import torch.nn.functional as F

from repro.ops import sidebyside
from repro.ops.sidebyside import SegmentCode, TimeMajorCode


def test_codes_take_turns_within_every_round():
    calls = []
    results = sidebyside.take_turns({"theirs": lambda: calls.append("theirs") or 1.0,
                                     "ours": lambda: calls.append("ours") or 2.0}, rounds=3)
    assert calls == ["theirs", "ours"] * 3
    assert results == {"theirs": [1.0] * 3, "ours": [2.0] * 3}


def test_interleaved_steps_warm_every_code_up_once_then_time_them_in_turns():
    calls = []
    speeds, peak = sidebyside.interleaved_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                                torch.device("cpu"), rounds=2, steps=3, warmup=2,
                                                tokens_per_step=10)
    assert calls == ["a"] * 2 + ["b"] * 2 + (["a"] * 3 + ["b"] * 3) * 2
    assert {k: len(v) for k, v in speeds.items()} == {"a": 2, "b": 2} and all(v > 0 for v in speeds["a"])
    assert peak == {}  # measured on a GPU only
    assert sidebyside.per_round([3.0, 1.0], [2.0, 3.0]) == [1.5, 0.333]


class Toy(torch.nn.Module):
    """A segment model of one product: logits = embeddings · Eᵀ; its memory, the last `mem_len` embeddings."""

    def __init__(self, n_token: int = 7, d: int = 4):
        super().__init__()
        self.emb = torch.nn.Embedding(n_token, d)
        self.calls: list[int] = []  # the memory length each forward pass found

    def forward(self, x_BT, mems, *, mem_len: int, kv_memory: bool = False):
        h = self.emb(x_BT)
        self.calls.append(0 if mems is None else mems[0].shape[1])
        cat = h if mems is None else torch.cat([mems[0], h], 1)
        return h, [cat[:, -mem_len:]]

    def nll(self, h, y):
        return F.cross_entropy((h @ self.emb.weight.T).flatten(0, 1), y.flatten(), reduction="none")


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_each_turn_starts_from_an_empty_memory_and_carries_it(mode):
    code = SegmentCode(Toy(), mem_len=6)
    stream = sidebyside.token_stream(n_token=7, batch=2, segment=3, segments=4)
    speeds = sidebyside.interleaved({"toy": code}, stream, mode=mode, precision="32", rounds=2, steps=2, warmup=2)
    assert len(speeds["toy"]) == 2 and all(v > 0 for v in speeds["toy"])
    assert code.model.calls == [0, 3, 6, 6] * 2  # the memory grows to mem_len, and every turn starts empty
    assert code.model.training == (mode == "train")


def test_product_flops_count_the_step_at_full_memory():
    """Toy's one product per step, (B·T, d) × (d, n): 2·B·T·d·n forward; training adds both gradients (the
    embedding lookup has none). The step counted is the one after ceil(memory / segment) others."""
    b, t, d, n = 2, 3, 4, 7
    stream = sidebyside.token_stream(n_token=n, batch=b, segment=t, segments=3)
    forward = 2 * b * t * d * n
    code = SegmentCode(Toy(n, d), mem_len=4)
    assert sidebyside.product_flops(code, stream, mode="eval") == forward
    assert code.model.calls == [0, 3, 4]  # ceil(4 / 3) = 2 segments before the counted one, whose memory is full
    assert sidebyside.product_flops(code, stream, mode="train") == 3 * forward
    assert code.mems is None and all(p.grad is None for p in code.model.parameters())  # left as found
    with pytest.raises(ValueError, match="needs 3 segments, got 2"):
        sidebyside.product_flops(code, stream[:2], mode="eval")


def test_the_token_stream_is_one_sequence_cut_into_segments_with_targets_one_ahead():
    stream = sidebyside.token_stream(n_token=50, batch=2, segment=4, segments=3)
    x = torch.cat([x for x, _ in stream], 1)
    y = torch.cat([y for _, y in stream], 1)
    assert [s[0].shape for s in stream] == [(2, 4)] * 3 and torch.equal(x[:, 1:], y[:, :-1])
    again = sidebyside.token_stream(n_token=50, batch=2, segment=4, segments=3)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(stream, again))  # a fixed seed


class TimeMajor(torch.nn.Module):
    """kimiyoung/transformer-xl's calling convention: (T, B) tokens, memories after the target, `[loss] + mems`;
    a `.byte()` mask, as their attention builds it."""

    mem_len = 2

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.seen: list[tuple] = []

    def forward(self, x_TB, y_TB, *mems):
        self.seen.append((tuple(x_TB.shape), len(mems)))
        mask = torch.ones(2).byte()
        assert mask.dtype == torch.bool  # the shim is in force during their forward pass
        return [self.w * x_TB.float(), x_TB[-self.mem_len:].float()]


def test_their_code_is_called_time_major_with_its_memories():
    code = TimeMajorCode(TimeMajor())
    x = torch.arange(6).view(2, 3)
    assert float(code.forward(x, x).detach()) == pytest.approx(2.5)
    code.forward(x, x)
    assert code.model.seen == [((3, 2), 0), ((3, 2), 1)] and code.mem_len == 2
    code.reset()
    assert code.mems == ()
    assert torch.ones(2).byte().dtype == torch.uint8  # restored after the forward pass


def test_a_checkouts_modules_import_inside_the_block_and_are_forgotten_after(tmp_path):
    src = tmp_path / "src"
    (src / "utils").mkdir(parents=True)
    (src / "utils" / "toy_helper.py").write_text("import torch\nCUDA = torch.version.cuda\n")
    (src / "toy_model.py").write_text("from toy_helper import CUDA\n")
    sys.modules["toy_model"] = object()  # another checkout's module of the same name
    path, cuda = list(sys.path), torch.version.cuda
    with sidebyside.checkout_on_path("repro bench-x", tmp_path, repository="someone/toy", folders=("src", "src/utils"),
                                     module="toy_model"):
        assert importlib.import_module("toy_model").CUDA  # a version string, even on a CPU build
    assert sys.path == path and torch.version.cuda == cuda
    assert "toy_model" not in sys.modules and "toy_helper" not in sys.modules
    with pytest.raises(SystemExit, match=r"^repro bench-x: .* has no src/toy_model.py; pass a checkout of someone/toy "
                                         "with --checkout$"):
        with sidebyside.checkout_on_path("repro bench-x", tmp_path / "empty", repository="someone/toy",
                                         folders=("src",), module="toy_model"):
            pass


def command(**defaults) -> argparse.ArgumentParser:
    p = sidebyside.parser("repro bench-x", "The toy command.\n\nMore.", repository="someone/toy", codes="both",
                          rounds=2, steps=8, warmup=3, **defaults)
    p.add_argument("--batch", type=int)
    return p


def test_the_shared_options_and_their_defaults():
    p = command()
    a = p.parse_args(["--checkout", "co"])
    assert (a.precision, a.rounds, a.steps, a.warmup, a.threads, a.device, a.output) == ("32", 2, 8, 3, 2, "cpu", None)
    assert p.description == "The toy command."
    with pytest.raises(SystemExit):
        p.parse_args(["--checkout", "co", "--precision", "16"])
    with pytest.raises(SystemExit):
        p.parse_args([])  # --checkout is required


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"), (["--steps", "0"], "--steps must be at least 1"),
    (["--threads", "0"], "--threads must be at least 1"), (["--batch", "0"], "--batch must be at least 1"),
    (["--warmup", "-1"], "--warmup must be at least 0"), (["--device", "tpu:0"], "is not a device"),
    (["--device", "meta"], "only cpu and cuda are timed"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda"], "sees no GPU; use --device cpu")]))
def test_the_command_refuses_in_one_line_before_it_runs(argv, message):
    ran = []
    with pytest.raises(SystemExit, match=f"^repro bench-x: .*{message}"):
        sidebyside.main(command(), ["--checkout", "co", *argv], ran.append, str)
    assert not ran


def test_the_command_prepares_runs_appends_every_row_and_prints_a_line_each(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    out.write_text(json.dumps({"before": 1}) + "\n")

    def prepare(a):
        a.steps = 5  # a default that depends on another option

    rows = sidebyside.main(command(), ["--checkout", "co", "--output", str(out)],
                           lambda a: [{"steps": a.steps, "i": 0}, {"steps": a.steps, "i": 1}],
                           lambda row: f"row {row['i']}", prepare=prepare)
    assert rows is None
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"before": 1}, {"steps": 5, "i": 0},
                                                                           {"steps": 5, "i": 1}]
    assert capsys.readouterr().out == "row 0\nrow 1\n"
