"""repro.callbacks.MmapCheckpointIO: checkpoints load mapped (pages read on use), with the same content as
Lightning's own loader; legacy files still load."""

import torch

from repro.callbacks import MmapCheckpointIO


def test_loads_mapped_with_the_same_content(tmp_path):
    path = tmp_path / "a.ckpt"
    state = {"state_dict": {"w": torch.randn(64, 64)}, "optimizer_states": [{"state": {0: {"exp_avg": torch.ones(3)}}}],
             "global_step": 7}
    torch.save(state, path)
    loaded = MmapCheckpointIO().load_checkpoint(path, weights_only=True)
    assert torch.equal(loaded["state_dict"]["w"], state["state_dict"]["w"]) and loaded["global_step"] == 7
    # the file is mapped into this process (it appears in /proc/self/maps) for as long as the tensors live
    assert str(path) in open("/proc/self/maps").read()


def test_legacy_file_falls_back_to_reading(tmp_path):
    path = tmp_path / "legacy.ckpt"
    torch.save({"w": torch.arange(5.0)}, path, _use_new_zipfile_serialization=False)
    assert torch.equal(MmapCheckpointIO().load_checkpoint(path, weights_only=True)["w"], torch.arange(5.0))


def test_saves_straight_to_the_file_with_lightnings_content(tmp_path, monkeypatch):
    """The checkpoint is serialised into its (temporary) file, never into a buffer in memory (Lightning's
    `_atomic_save` holds two copies of it there); it loads as Lightning's saver writes it, and replaces a file
    already at the path only when complete."""
    import io

    from lightning.pytorch.plugins.io import TorchCheckpointIO

    state = {"state_dict": {"w": torch.randn(256, 256)}, "global_step": 3, "epoch": 0}
    theirs = tmp_path / "theirs.ckpt"
    TorchCheckpointIO().save_checkpoint(state, theirs)
    ours = tmp_path / "sub" / "ours.ckpt"
    ours.parent.mkdir()
    ours.write_bytes(b"old")
    buffers = []
    real = io.BytesIO

    class Watched(real):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            buffers.append(self)

    monkeypatch.setattr(io, "BytesIO", Watched)
    MmapCheckpointIO().save_checkpoint(state, ours)
    monkeypatch.undo()
    assert max((len(b.getbuffer()) for b in buffers if not b.closed), default=0) < 256 * 256 * 4
    a, b = (torch.load(p, weights_only=True) for p in (theirs, ours))
    assert torch.equal(a["state_dict"]["w"], b["state_dict"]["w"]) and a["global_step"] == b["global_step"] == 3
    assert sorted(p.name for p in ours.parent.iterdir()) == ["ours.ckpt"]  # no temporary left
