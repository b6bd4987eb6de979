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


def _git(root, *args):
    import subprocess

    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout


def test_the_index_entries_dvc_autostages_during_the_swap_are_put_back(tmp_path):
    """DVC's autostage stages the lock it writes (the profile's, under `dvc.lock`) and may stage params.yaml: after
    the swap the index holds the default's entries again, so a `git commit` cannot record the profile's files
    under the default's names."""
    root = tree(tmp_path)
    _git(root, "init", "-q")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "add", ".")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny")
    before = _git(root, "ls-files", "-s", "--", "params.yaml", "dvc.lock")
    with swapped(root, "small"):
        (root / "dvc.lock").write_text("small lock\n")
        _git(root, "add", "params.yaml", "dvc.lock")  # what autostage does
    assert _git(root, "ls-files", "-s", "--", "params.yaml", "dvc.lock") == before
    assert _git(root, "status", "--porcelain", "--", "params.yaml", "dvc.lock") == ""


def test_commit_names_its_stages_and_reruns_nothing(tmp_path, monkeypatch):
    from repro.cli.profile import main

    monkeypatch.chdir(tree(tmp_path))
    for argv in (["small", "--commit"], ["small", "--commit", "--force", "lamemo_run@*"]):
        with pytest.raises(ValueError, match="records the stages it is given"):
            main(argv)
