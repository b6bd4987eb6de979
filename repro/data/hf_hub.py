"""The Hugging Face hub, reached or not: where the hub's host does not answer, its libraries are set to read their
cache only (`hub_offline`), and `HUB_HELP` says what to do when that cache lacks a file. Used by every reader of the
hub: the WikiText-103 fallback (`repro.data.sources`), the tokenizers (`repro.text.tokenizer`) and the pretrained
GPT-2. Standard library only."""

from __future__ import annotations

import os
import socket
import sys
import urllib.parse

HUB_HELP = ("run once with network access to fill the Hugging Face cache ($HF_HOME, default "
            "~/.cache/huggingface), copy a cache filled elsewhere there, or set HF_ENDPOINT to a reachable mirror")


def hub_offline(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub must be used offline (its cache only): HF_HUB_OFFLINE is set, or the hub's host
    does not answer within `timeout` s — then HF_HUB_OFFLINE is set for this process, so that a missing file fails
    at once instead of after ~23 s of retries per file."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return True
    url = urllib.parse.urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    try:
        socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout).close()
        return False
    except OSError:
        os.environ["HF_HUB_OFFLINE"] = "1"
        # read at import: set it there too where the libraries are loaded already
        for module, names in (("huggingface_hub.constants", ("HF_HUB_OFFLINE",)),
                              ("datasets.config", ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))):
            if module in sys.modules:
                for name in names:
                    setattr(sys.modules[module], name, True)
        return True
