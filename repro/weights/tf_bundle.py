"""A reader of TensorFlow checkpoints (the V2 "tensor bundle": `model.ckpt-0.index` and `model.ckpt-0.data-*`)
without TensorFlow: the authors of Transformer-XL released their trained models in this format only.

    with TFCheckpoint("path/model.ckpt-0") as ckpt:
        ckpt.names()                     # every variable's name
        ckpt.shape("transformer/r_w_bias"), ckpt.read("transformer/r_w_bias")   # a numpy array

Follows the format as TensorFlow writes it (`tensorflow/core/util/tensor_bundle/tensor_bundle.cc` and the LevelDB
table it builds on, `tensorflow/core/lib/io/table*.cc`, `format.cc`, `block.cc`):
- the `.index` file is an immutable sorted table: data blocks of prefix-compressed key/value entries (each block
  ends with its restart offsets and their count, and is followed by a one-byte compression type and the masked
  CRC-32C of the block and that byte), an index block whose values are the data blocks' handles, and a 48-byte
  footer (the meta-index and index handles as varints, padded, then the magic number);
- each key is a variable's name; its value a `BundleEntryProto` (dtype, shape, shard, offset, size, masked CRC-32C
  of the tensor's bytes); the empty key holds the `BundleHeaderProto` (shards, endianness, version);
- the tensors' bytes lie in `.data-0000K-of-0000N` at their offset, little-endian, row-major.
Differs: no TensorFlow or protobuf library (the two messages are decoded by field number, here); no snappy (a
bundle's index is written uncompressed); no partitioned variables (`slices`) or string tensors, which the released
models do not have: either is refused in one line naming the variable. Every block's and tensor's CRC-32C is checked
(`google_crc32c` when installed, else the table-driven code below: minutes for a gigabyte).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAGIC = 0xDB4775248B80FB57  # LevelDB's table magic number, the footer's last 8 bytes
FOOTER = 48  # two block handles (≤ 20 bytes each as varints), zero padding to 40, the magic number
BLOCK_TRAILER = 5  # compression type (1 byte) and the masked CRC-32C (4 bytes)
MASK_DELTA = 0xA282EAD8

# TensorFlow's DataType enum (types.proto) → numpy, little-endian
DTYPES = {1: "<f4", 2: "<f8", 3: "<i4", 4: "u1", 5: "<i2", 6: "i1", 9: "<i8", 10: "?", 17: "<u2", 19: "<f2",
          22: "<u4", 23: "<u8"}
DTYPE_NAMES = {7: "string", 14: "bfloat16", 8: "complex64", 18: "complex128"}


class CheckpointError(ValueError):
    """A file that is not a readable TF checkpoint, or one whose bytes fail their checksum: one line, naming it."""


# ------------------------------------------------------------------------------------------------------ CRC-32C
def _crc_table() -> list[int]:
    poly, table = 0x82F63B78, []  # Castagnoli, reflected
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ poly if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc_table()


def _crc32c_python(data: bytes, crc: int = 0) -> int:
    crc ^= 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of `data`: `google_crc32c`'s C code when it is installed, else plain Python."""
    try:
        import google_crc32c  # optional: a C extension, ~1 GB/s

        return int(google_crc32c.value(bytes(data)))
    except ImportError:
        return _crc32c_python(data)


def masked(crc: int) -> int:
    """LevelDB's mask of a stored CRC (a CRC of data holding CRCs is otherwise degenerate)."""
    return (((crc >> 15) | (crc << 17)) + MASK_DELTA) & 0xFFFFFFFF


# ----------------------------------------------------------------------------------------- varints and protobuf
def varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, next position) of the base-128 varint at `pos`."""
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise CheckpointError("a varint runs past the end of its block")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def fields(buf: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a protobuf message: varints and fixed-width values as ints, length-delimited
    fields as bytes."""
    out, pos = [], 0
    while pos < len(buf):
        key, pos = varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos)
        elif wire == 1:
            value, pos = struct.unpack_from("<Q", buf, pos)[0], pos + 8
        elif wire == 2:
            n, pos = varint(buf, pos)
            value, pos = bytes(buf[pos:pos + n]), pos + n
        elif wire == 5:
            value, pos = struct.unpack_from("<I", buf, pos)[0], pos + 4
        else:
            raise CheckpointError(f"protobuf wire type {wire} is not one a bundle entry uses")
        out.append((number, value))
    return out


@dataclass(frozen=True)
class Entry:
    """One variable's `BundleEntryProto`."""

    dtype: int
    shape: tuple[int, ...]
    shard: int
    offset: int
    size: int
    crc32c: int | None  # masked, as stored
    sliced: bool


def parse_entry(buf: bytes) -> Entry:
    dtype, shape, shard, offset, size, crc, sliced = 0, [], 0, 0, 0, None, False
    for number, value in fields(buf):
        if number == 1:
            dtype = value
        elif number == 2:  # TensorShapeProto: repeated Dim dim = 2 {int64 size = 1; string name = 2}
            for n, dim in fields(value):
                if n == 2:
                    size_ = next((v for k, v in fields(dim) if k == 1), 0)
                    shape.append(size_ - (1 << 64) if size_ >= 1 << 63 else size_)
        elif number == 3:
            shard = value
        elif number == 4:
            offset = value
        elif number == 5:
            size = value
        elif number == 6:
            crc = value
        elif number == 7:
            sliced = True
    return Entry(dtype, tuple(shape), shard, offset, size, crc, sliced)


