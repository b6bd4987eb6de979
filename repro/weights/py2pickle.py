"""Safe reading of the Python-2 pickles that released models ship beside their weights (Transformer-XL's
`cache.pkl`: the authors' `data_utils.Corpus` with its `vocabulary.Vocab` and the encoded splits).

    symbols = released_vocabulary("…/cache.pkl")   # idx2sym, as the authors' Python 2 built it

Follows Python's `pickle` with `encoding="latin1"`, the documented way to read Python 2 pickles holding numpy
arrays (a Python 2 `str` is bytes; latin-1 maps each byte to one character, losslessly), and the authors' classes
(`tf/data_utils.py`, `tf/vocabulary.py`): a `Corpus` holds `vocab`, whose `idx2sym` lists the symbols in id order.
Differs from `pickle.load`: no class is imported or run. The authors' classes become plain attribute holders, and
only numpy's array reconstruction and `collections`' counters and ordered dictionaries are allowed besides: any
other global in the file (a pickle can name `os.system`) is refused in one line before anything is built. The
vocabulary must be read as released, not rebuilt: Python 2 broke ties between equally frequent symbols in another
order than Python 3 does.
"""

from __future__ import annotations

import collections
import os
import pickle
from pathlib import Path

import numpy as np

try:
    from numpy._core.multiarray import _reconstruct as _numpy_reconstruct  # numpy 2
except ImportError:  # numpy 1
    from numpy.core.multiarray import _reconstruct as _numpy_reconstruct


class PickleRefused(ValueError):
    """A pickle that names a global outside the allowed ones, or that is not the expected object: one line."""


class Released:
    """A stand-in for one of the authors' classes: it keeps the pickled attributes and runs none of their code."""

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        if isinstance(state, tuple) and len(state) == 2:  # (dict, slots)
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(state, dict):
            raise PickleRefused(f"{type(self).__name__}: a state of type {type(state).__name__}, not attributes")
        self.__dict__.update(state)


class Corpus(Released):
    """The authors' `data_utils.Corpus`."""


class Vocab(Released):
    """The authors' `vocabulary.Vocab`."""


ALLOWED = {
    ("data_utils", "Corpus"): Corpus,
    ("vocabulary", "Vocab"): Vocab,
    ("collections", "Counter"): collections.Counter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}
RECONSTRUCT = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct")}


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, path: str):
        super().__init__(file, encoding="latin1")
        self.path = path

    def find_class(self, module: str, name: str):
        if (module, name) in ALLOWED:
            return ALLOWED[(module, name)]
        if (module, name) in RECONSTRUCT:
            return _numpy_reconstruct
        raise PickleRefused(f"{self.path} names {module}.{name}, which is not one of the authors' vocabulary "
                            "classes or numpy's arrays: refused unread (a pickle may run any code it names)")


def load(path: str | os.PathLike):
    """The object in a Python 2 pickle, with the authors' classes as attribute holders (the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise PickleRefused(f"no file {path}")
    with path.open("rb") as f:
        try:
            return _Unpickler(f, str(path)).load()
        except PickleRefused:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
            raise PickleRefused(f"{path} is not a readable pickle ({type(err).__name__}: {err}): download it "
                                "again") from None


def text(symbol) -> str:
    """A symbol as Python 3 text: a Python 2 `str` (bytes, read as latin-1) decoded as the UTF-8 it held."""
    if isinstance(symbol, bytes):
        return symbol.decode("utf-8")
    try:
        return symbol.encode("latin1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return symbol  # a Python 2 `unicode` (already text), or bytes that were not UTF-8


def released_vocabulary(path: str | os.PathLike) -> list[str]:
    """`idx2sym` of a released `cache.pkl` (a `data_utils.Corpus`), as text, in id order."""
    corpus = load(path)
    vocab = getattr(corpus, "vocab", None)
    symbols = getattr(vocab, "idx2sym", None)
    if not isinstance(symbols, list) or not symbols:
        raise PickleRefused(f"{path} holds no corpus with a vocabulary (corpus.vocab.idx2sym): give the cache.pkl "
                            "released beside the model")
    return [text(s) for s in symbols]
