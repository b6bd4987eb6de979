"""Miniature corpora in the formats the papers' data pipelines read, the same bytes on every call: the inputs of
the data parity fixtures (`make_data.py` feeds them to the authors' scripts, `test_data_parity.py` to ours).

- WikiText-103: `wiki.{train,valid,test}.tokens` (heading lines ` = Title = `, blank lines ` `, `@-@`, `<unk>`),
  with characters where line-reading rules part ways: `\\r\\n` and a lone `\\r` (universal newlines), and
  `\\x0b`, `\\x0c`, `\\x1c`, `\\x85`, `\\u2028`, `\\u2029` inside lines (`str.splitlines` breaks there, iterating a
  file does not; all are whitespace to `str.split`), a no-break space, a tab and runs of spaces. Every word of
  valid and test also occurs in train, as in WikiText (the reference has no unknown-word entry for it).
- Penn Treebank: `ptb.{train,valid,test}.txt` in Mikolov's layout (a leading space, `<unk>`, `N`), with an
  upper-case word and its lower-case twin (the reference lower-cases PTB) and the same odd characters.
- enwik8 and text8: one member each (`enwik8`, `text8`) of 10,000,000 + `EXTRA` bytes (the split scripts take
  the last 2 × 5,000,000 for validation and test). enwik8: skewed byte frequencies with ties, newlines and bytes
  above 127, and byte values that occur only in validation or test (the reference counts every split); text8: a-z
  and spaces with spaces at both ends of every split (the script strips each part).
"""

from __future__ import annotations

import numpy as np

EXTRA = 240_000  # bytes beyond the 10M of validation + test in the Hutter corpora
HUTTER_TAIL = 5_000_000
ODD = ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029"]  # line breaks to str.splitlines, not to a file's lines


def _words(rng: np.random.Generator, n: int) -> list[str]:
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzé"))
    return ["".join(rng.choice(letters, size=rng.integers(1, 9))) for _ in range(n)]


def _zipf_choice(rng: np.random.Generator, vocab: list[str], size: int) -> list[str]:
    p = 1.0 / np.arange(1, len(vocab) + 1)
    return [vocab[i] for i in rng.choice(len(vocab), size=size, p=p / p.sum())]


def wikitext(seed: int = 0) -> dict[str, str]:
    """The three `.tokens` files' texts."""
    rng = np.random.default_rng(seed)
    vocab = sorted(set(_words(rng, 900))) + ["<unk>", "@-@", ",", ".", "the", "The"]
    out = {}
    for split, n_lines in (("train", 3000), ("valid", 400), ("test", 400)):
        lines = [" "]
        for i in range(n_lines):
            r = rng.random()
            if r < 0.06:
                lines += [f" = {' '.join(_zipf_choice(rng, vocab, 2))} = ", " "]
            elif r < 0.1:
                lines.append(" ")
            else:
                words = _zipf_choice(rng, vocab, int(rng.integers(3, 30)))
                line = " " + " ".join(words) + " "
                if i % 37 == 5:  # an odd separator between two words
                    k = line.index(" ", 2)
                    line = line[:k] + ODD[(i // 37) % len(ODD)] + line[k + 1 :]
                if i % 53 == 7:
                    line = line.replace(" ", "\u00a0", 1).replace(" ", "\t", 1).replace(" ", "   ", 1)
                lines.append(line)
        if split == "train":  # every word in train, whatever the sampling left out
            lines.append(" " + " ".join(vocab) + " ")
        text = "\n".join(lines) + "\n"
        # Windows and old-Mac line ends, once each
        text = text.replace("\n", "\r\n", 1)
        k = text.index("\n", len(text) // 2)
        text = text[:k] + "\r" + text[k + 1 :]
        out[split] = text
    return out


def ptb(seed: int = 1) -> dict[str, str]:
    """The three `ptb.*.txt` files' texts."""
    rng = np.random.default_rng(seed)
    vocab = sorted(set(_words(rng, 400))) + ["<unk>", "N", "n", "Mr.", "mr."]
    out = {}
    for split, n_lines in (("train", 2000), ("valid", 200), ("test", 200)):
        lines = []
        for i in range(n_lines):
            line = " " + " ".join(_zipf_choice(rng, vocab, int(rng.integers(1, 25)))) + " "
            if i % 41 == 3:
                k = line.index(" ", 2) if " " in line[2:] else len(line) - 1
                line = line[:k] + ODD[(i // 41) % len(ODD)] + line[k + 1 :]
            lines.append(line)
        if split == "train":
            lines.append(" " + " ".join(vocab) + " ")
        out[split] = "\n".join(lines) + "\n"
    return out


def enwik8(seed: int = 2) -> bytes:
    """10,000,000 + EXTRA bytes."""
    rng = np.random.default_rng(seed)
    n = 2 * HUTTER_TAIL + EXTRA
    values = np.array([10, 13, 32, 60, 62, 91, 93] + list(range(97, 123)) + list(range(48, 58))
                      + [195, 169, 226, 128, 153, 9])
    weights = np.concatenate([[30.0, 1.0, 150.0, 8.0, 8.0, 3.0, 3.0], 60.0 / np.arange(1, 27),
                              np.full(10, 2.0), [1.0, 1.0, 0.5, 0.5, 0.5, 0.2]])
    weights[values == 120] = weights[values == 113]  # a tie in expectation (ties in counts come below)
    data = rng.choice(values, size=n, p=weights / weights.sum()).astype(np.uint8)
    data[1000:1010] = 7  # a rare byte, train only
    valid0, test0 = n - 2 * HUTTER_TAIL, n - HUTTER_TAIL
    data[valid0 + 100 : valid0 + 103] = 1  # byte values seen only in validation / test (counted by the reference)
    data[test0 + 200 : test0 + 202] = 2
    data[test0 + 300 : test0 + 302] = 3  # 2 and 3: equal counts, 2 first
    return data.tobytes()


def text8(seed: int = 3) -> bytes:
    """10,000,000 + EXTRA characters of a-z and space, with spaces at the ends of every split."""
    rng = np.random.default_rng(seed)
    n = 2 * HUTTER_TAIL + EXTRA
    alphabet = np.frombuffer(b" abcdefghijklmnopqrstuvwxyz", dtype=np.uint8)
    weights = np.concatenate([[18.0], 40.0 / np.arange(1, 27)])
    data = rng.choice(alphabet, size=n, p=weights / weights.sum()).astype(np.uint8)
    for k in (0, n - 2 * HUTTER_TAIL - 1, n - 2 * HUTTER_TAIL, n - HUTTER_TAIL - 1, n - HUTTER_TAIL, n - 1):
        data[k] = 32
    return data.tobytes()
