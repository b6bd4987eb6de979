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
