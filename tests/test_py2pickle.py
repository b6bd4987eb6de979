"""Reading the released Python-2 `cache.pkl` (`repro.weights.py2pickle`): the vocabulary in the authors' id order,
non-ASCII symbols decoded; a pickle that names any other global is refused in one line and runs nothing."""

import json
import pickle
from pathlib import Path

import pytest

from repro.weights.py2pickle import PickleRefused, load, released_vocabulary

HERE = Path(__file__).resolve().parent / "parity" / "transformer_xl_tf"


def test_the_released_vocabulary_is_read_in_the_authors_order():
    expected = json.loads((HERE / "cache.json").read_text())["idx2sym"]
    symbols = released_vocabulary(HERE / "cache.pkl")
    assert symbols == expected and "Zürich" in symbols and "東京" in symbols


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch should-not-exist",))


def test_a_pickle_naming_another_global_is_refused_unrun(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = tmp_path / "cache.pkl"
    bad.write_bytes(pickle.dumps(_Boom(), protocol=2))
    with pytest.raises(PickleRefused) as err:
        load(bad)
    assert "system" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "should-not-exist").exists()


def test_a_truncated_or_foreign_file_is_one_line(tmp_path):
    cut = tmp_path / "cut.pkl"
    cut.write_bytes((HERE / "cache.pkl").read_bytes()[:200])
    with pytest.raises(PickleRefused) as err:
        load(cut)
    assert str(cut) in str(err.value) and "\n" not in str(err.value)
    other = tmp_path / "other.pkl"
    other.write_bytes(pickle.dumps({"a": 1}, protocol=2))
    with pytest.raises(PickleRefused) as err:
        released_vocabulary(other)
    assert "idx2sym" in str(err.value)
