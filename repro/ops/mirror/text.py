"""Made-up text for the mirror's miniature corpora (`repro.ops.mirror`): pseudo-English words with Zipf-like
frequencies, WikiText-style article lines, the filler words and bytes that give each miniature its real vocabulary
size (`REAL_VOCAB`), and the repeating chunks of enwik8 and text8.

Nothing here is read from a real corpus: the words are syllables drawn from a seeded generator, so the content is
deterministic for a seed and has the statistics the data code relies on (frequent and rare words, `<unk>`, UTF-8
beyond ASCII in enwik8, lower-case letters and spaces only in text8).
"""

from __future__ import annotations

import random
import re


class Words:
    """Deterministic pseudo-English: made-up words drawn with Zipf-like frequencies, so that counts and rare
    words (→ <unk>) behave like a real corpus."""

    def __init__(self, seed: int, n: int = 1500):
        rng = random.Random(seed)
        sy = ["ka", "lo", "mi", "ren", "ta", "vo", "shi", "an", "el", "or", "bu", "de", "fi", "gra", "ho", "ju",
              "ne", "pa", "qui", "su", "tor", "ul", "wen", "ya", "zo", "the", "ing", "ly", "ed", "st"]
        words: list[str] = []
        seen: set[str] = set()
        for w in ("the", "of", "and", "in", "to", "a", "was", "is", "for", "on", "as", "with", "by", "he", "it"):
            words.append(w)
            seen.add(w)
        while len(words) < n:
            w = "".join(rng.choice(sy) for _ in range(rng.randint(1, 3)))
            if w not in seen:
                seen.add(w)
                words.append(w)
        self.words = words
        self.cum = []
        total = 0.0
        for r in range(n):
            total += 1.0 / (r + 1)
            self.cum.append(total)
        self.rng = random.Random(seed + 1)

    def sentence(self, lo: int = 5, hi: int = 18) -> list[str]:
        n = self.rng.randint(lo, hi)
        return self.rng.choices(self.words, cum_weights=self.cum, k=n)


def wikitext_lines(words: Words, n_articles: int, paragraphs: int) -> list[str]:
    """The raw lines of WikiText-style articles: ` = Title = `, ` = = Section = = `, blank lines ` `, paragraphs of
    tokenized sentences (` @-@ `, ` @,@ `, ` , `, ` . `)."""
    lines: list[str] = [" \n"]
    for _ in range(n_articles):
        title = " ".join(words.sentence(1, 3)).title()
        lines += [f" = {title} = \n", " \n"]
        for p in range(paragraphs):
            if p and p % 3 == 0:
                lines += [f" = = {' '.join(words.sentence(1, 2)).title()} = = \n", " \n"]
            sents = []
            for _ in range(words.rng.randint(3, 7)):
                s = words.sentence()
                if words.rng.random() < 0.2:
                    s.insert(len(s) // 2, "@-@")
                if words.rng.random() < 0.1:
                    s += ["1", "@,@", "200"]
                if words.rng.random() < 0.3:
                    s.insert(2, ",")
                s[0] = s[0].capitalize()
                sents.append(" ".join(s) + " .")
            lines += [" " + " ".join(sents) + " \n", " \n"]
    return lines


def with_unk(lines: list[str], counts: dict[str, int]) -> str:
    """The tokens file: words seen fewer than twice in the training split are `<unk>` (as in WikiText-103, whose
    validation and test words are all in the training vocabulary)."""
    return "".join(" ".join(w if not w or counts.get(w, 0) > 1 else "<unk>" for w in line[:-1].split(" ")) + "\n"
                   for line in lines)


# The real vocabularies, so that every paper model built on the mirror has its paper size (embedding and softmax
# grow with the vocabulary): WikiText-103 267,735 (training types, <unk> among them, plus <eos>), PTB 10,000
# (9,999 words plus <eos>), One Billion Word 793,471 lines of 1b_word_vocab.txt, enwik8 205 byte values, text8 27.
REAL_VOCAB = {"wt103": 267_735, "ptb": 10_000, "lm1b": 793_471, "enwik8": 205, "text8": 27}


def lexicon(n: int, taken: set[str]) -> list[str]:
    """`n` distinct made-up lower-case words outside `taken` ("qz" + a base-26 number: no generated word starts so)."""
    out, i = [], 0
    while len(out) < n:
        k, w = i, ""
        while True:
            w = chr(97 + k % 26) + w
            k //= 26
            if not k:
                break
        i += 1
        if "qz" + w not in taken:
            out.append("qz" + w)
    return out


def fill_bytes(chunk: bytes, target: int) -> bytes:
    """`chunk` plus a line of valid UTF-8 characters that brings its distinct byte values to exactly `target`
    (enwik8 is UTF-8: ASCII, continuation bytes 0x80-0xBF and lead bytes)."""
    have = set(chunk)
    extra = []
    for cp in [9, *range(32, 127), *range(0x80, 0xD800), *range(0xE000, 0x110000)]:
        if len(have) == target:
            break
        b = chr(cp).encode("utf-8")
        if set(b) - have and len(have | set(b)) <= target:
            have |= set(b)
            extra.append(chr(cp))
    if len(have) != target:
        raise AssertionError(f"could not reach {target} distinct bytes (got {len(have)})")
    return chunk + ("\n" + "".join(extra) + "\n").encode("utf-8")


def tile(chunk: bytes, size: int) -> bytes:
    return (chunk * (size // len(chunk) + 1))[:size]


def enwik8_chunk(words: Words) -> bytes:
    """≈ 20 KB of MediaWiki XML with UTF-8 characters beyond ASCII (tiled to 10^8 bytes: deflate's 32 KB window
    then compresses the archive to a few hundred KB)."""
    out = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.3/" version="0.3" xml:lang="en">\n']
    extra = ["café", "Zürich", "naïve", "Ελλάδα", "東京", "–", "€"]
    while sum(map(len, out)) < 20_000:
        title = " ".join(words.sentence(1, 3)).title()
        body = " ".join(" ".join(words.sentence()) + "." for _ in range(6))
        body = body.replace(" the ", f" [[{words.rng.choice(extra)}]] ", 1)
        out.append(f"  <page>\n    <title>{title}</title>\n    <id>{len(out)}</id>\n    <revision>\n"
                   f"      <text xml:space=\"preserve\">'''{title}''' {body}\n&lt;ref&gt;{{{{cite}}}}&lt;/ref&gt;"
                   f"</text>\n    </revision>\n  </page>\n")
    return "".join(out).encode("utf-8")


def text8_chunk(words: Words) -> bytes:
    text = " " + " ".join(" ".join(words.sentence()) for _ in range(400))
    return re.sub(r"[^a-z ]", "", text.lower()).encode("ascii")
