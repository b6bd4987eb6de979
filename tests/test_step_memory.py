"""The step-memory benchmark (`repro step-memory`): the profiler's running total against tensors whose
bytes are known; a chunk's measured allocations grow with its streams and shrink with layer checkpointing; the
estimate of a whole chunked step (state + one chunk) against that step measured whole; the settings table against
a hand computation; a bad argument refused in one line before anything is written."""

import json
from pathlib import Path

import pytest
import torch

from repro.cli import stepmemory
from repro.cli.cli import build

ROOT = Path(__file__).resolve().parent.parent
TINY = str(ROOT / "configs/transformer_xl/tiny/wt103_base.yaml")


def test_the_running_total_counts_what_the_step_allocates_at_its_fullest():
    before = torch.ones(1_000_000)  # alive before the step: not counted

    def step():
        a = torch.empty(1_000_000)  # 4 MB, freed before the next two
        del a
        b, c = torch.empty(250_000), torch.empty(500_000)  # 1 MB + 2 MB together
        return b.sum() + c.sum() + before.sum()

    kept = []
    assert 4_000_000 <= stepmemory.peak_allocated(step) < 4_000_000 + 4096  # the 4 MB tensor, not 7 MB
    assert stepmemory.peak_allocated(lambda: kept.append(torch.empty(500_000))) == 2_000_000
    # what an earlier measurement left alive is not this one's
    assert 4_000_000 <= stepmemory.peak_allocated(step) < 4_000_000 + 4096


def test_zipf_tokens_put_most_mass_on_the_frequent_ranks():
    tokens = stepmemory.zipf_tokens(100_000, (50, 200), torch.Generator().manual_seed(0))
    assert tokens.shape == (50, 200) and 0 <= int(tokens.min()) and int(tokens.max()) < 100_000
    share = (tokens < 10_000).float().mean().item()  # H(10^4)/H(10^5) = 0.80
    assert 0.77 < share < 0.83


def test_a_chunk_grows_with_its_streams_and_checkpointing_shrinks_it():
    module = build([TINY]).model.float()
    plain = [stepmemory.chunk_peak(module, s, 64, checkpoint_layers=False) for s in (1, 2, 4)]
    ckpt = [stepmemory.chunk_peak(module, s, 64, checkpoint_layers=True) for s in (1, 2, 4)]
    assert plain[0] < plain[1] < plain[2] and ckpt[2] < plain[2]
    # activations are linear in the streams: the third point on the line through the first two, within 10%
    a0, a1 = stepmemory.line([(1, plain[0]), (2, plain[1])])
    assert abs(a0 + 4 * a1 - plain[2]) < 0.1 * plain[2]
    assert not module.model.checkpoint_layers and all(p.grad is None for p in module.parameters())


def test_the_estimate_of_a_chunked_step_bounds_that_step_measured_whole():
    """A step of 8 streams in 4 chunks, from no gradients (as `on_train_batch_start` leaves them), measured whole:
    the estimate (the first two chunks of 2 streams) within 5% of it, and not below it."""
    module = build([TINY]).model.float().train()
    g = torch.Generator().manual_seed(1)
    tokens = stepmemory.zipf_tokens(module.n_token, (8, 65), g)
    x, y = tokens[:, :-1], tokens[:, 1:]
    with torch.no_grad():
        _, mems = module(x, None, module.memory)

    def whole_step():
        for c in range(4):
            rows = slice(2 * c, 2 * c + 2)
            hidden, _ = module(x[rows], [m[rows] for m in mems], module.memory)
            (module.model.nll(hidden, y[rows]).mean() / 4).backward()

    measured = stepmemory.peak_allocated(whole_step)
    module.zero_grad(set_to_none=True)
    estimate = stepmemory.chunk_peak(module, 2, 64, checkpoint_layers=False)
    assert measured <= estimate <= measured * 1.05, (estimate, measured)


def test_settings_take_the_fewest_chunks_that_fit():
    gib = 2**30
    # 10 GiB of state for any share of the batch, 1 GiB a stream (a line with no intercept); 8 streams on one device
    rows = stepmemory.settings(8, lambda streams: 10 * gib, {False: (0.0, 1.0 * gib)}, devices=(1, 2))
    one = {r["card_gb"]: r["fits"] for r in rows if r["devices"] == 1}
    assert one[40]["batch_chunk"] == 1 and one[40]["peak_bytes"] == 18 * gib  # 18 GiB ≤ 36 GiB
    rows = stepmemory.settings(64, lambda streams: 30 * gib, {False: (0.0, 1.0 * gib)}, devices=(1,))
    fits = {r["card_gb"]: r["fits"] for r in rows}
    # 40 GB: 36 GiB usable, 6 GiB for the chunk: 64 streams in 16 chunks of 4; 80 GB: 42 GiB, 32 streams: 2 chunks
    assert fits[40]["batch_chunk"] == 16 and fits[80]["batch_chunk"] == 2
    rows = stepmemory.settings(4, lambda streams: 50 * gib, {False: (0.0, 1.0 * gib)}, devices=(1,))
    assert {r["card_gb"]: r["fits"] for r in rows}[40] is None  # the state alone is past 36 GiB


def test_the_command_writes_a_record(tmp_path):
    out = tmp_path / "m.json"
    record = stepmemory.main(["-c", TINY, "--streams", "1,2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(record))
    table = (tmp_path / "m.md").read_text()
    assert table == stepmemory.render(record) and "| 1 | 16 | `--run.batch_chunk 1`" in table
    assert {m["streams"] for m in record["measured"]} == {1, 2} and record["batch_size"] == 16
    assert record["provenance"]["command"].startswith("repro step-memory") \
        and record["provenance"]["torch"]


@pytest.mark.parametrize("argv,said", [
    (["-c", TINY, "--streams", "1"], "error: --streams needs two or more different positive chunk sizes"),
    (["-c", "configs/transformer_xl/tiny/nope.yaml"], "error: config configs/transformer_xl/tiny/nope.yaml does not "
                                                       "exist"),
])
def test_a_bad_argument_is_refused_in_one_line_before_anything_is_written(tmp_path, argv, said):
    out = tmp_path / "m.json"
    with pytest.raises(SystemExit) as err:
        stepmemory.main([*argv, "--out", str(out)])
    assert str(err.value.code).startswith(said) and "\n" not in str(err.value.code) and not out.exists()


RECORDS = sorted((ROOT / "results").glob("*/step_memory/*.json"))


def test_the_paper_configs_that_need_chunks_have_a_measured_record():
    assert {p.stem for p in RECORDS} >= {"wt103_large", "lm1b_large"}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_each_record_s_table_and_its_config_s_comment_say_what_it_holds(path):
    record = json.loads(path.read_text())
    assert (path.with_suffix(".md")).read_text() == stepmemory.render(record)
    config = ROOT / record["config"][0]
    lines = config.read_text().splitlines()
    expected = stepmemory.config_comment(record, str(path.relative_to(ROOT)))
    at = lines.index(expected[0]) if expected[0] in lines else -1
    assert at >= 0 and lines[at:at + len(expected)] == expected, f"{config} should carry:\n" + "\n".join(expected)
    # the estimate rests on two or more measured chunk sizes, with and without layer checkpointing
    for ckpt in (False, True):
        assert len({m["streams"] for m in record["measured"] if m["checkpoint_layers"] == ckpt}) >= 2
