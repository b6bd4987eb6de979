"""The TF checkpoint reader (`repro.weights.tf_bundle`) against checkpoints TensorFlow itself wrote
(tests/parity/transformer_xl_tf/, made by tests/parity/make_transformer_xl_tf.py with the authors' TF code): every
variable's name, shape and bytes; CRC-32C against its published check value; a corrupt, truncated or missing file
refused in one line naming it."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from repro.weights import tf_bundle
from repro.weights.tf_bundle import CheckpointError, TFCheckpoint

FIXTURES = Path(__file__).resolve().parent / "parity" / "transformer_xl_tf"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "fixture.json").is_file()) if FIXTURES.is_dir() else []


def _prefix(case: str) -> Path:
    return next((FIXTURES / case).glob("*.index")).with_suffix("")


def test_crc32c_gives_the_published_check_value():
    # CRC-32C (Castagnoli) of "123456789" is 0xE3069283 (RFC 3720, appendix B.4)
    assert tf_bundle._crc32c_python(b"123456789") == 0xE3069283
    assert tf_bundle.crc32c(b"123456789") == 0xE3069283
    assert tf_bundle.crc32c(b"") == 0


def test_there_are_fixtures_written_by_tensorflow():
    assert len(CASES) >= 3, "run tests/parity/make_transformer_xl_tf.py (see its docstring)"


@pytest.mark.parametrize("case", CASES)
def test_every_variable_tensorflow_wrote_is_read_with_its_shape(case):
    meta = json.loads((FIXTURES / case / "fixture.json").read_text())
    with TFCheckpoint(_prefix(case)) as ckpt:
        written = {v["name"]: tuple(v["shape"]) for v in meta["variables"]}
        assert set(ckpt.names()) == set(written)
        for name, shape in written.items():
            value = ckpt.read(name)
            assert value.shape == shape and value.dtype == np.float32 and np.isfinite(value).all(), name


@pytest.mark.parametrize("case", CASES[:1])
def test_a_corrupt_truncated_or_missing_file_is_refused_in_one_line(case, tmp_path):
    src = _prefix(case)
    for f in src.parent.glob(src.name + ".*"):
        shutil.copy(f, tmp_path / f.name)
    prefix = tmp_path / src.name
    data = next(tmp_path.glob(src.name + ".data-*"))
    with TFCheckpoint(prefix) as ckpt:
        name = max(ckpt.names(), key=lambda n: ckpt.entries[n].size)
        entry = ckpt.entries[name]
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 3] ^= 0xFF  # one byte of the largest variable
    data.write_bytes(bytes(raw))
    with TFCheckpoint(prefix) as ckpt, pytest.raises(CheckpointError) as err:
        ckpt.read(name)
    assert name in str(err.value) and "CRC-32C" in str(err.value) and "\n" not in str(err.value)

    index = tmp_path / (src.name + ".index")
    index.write_bytes(index.read_bytes()[:-10])
    with pytest.raises(CheckpointError) as err:
        TFCheckpoint(prefix)
    assert str(index) in str(err.value) and "\n" not in str(err.value)

    with pytest.raises(CheckpointError) as err:
        TFCheckpoint(tmp_path / "nothing")
    assert "no checkpoint index" in str(err.value)
    shutil.copy(f"{src}.index", index)
    data.unlink()
    with TFCheckpoint(prefix) as ckpt, pytest.raises(CheckpointError) as err:
        ckpt.read(name)
    assert "missing checkpoint data file" in str(err.value) and data.name in str(err.value)
