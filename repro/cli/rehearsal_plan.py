"""The plan of a rehearsal (`repro rehearse`): which stages run, in what order, and when its scratch workspace drops a
stage's checkpoints (kept to the end, the paper profile's checkpoints took 70 GB of a full rehearsal's
91 GB estimate, on a machine with 80 GB free).

Follows DVC's own reading of `dvc.yaml` under the rehearsal's parameters (`dvc.repo.Repo(…).index.graph`, read in a
scratch folder that holds only `dvc.yaml` and the merged `params.yaml`, so it needs no workspace): its stages, the
edges between them and each stage's deps and outs. Differs from `dvc repro` of a stage in one way: the plan holds
the stages asked for and every stage upstream of them, upstream first (else in `dvc.yaml`'s order), and each runs
alone (`dvc repro -s`). DVC's own walk upstream would run a stage again whose checkpoints the workspace dropped.

A stage's checkpoints (its outs under `checkpoints/`) are dropped once every stage of the plan that reads them has
run (`drops`): for the paper profile, Transformer-XL's `lm` group after RECL and generation, every other group
right after its own stage (its tests run inside it). Dropped means the files and their hard links in DVC's cache
(`drop_checkpoints`): the workspace is a scratch copy, and nothing after reads them.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

CHECKPOINTS = "checkpoints"

# Each paper's main model, and the memory arena's composition of two papers' mechanisms, fitted by 2 DDP processes
# after the stages of a full rehearsal: steps of their own, named `ddp:PAPER/CONFIG`.
DDP_RUNS = [("transformer_xl", "wt103_base"), ("lamemo", "enwik8_lamemo"), ("infinity_former", "sort_4000_infty"),
            ("mgk", "wt103_mgk4"), ("arena", "enwik8_lamemo_infinity")]


@dataclass(frozen=True)
class Pipeline:
    order: tuple[str, ...]  # every stage, each after its upstream stages, else in dvc.yaml's order
    upstream: dict[str, frozenset[str]]  # the stages whose outs a stage's deps read (DVC's edges)
    deps: dict[str, tuple[str, ...]]
    outs: dict[str, tuple[str, ...]]  # metrics and plots included
    cmds: dict[str, str]  # each stage's command, its `${…}` filled from the parameters


def merged_params(root: Path) -> dict:
    """params.paper.yaml with params.rehearsal.yaml's keys replacing its own (nested dictionaries merged)."""
    def merge(a: dict, b: dict) -> dict:
        out = dict(a)
        for k, v in b.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    paper = yaml.safe_load((root / "params.paper.yaml").read_text())
    return merge(paper, yaml.safe_load((root / "params.rehearsal.yaml").read_text()))


def read_pipeline(root: Path, params: dict) -> Pipeline:
    """DVC's graph of `root`'s `dvc.yaml` with `params` as its `params.yaml` (see the module's docstring)."""
    from dvc.repo import Repo  # heavy: DVC's whole stack, only where a pipeline is read

    logging.getLogger("dvc").setLevel(logging.WARNING)  # "Initialized DVC repository." for a scratch folder
    with tempfile.TemporaryDirectory(prefix="repro-plan-") as tmp:
        (Path(tmp) / "dvc.yaml").write_bytes((root / "dvc.yaml").read_bytes())
        (Path(tmp) / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        Repo.init(tmp, no_scm=True)
        repo = Repo(tmp)
        try:
            stages = list(repo.index.stages)
            graph = repo.index.graph
            names = [s.name for s in stages]
            upstream = {s.name: frozenset(b.name for b in graph.successors(s)) for s in stages}
            deps = {s.name: tuple(d.def_path for d in s.deps) for s in stages}
            outs = {s.name: tuple(o.def_path for o in s.outs) for s in stages}
            cmds = {s.name: s.cmd if isinstance(s.cmd, str) else " && ".join(s.cmd) for s in stages}
        finally:
            repo.close()
    return Pipeline(_upstream_first(names, upstream), upstream, deps, outs, cmds)


def _upstream_first(names: list[str], upstream: dict[str, frozenset[str]]) -> tuple[str, ...]:
    """A topological order that keeps `names`' order wherever the edges allow (the first ready stage each time)."""
    done: list[str] = []
    left = list(names)
    while left:
        ready = next((n for n in left if upstream[n] <= set(done)), None)
        if ready is None:
            raise ValueError(f"dvc.yaml's stages {', '.join(left)} depend on each other in a cycle")
        done.append(ready)
        left.remove(ready)
    return tuple(done)


def with_upstream(pipeline: Pipeline, names: list[str]) -> list[str]:
    """`names` and every stage upstream of them, in the pipeline's order."""
    want, todo = set(), list(names)
    while todo:
        n = todo.pop()
        if n not in want:
            want.add(n)
            todo.extend(pipeline.upstream[n])
    return [n for n in pipeline.order if n in want]


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/"), b.rstrip("/")
    return a == b or a.startswith(b + "/") or b.startswith(a + "/")


def checkpoint_outs(pipeline: Pipeline, name: str) -> list[str]:
    return [o for o in pipeline.outs[name] if _overlap(o, CHECKPOINTS) and o.rstrip("/") != CHECKPOINTS]


def readers(pipeline: Pipeline, name: str) -> list[str]:
    """The stages whose deps read `name`'s checkpoints (not its records or tables)."""
    ckpts = checkpoint_outs(pipeline, name)
    return [s for s in pipeline.order if name in pipeline.upstream[s]
            and any(_overlap(d, o) for d in pipeline.deps[s] for o in ckpts)]


def drops(pipeline: Pipeline, plan: list[str]) -> list[list[str]]:
    """For each stage of `plan` (in order), the stages whose checkpoints go once it has run: those with checkpoints
    whose readers in the plan have all run by then (readers outside the plan do not run in this rehearsal)."""
    out: list[list[str]] = [[] for _ in plan]
    pos = {n: i for i, n in enumerate(plan)}
    for i, name in enumerate(plan):
        if checkpoint_outs(pipeline, name):
            last = max([i, *(pos[r] for r in readers(pipeline, name) if r in pos)])
            out[last].append(name)
    return out


def drop_checkpoints(ws: Path, paths: list[str]) -> int:
    """Delete the files under `paths` (relative to the workspace `ws`) and every hard link of them in the
    workspace's DVC cache (`.dvc/cache`, linked there by `repro rehearse`'s DVC settings); returns the bytes
    freed (each inode once)."""
    inodes: dict[tuple[int, int], int] = {}
    files = []
    for rel in paths:
        top = ws / rel
        found = [top] if top.is_file() else [Path(d) / f for d, _, fs in os.walk(top) for f in fs]
        for f in found:
            st = os.lstat(f)
            inodes[(st.st_dev, st.st_ino)] = st.st_size
            files.append(f)
    for dirpath, _, fs in os.walk(ws / ".dvc" / "cache"):
        for f in fs:
            st = os.lstat(os.path.join(dirpath, f))
            if (st.st_dev, st.st_ino) in inodes:
                files.append(Path(dirpath) / f)
    for f in files:
        f.unlink(missing_ok=True)
    return sum(inodes.values())
