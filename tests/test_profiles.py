"""repro.cli.profile: a non-default profile's params and lock are swapped in and the default's are always put back."""

import pytest

from repro.cli.profile import restore, swapped


def tree(tmp_path):
    (tmp_path / "dvc.yaml").write_text("stages: {}\n")
    (tmp_path / "params.yaml").write_text("profile: tiny\n")
    (tmp_path / "dvc.lock").write_text("tiny lock\n")
    (tmp_path / "params.small.yaml").write_text("profile: small\n")
    return tmp_path


def test_swap_keeps_the_profile_lock_and_restores_the_default(tmp_path):
    root = tree(tmp_path)
    with swapped(root, "small"):
        assert (root / "params.yaml").read_text() == "profile: small\n"
        assert not (root / "dvc.lock").exists()  # the small profile has no lock yet
        (root / "dvc.lock").write_text("small lock\n")  # what `dvc repro` writes
    assert (root / "params.yaml").read_text() == "profile: tiny\n"
    assert (root / "dvc.lock").read_text() == "tiny lock\n"
    assert (root / "dvc.small.lock").read_text() == "small lock\n"
    with swapped(root, "small"):  # the second run starts from its own lock
        assert (root / "dvc.lock").read_text() == "small lock\n"


def test_error_inside_restores(tmp_path):
    root = tree(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        with swapped(root, "small"):
            raise KeyboardInterrupt
    assert (root / "params.yaml").read_text() == "profile: tiny\n" and (root / "dvc.lock").read_text() == "tiny lock\n"


def test_killed_run_is_restored_by_the_next(tmp_path):
    root = tree(tmp_path)
    ctx = swapped(root, "small")
    ctx.__enter__()  # a run killed outright: no exit, the backup stays
    assert (root / "params.yaml").read_text() == "profile: small\n"
    assert restore(root)
    assert (root / "params.yaml").read_text() == "profile: tiny\n" and (root / "dvc.lock").read_text() == "tiny lock\n"
    assert not restore(root)


def test_unknown_profile_one_line(tmp_path):
    root = tree(tmp_path)
    with pytest.raises(ValueError, match="no params.huge.yaml .* profiles with a parameter file: small"):
        with swapped(root, "huge"):
            pass
    assert (root / "params.yaml").read_text() == "profile: tiny\n"
