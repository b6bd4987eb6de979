"""A local mirror of every paper-profile source, in the real formats, served from 127.0.0.1: the rehearsal's network.

`build_mirror(root)` writes miniature copies of every archive the paper profile downloads, laid out as the real
ones (the same archive names, member paths, file formats and encodings; only the contents are small and made up);
each source's real URLs (rewritten to the mirror) → what the code reads:

- WikiText-103: wikitext.smerity.com/wikitext-103-v1.zip, …-raw-v1.zip → `wikitext-103/wiki.*.tokens`,
  `wikitext-103-raw/wiki.*.raw`
- enwik8, text8: mattmahoney.net/dc/{enwik8,text8}.zip → member `enwik8` / `text8`, 10^8 bytes each (as the real ones)
- One Billion Word: statmt.org/lm-benchmark/…-r13output.tar.gz,
  github.com/rafaljozefowicz/lm/raw/master/1b_word_vocab.txt → 99 training shards, 50 held-out shards; `word count`
  lines
- PTB: fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz → `./simple-examples/data/ptb.*.txt`
- CMU-DoG: github.com/festvox/datasets-CMU_DoG/archive/<commit>.zip →
  `datasets-CMU_DoG-<commit>/{Conversations,WikiData}`
- LRA: storage.googleapis.com/long-range-arena/lra_release.gz → `lra_release/{listops-1000,tsv_data,pathfinder32}`
- IMDb, CIFAR-10: ai.stanford.edu/…/aclImdb_v1.tar.gz, cs.toronto.edu/…/cifar-10-python.tar.gz → reviews; python pickle
  batches
- PG-19: Hugging Face dataset `emozilla/pg19` → parquet shards + a dataset card with `configs`
- GPT-2: Hugging Face model `gpt2` → `save_pretrained` checkpoint, a 50,257-symbol byte-level BPE

Layout of `root`: `files/<host>/<path>` (a source URL's host and path) with `files/SHA256SUMS`, and `hub/` in the
Hugging Face cache layout (`models--gpt2/`, `datasets--emozilla--pg19/`: `refs/main` + `snapshots/<rev>/…`).

`serve(root)` serves it on 127.0.0.1 (an ephemeral port; plain files with HTTP Range, and the part of the Hub's
HTTP API that `huggingface_hub`, `transformers` and `datasets` use: `resolve`, `api/<kind>/<repo>[/revision|tree|
paths-info]`); it stops when its context exits, after `idle_timeout` seconds without a request, or after
`max_seconds`. `environment(url, cache)` is the one setting that points every download at it:
`REPRO_MIRROR` (read by `repro.data.download.download`, which rewrites each real URL to `<mirror>/<host>/<path>`
and verifies against the mirror's `SHA256SUMS` instead of the real checksums) and `HF_ENDPOINT` (the Hub
libraries), with fresh Hub caches, so that the real download code runs end to end.

The GPT-2 checkpoint has the real shapes by default (12 layers, 768 wide, 1,024 positions, random weights:
the paper configs build the model from these shapes and copy the checkpoint in), or small ones
(`gpt2_size="small"`, for tests). The tokenizer is a real byte-level BPE with GPT-2's 50,257 symbols
(`<|endoftext|>` = 50256): merges trained on the mirror's text, then completed with further valid merges.

Content is deterministic for a given `seed`; `manifest.json` records what each source holds (counts the tests
compare the parsed streams with).

The package, one job a module: `text` (the made-up words and bytes), `layout` (where files go and the archive
writers), the builders of each source family (`corpora`: the language-model and dialogue corpora; `lra`: the Long
Range Arena's sources; `hub`: GPT-2 and PG-19 as Hub repositories), `build` (`build_mirror`, all of them and the
manifest), `server` (`serve`, `environment`) and `command` (`repro mirror`).
"""

from repro.ops.mirror.build import FORMAT_VERSION, build_mirror
from repro.ops.mirror.hub import GPT2_SHAPES, GPT2_VOCAB, gpt2_tokenizer
from repro.ops.mirror.server import MirrorServer, environment, serve
from repro.ops.mirror.text import REAL_VOCAB

__all__ = ["FORMAT_VERSION", "GPT2_SHAPES", "GPT2_VOCAB", "REAL_VOCAB", "MirrorServer", "build_mirror", "environment",
           "gpt2_tokenizer", "serve"]