# ------------------------------------------------------------------------------------------------ the table
def _block(data: bytes, offset: int, size: int, what: Path) -> bytes:
    end = offset + size
    if end + BLOCK_TRAILER > len(data):
        raise CheckpointError(f"{what}: a block runs past the end of the file (truncated?)")
    contents, kind = data[offset:end], data[end]
    stored = struct.unpack_from("<I", data, end + 1)[0]
    if masked(crc32c(data[offset:end + 1])) != stored:
        raise CheckpointError(f"{what}: a block's CRC-32C does not match (a corrupt or truncated download): "
                              "download it again")
    if kind != 0:
        raise CheckpointError(f"{what}: a block is compressed (type {kind}); TF bundles write their index "
                              "uncompressed, so this is not a TF checkpoint index")
    return contents


def _entries(block: bytes) -> list[tuple[bytes, bytes]]:
    """The (key, value) pairs of a table block (prefix-compressed keys; the restart array at its end)."""
    if len(block) < 4:
        return []
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    limit = len(block) - 4 - 4 * restarts
    out, pos, key = [], 0, b""
    while pos < limit:
        shared, pos = varint(block, pos)
        unshared, pos = varint(block, pos)
        n, pos = varint(block, pos)
        key = key[:shared] + block[pos:pos + unshared]
        pos += unshared
        out.append((key, block[pos:pos + n]))
        pos += n
    return out


def read_index(path: str | os.PathLike) -> dict[str, bytes]:
    """{key: value} of a LevelDB-format table file (a bundle's `.index`)."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < FOOTER or struct.unpack_from("<Q", data, len(data) - 8)[0] != MAGIC:
        raise CheckpointError(f"{path} is not a TF checkpoint index (no table magic number at its end): give the "
                              "`.index` file of a checkpoint")
    footer = data[len(data) - FOOTER:]
    _meta_off, pos = varint(footer, 0)
    _meta_size, pos = varint(footer, pos)
    index_off, pos = varint(footer, pos)
    index_size, pos = varint(footer, pos)
    out = {}
    for _last_key, handle in _entries(_block(data, index_off, index_size, path)):
        off, p = varint(handle, 0)
        size, _ = varint(handle, p)
        for key, value in _entries(_block(data, off, size, path)):
            out[key.decode("utf-8")] = value
    return out


class TFCheckpoint:
    """A TF V2 checkpoint by its prefix (`…/model.ckpt-0`: the files `<prefix>.index` and `<prefix>.data-*`)."""

    def __init__(self, prefix: str | os.PathLike, *, verify: bool = True):
        prefix = str(prefix)
        for suffix in (".index", ".meta"):
            if prefix.endswith(suffix):
                prefix = prefix[: -len(suffix)]
        self.prefix, self.verify = prefix, verify
        index = Path(prefix + ".index")
        if not index.is_file():
            raise CheckpointError(f"no checkpoint index {index}: give the checkpoint's prefix, e.g. "
                                  "`…/model.ckpt-0` for model.ckpt-0.index and model.ckpt-0.data-00000-of-00001")
        table = read_index(index)
        header = dict(fields(table.pop("", b"")))
        self.num_shards = int(header.get(1, 1))
        if header.get(2, 0) != 0:  # BundleHeaderProto.endianness: LITTLE = 0
            raise CheckpointError(f"{index}: a big-endian checkpoint; only little-endian ones are read")
        self.entries = {name: parse_entry(value) for name, value in table.items()}
        self._files: dict[int, object] = {}

    def __enter__(self) -> TFCheckpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def names(self) -> list[str]:
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._entry(name).shape

    def _entry(self, name: str) -> Entry:
        if name not in self.entries:
            raise KeyError(f"{self.prefix} has no variable {name!r}")
        return self.entries[name]

    def _data(self, shard: int):
        if shard not in self._files:
            path = Path(f"{self.prefix}.data-{shard:05d}-of-{self.num_shards:05d}")
            if not path.is_file():
                raise CheckpointError(f"missing checkpoint data file {path}: download every shard of the checkpoint")
            self._files[shard] = path.open("rb")
        return self._files[shard]

    def read(self, name: str) -> np.ndarray:
        """The variable's value (a new numpy array), its bytes checked against their CRC-32C."""
        e = self._entry(name)
        if e.sliced:
            raise CheckpointError(f"{name} in {self.prefix} is a partitioned variable; partitioned checkpoints are "
                                  "not read")
        if e.dtype not in DTYPES:
            raise CheckpointError(f"{name} in {self.prefix} has dtype {DTYPE_NAMES.get(e.dtype, e.dtype)}, "
                                  "which is not read")
        f = self._data(e.shard)
        f.seek(e.offset)
        raw = f.read(e.size)
        if len(raw) != e.size:
            raise CheckpointError(f"{name}: the data file ends before its {e.size} bytes (truncated download?)")
        if self.verify and e.crc32c is not None and masked(crc32c(raw)) != e.crc32c:
            raise CheckpointError(f"{name} in {self.prefix}: its bytes fail their CRC-32C (a corrupt download): "
                                  "download the checkpoint again")
        dtype = np.dtype(DTYPES[e.dtype])
        count = int(np.prod(e.shape)) if e.shape else 1
        if count * dtype.itemsize != e.size:
            raise CheckpointError(f"{name}: {e.size} bytes do not hold shape {e.shape} of {dtype}")
        return np.frombuffer(raw, dtype=dtype).reshape(e.shape).copy()
