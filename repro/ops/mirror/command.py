"""`repro mirror build|serve|run ROOT`: the command line of the rehearsal's mirror (`repro.ops.mirror`), registered
by `repro.cli.commands`: build a mirror folder, serve it and print the settings, or run one command against it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from repro.ops.mirror.build import build_mirror
from repro.ops.mirror.hub import GPT2_SHAPES
from repro.ops.mirror.server import environment, serve


def add_parser(sub) -> None:
    """The `mirror` subcommand (registered by repro/cli/commands.py)."""
    m = sub.add_parser("mirror", help="build / serve a local mirror of every paper-profile source (rehearsal)")
    m.add_argument("action", choices=["build", "serve", "run"],
                   help="build: write the mirror; serve: serve it and print the settings; run: build if needed, "
                        "serve, run a command with the settings, stop")
    m.add_argument("root", help="the mirror folder (e.g. data/mirror)")
    m.add_argument("--exec", dest="command", help="run: the command line to run against the mirror, quoted "
                                                  "(e.g. --exec 'dvc repro -S profile=paper')")
    m.add_argument("--gpt2-size", choices=sorted(GPT2_SHAPES), default="paper",
                   help="shapes of the random GPT-2 checkpoint (paper: 12 x 768, as the configs build it)")
    m.add_argument("--cache", help="Hub caches of the clients (default: <root>/client-cache)")
    m.add_argument("--idle-timeout", type=float, default=1800, help="serve: stop after this many idle seconds")
    m.add_argument("--port", type=int, default=0)
    m.set_defaults(func=main)


def main(args) -> None:
    root = Path(args.root)
    if args.action in ("build", "run"):
        t0 = time.time()
        build_mirror(root, gpt2_size=args.gpt2_size)
        print(f"mirror built in {root} ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    if args.action == "build":
        return
    cache = Path(args.cache) if args.cache else root / "client-cache"
    with serve(root, idle_timeout=args.idle_timeout, port=args.port) as server:
        env = environment(server.url, cache)
        if args.action == "serve":
            print("\n".join(f"export {k}={v!r}" for k, v in env.items()), flush=True)
            print(f"# serving {root} on {server.url} until {args.idle_timeout:.0f} s without a request (Ctrl-C stops)",
                  file=sys.stderr, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                server.wait()
            return
        if not args.command:
            raise ValueError("repro mirror run ROOT --exec 'COMMAND': give the command to run against the mirror")
        rc = subprocess.call(shlex.split(args.command), env=os.environ | env)
    if rc:
        raise SystemExit(rc)
