"""The record of the rehearsal, kept like DVC's lock file: `results/rehearsal/summary.json`, one entry per step
(stage or DDP fit) with what it measured and the digests of its own inputs, so that a change reruns only the steps
it touches (`repro rehearse --stale`) and `repro rehearse --status` says which are stale and why.

Follows DVC's `dvc.lock`: a stage's dependencies are hashed by content beside its measurements, and a stage is stale
when one of them changed. Differs in three ways:

- the inputs are found, not declared (`stage_inputs`): the stage's definition in `dvc.yaml` with its parameters
  filled, both params files, the configs it names or reads (with every module a config names by its `class_path`),
  the rehearsal's overrides (`configs/rehearsal/`), and the source files of every module its command imports, from
  Python's import graph (`repro.ops.imports`: the command's module, the papers it names and the modules its configs
  name, followed transitively; the package data beside them; the mirror's code where the download code is among
  them). The `repro` dispatcher counts as a file, not through the branches that import every other command; a
  paper's commands loaded by the registry count for the papers the stage names. The orchestrator (`repro rehearse`
  itself: `repro.cli.rehearsal`, `rehearsal_plan`, this module) is no stage's input;
- the digests are of what a file does (`repro.ops.imports.digest`): a comment, a docstring or a YAML comment changes
  no stage;
- a stage that is stale reruns with the stages upstream of it (the workspace holds no earlier outputs), and each
  rerun step replaces its entry; the others keep theirs.

The summary also holds the commit of the last full rehearsal and the merged reruns since (`reruns`), the machine,
each step's seconds, exit code, peak RSS (MiB, `repro.ops.rss`) and the scratch folder's peak disk, and for each
config a `repro runs` stage fits, its parameters and the estimates that `repro.cli.estimate` makes on the meta
device (checked against the record in CI by tests/test_config_estimates.py). The README states the disk need and
the rehearsal's freshness from it (`repro.ops.docs`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import re
import shlex
import subprocess
import textwrap
from pathlib import Path

import yaml

from repro.cli.rehearsal_plan import DDP_RUNS, Pipeline, merged_params, read_pipeline
from repro.ops.docs import disk_sentence
from repro.ops.imports import MODULE_NAME, closure, digest, module_name, module_of, yaml_value
from repro.tracking import SPEED_FLAGS, cpu_flags

SUMMARY = Path("results") / "rehearsal" / "summary.json"
PARAMS_FILES = ("params.paper.yaml", "params.rehearsal.yaml")
REHEARSAL_CONFIGS = Path("configs") / "rehearsal"
MIRROR = Path("repro") / "ops" / "mirror"
DOWNLOAD = "repro/data/download.py"
ORCHESTRATOR = ("repro/cli/rehearsal.py", "repro/cli/rehearsal_plan.py", "repro/cli/rehearsal_record.py")
# the Lightning CLI's subcommands and the other commands with a module of their own (`repro.cli.entry`)
COMMAND_MODULES = {"fit": "repro.cli.cli", "validate": "repro.cli.cli", "test": "repro.cli.cli",
                   "predict": "repro.cli.cli", "steps": "repro.cli.cli", "runs": "repro.cli.runs",
                   "profile": "repro.cli.profile"}
SHARED_COMMANDS = "repro.cli.commands"
DISPATCHER = "repro.cli.entry"
# every stage at most this much resident memory (two thirds of the 24 GiB machine it ran on)
STAGE_PEAK_LIMIT_MB = 16 * 1024
CONFIG_PATH = r"configs/[\w./-]+\.yaml"
# the README's rehearsal block names the stale steps up to this many, else counts them by paper
NAMED_STALE = 12


def _papers(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "papers").iterdir() if (p / "__init__.py").is_file())


def paper_command_modules(root: Path) -> dict[str, str]:
    """{command name: module} of every paper's own commands (the keys of `COMMANDS` in `papers/<paper>/commands.py`),
    read from the source as `repro.cli.registry` would load them."""
    out = {}
    for paper in _papers(root):
        path = root / "papers" / paper / "commands.py"
        if not path.is_file():
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "COMMANDS" for t in node.targets) \
                    and isinstance(node.value, ast.Dict):
                out.update({k.value: module_name(root, path) for k in node.value.keys
                            if isinstance(k, ast.Constant)})
    return out


def _yaml_files(root: Path, rel: str) -> list[str]:
    path = root / rel
    found = [path] if path.is_file() else sorted(path.rglob("*.yaml")) if path.is_dir() else []
    return [str(p.relative_to(root)) for p in found if p.suffix == ".yaml"]


def _named_modules(root: Path, config: str) -> set[str]:
    """The modules of the checkout that a YAML config names by string (`class_path: papers.lamemo.module.LaMemoLM`)."""
    path = (root / config).resolve()
    return set(_named_in(root.resolve(), path, path.stat().st_mtime_ns)) if path.is_file() else set()


@functools.lru_cache(maxsize=4096)
def _named_in(root: Path, config: Path, mtime_ns: int) -> frozenset[str]:
    def strings(node):
        if isinstance(node, dict):
            for k, v in node.items():
                yield from strings(k)
                yield from strings(v)
        elif isinstance(node, list):
            for v in node:
                yield from strings(v)
        elif isinstance(node, str):
            yield node

    try:
        value = yaml_value(config)
    except (OSError, yaml.YAMLError):
        return frozenset()
    return frozenset(m for s in strings(value) if MODULE_NAME.fullmatch(s) for m in [module_of(root, s)] if m)


def command_inputs(root: Path, cmd: str, deps: tuple[str, ...] = (), outs: tuple[str, ...] = ()) -> set[str]:
    """The files a `repro …` command line reads, as `stage_inputs` counts them (see the module's docstring), without
    the stage's own definition."""
    args = shlex.split(cmd)
    while args and re.fullmatch(r"\w+=.*", args[0]):  # `OMP_NUM_THREADS=1 repro …`: the environment first
        args = args[1:]
    files: set[str] = set(PARAMS_FILES)
    files.update(str(p.relative_to(root)) for p in (root / REHEARSAL_CONFIGS).rglob("*") if p.is_file())
    modules: set[str] = set()
    papers = _papers(root)
    routed = False
    if args[:1] == ["repro"] and len(args) > 1:
        sub = args[1]
        routed = sub not in COMMAND_MODULES
        modules.add(COMMAND_MODULES.get(sub) or paper_command_modules(root).get(sub) or SHARED_COMMANDS)
        if sub == "runs":  # its workers run `repro fit`
            modules.add(COMMAND_MODULES["fit"])
    named_papers = {a for a in args if a in papers}
    configs = {c for a in args for c in re.findall(CONFIG_PATH, a)}
    produced = [o.rstrip("/") for o in outs]
    for dep in deps:
        if any(dep.rstrip("/") == o or dep.startswith(o + "/") for o in produced):
            continue
        if dep.startswith("configs/"):
            configs.update(_yaml_files(root, dep))
        elif (root / dep).is_file():
            files.add(dep)
        elif (root / dep).is_dir() and dep.split("/")[0] in ("repro", "papers"):
            files.update(str(p.relative_to(root)) for p in (root / dep).rglob("*") if p.is_file()
                         and "__pycache__" not in p.parts and p.suffix != ".md")
    for c in configs:
        if (root / c).is_file():
            files.add(c)
            modules.update(_named_modules(root, c))
    if routed:  # through the registry (pyproject's entry points): the named papers' commands, and tables for `tables`
        wanted = ("commands", "tables") if args[1] == "tables" else ("commands",)
        modules.update(module_name(root, f) for paper in named_papers
                       for f in (root / "papers" / paper).glob("*.py") if f.stem in wanted)
    code = closure(root, modules, shallow=[DISPATCHER], stop=[module_name(root, root / f) for f in ORCHESTRATOR])
    files.update(code)
    for folder in {str(Path(f).parent) for f in code}:  # package data: prompts, deviation tables, vocabularies
        files.update(str(p.relative_to(root)) for p in (root / folder).iterdir()
                     if p.is_file() and p.suffix not in (".py", ".md", ".pyc"))
    if DOWNLOAD in files:
        files.update(str(p.relative_to(root)) for p in (root / MIRROR).rglob("*") if p.is_file()
                     and "__pycache__" not in p.parts and p.suffix != ".md")
    return {f for f in files if f not in ORCHESTRATOR and (root / f).is_file()}


def definition(pipeline: Pipeline, name: str) -> str:
    """A stage's definition as DVC resolved it (command, deps, outs), as one string: the pseudo-file
    `dvc.yaml#NAME` among its inputs."""
    return json.dumps({"cmd": pipeline.cmds[name], "deps": list(pipeline.deps[name]),
                       "outs": list(pipeline.outs[name])}, sort_keys=True)


def ddp_command(paper: str, config: str) -> str:
    """The command line whose inputs a DDP fit of the rehearsal reads (`repro.cli.rehearsal.ddp_fit`)."""
    return f"repro fit -c configs/{paper}/paper/{config}.yaml"


def step_names(pipeline: Pipeline) -> list[str]:
    """Every step of a full rehearsal: the stages in order, then the DDP fits."""
    return [*pipeline.order, *(f"ddp:{p}/{c}" for p, c in DDP_RUNS)]


def step_inputs(root: Path, pipeline: Pipeline) -> dict[str, dict[str, str]]:
    """{step: {input: digest}} for every step of a full rehearsal (`step_names`): its files (`command_inputs`) and,
    for a stage, its definition (`dvc.yaml#NAME`). Each file is hashed once."""
    cache: dict[str, str] = {}

    def hashed(files: set[str]) -> dict[str, str]:
        out = {}
        for f in sorted(files):
            if f not in cache:
                cache[f] = digest(root / f)
            out[f] = cache[f]
        return out

    steps = {}
    for name in pipeline.order:
        files = hashed(command_inputs(root, pipeline.cmds[name], pipeline.deps[name], pipeline.outs[name]))
        files[f"dvc.yaml#{name}"] = hashlib.sha256(definition(pipeline, name).encode()).hexdigest()
        steps[name] = files
    for paper, config in DDP_RUNS:
        steps[f"ddp:{paper}/{config}"] = hashed(command_inputs(root, ddp_command(paper, config)))
    return steps


def inputs_sha256(inputs: dict[str, str]) -> str:
    return hashlib.sha256("".join(f"{k}\0{v}\n" for k, v in sorted(inputs.items())).encode()).hexdigest()


def stamp(entry: dict, inputs: dict[str, str]) -> dict:
    """A step's summary entry with the hash of its inputs and their list."""
    return {**entry, "inputs_sha256": inputs_sha256(inputs), "inputs": sorted(inputs)}


def stale_steps(summary: dict, now: dict[str, dict[str, str]]) -> dict[str, str]:
    """{step: why} for every step whose inputs differ from those it last ran with, that failed, or that never ran;
    `now` as `step_inputs` gives it. The summary's `files` holds every input's digest at its last run."""
    recorded = {s["stage"]: s for s in summary.get("stages", [])}
    files = summary.get("files", {})
    out = {}
    for step, inputs in now.items():
        entry = recorded.get(step)
        if entry is None:
            out[step] = "it has never run (a new stage)"
        elif entry.get("inputs_sha256") == inputs_sha256(inputs):
            if entry.get("exit"):
                out[step] = f"it failed (exit {entry['exit']})"
        else:
            before = set(entry.get("inputs", []))
            changed = sorted(f for f in inputs if f in before and files.get(f) != inputs[f])
            joined, gone = sorted(set(inputs) - before), sorted(before - set(inputs))
            parts = [f"{_few(names)} {what}" for names, what in ((changed, "changed"), (joined, "joined its inputs"),
                                                                  (gone, "left its inputs")) if names]
            out[step] = "; ".join(parts) or "its inputs changed"
    for step in recorded:
        if step not in now:
            out[step] = "it is no longer in dvc.yaml (its entry goes at the next rerun)"
    return out


def _few(names: list[str], n: int = 3) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def paper_of(step: str, pipeline: Pipeline | None = None) -> str:
    """The paper a step belongs to: a DDP fit's named one, else the first paper whose configs or folder the stage's
    deps name."""
    if step.startswith("ddp:"):
        return step[4:].split("/")[0]
    for dep in (pipeline.deps.get(step, ()) if pipeline else ()):
        parts = dep.split("/")
        if parts[0] in ("configs", "papers", "checkpoints") and len(parts) > 1:
            return parts[1]
    return "other"


def status_lines(summary: dict, stale: dict[str, str], pipeline: Pipeline) -> list[str]:
    """`repro rehearse --status`: one line per paper (its steps, how many are stale), then one per stale step."""
    steps = step_names(pipeline)
    papers: dict[str, list[str]] = {}
    for s in steps:
        papers.setdefault(paper_of(s, pipeline), []).append(s)
    commit = summary.get("commit", "")[:7] or "an unrecorded commit"
    lines = [f"last full rehearsal: commit {commit}, {summary.get('steps', 0)} steps in {summary.get('minutes', 0)} "
             f"min on {summary.get('machine', 'an unrecorded machine')}"
             + (f"; {len(summary['reruns'])} rerun(s) merged since" if summary.get("reruns") else "")]
    for paper, names in papers.items():
        n = sum(s in stale for s in names)
        lines.append(f"{paper}: {n} of {len(names)} steps stale" if n else f"{paper}: {len(names)} steps current")
    lines += [f"  {s}: {stale[s]}" for s in steps if s in stale]
    lines += [f"  {s}: {why}" for s, why in stale.items() if s not in steps]
    if stale:
        lines.append(f"`repro rehearse --stale` reruns the {len(stale)} stale step(s) with the stages upstream of "
                     f"them and merges them into {SUMMARY}")
    return lines


def merge(summary: dict, rerun: list[dict], *, now: dict[str, dict[str, str]], record: dict) -> dict:
    """The summary with the entries of the steps in `rerun` replaced (or added, in the full rehearsal's order) and
    the steps no longer in the pipeline dropped; `now`: every step's inputs at this rerun; `record`: this rerun's own
    facts (commit, command, minutes, machine), appended to `reruns`."""
    by_name = {s["stage"]: s for s in summary.get("stages", [])}
    by_name.update({e["stage"]: e for e in rerun})
    stages = [by_name[s] for s in now if s in by_name]
    files = dict(summary.get("files", {}))
    for entry in rerun:
        files.update(now.get(entry["stage"], {}))
    used = {f for s in stages for f in s.get("inputs", [])}
    failed = [s["stage"] for s in stages if s["exit"]]
    return {**summary, "stages": stages, "steps": len(stages), "failed": failed,
            "peak_rss_mb": max((s.get("peak_rss_mb", 0) for s in stages), default=0),
            "files": {f: d for f, d in sorted(files.items()) if f in used},
            "reruns": [*summary.get("reruns", []), {**record, "steps": [e["stage"] for e in rerun]}]}


def current_state(root: Path) -> tuple[dict, dict[str, str], Pipeline]:
    """The committed summary (empty if none), its stale steps with why (`stale_steps`), and the pipeline under the
    rehearsal's parameters."""
    path = root / SUMMARY
    summary = json.loads(path.read_text()) if path.is_file() else {}
    pipeline = read_pipeline(root, merged_params(root))
    return summary, stale_steps(summary, step_inputs(root, pipeline)), pipeline


def readme_block(root: Path = Path()) -> str:
    """The README's `rehearsal` block: the last full rehearsal (its commit, machine, steps, minutes, largest process),
    the reruns merged since, the steps stale now by paper, and the disk a full rehearsal needs
    (`repro.ops.docs.disk_sentence`); wrapped at 116 columns."""
    summary, stale, pipeline = current_state(root)
    if not summary:
        text = (f"No rehearsal is recorded ({SUMMARY.as_posix()} is missing): run `repro rehearse --keep-going` and "
                "commit its summary.")
        return textwrap.fill(text, 116, break_on_hyphens=False)
    reruns = summary.get("reruns", [])
    failed = summary.get("failed", [])
    text = (f"The last full rehearsal ran commit {summary['commit'][:7]} on {summary['machine']}: "
            f"{summary['steps']} steps in {summary['minutes']} min, {len(failed)} failed"
            f"{' (' + ', '.join(failed) + ')' if failed else ''}, the largest process at "
            f"{summary['peak_rss_mb'] / 1024:.1f} GiB.")
    if reruns:
        text += (f" Since then {len(reruns)} rerun(s) of stale steps merged ({sum(len(r['steps']) for r in reruns)} "
                 f"steps; the last at commit {reruns[-1]['commit'][:7]}).")
    if stale:
        by_paper: dict[str, list[str]] = {}
        for step in stale:
            by_paper.setdefault(paper_of(step, pipeline), []).append(f"`{step}`")
        # named one by one while they are few; counted by paper beyond (the front page stays a page)
        shown = [f"{p}: {', '.join(n)}" if len(stale) <= NAMED_STALE else f"{p} {len(n)}"
                 for p, n in by_paper.items()]
        text += (f" Stale now ({len(stale)}, `repro rehearse --status` says which and why, `repro rehearse --stale` "
                 f"reruns them): " + "; ".join(shown) + ".")
    else:
        text += " No step is stale: every one ran today's inputs."
    return "\n\n".join(textwrap.fill(t, 116, break_on_hyphens=False) for t in (text, disk_sentence(summary)))


BLOCKS = {"rehearsal": readme_block}


def head_commit(root: Path) -> str:
    """The commit the checkout stands on, with `+changes` when its tracked files differ from it."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine() -> str:
    """The CPU's model, the instruction sets of `repro.tracking.SPEED_FLAGS` it has, its cores and the memory, e.g.
    "Intel(R) Xeon(R) Platinum 8488C (avx2, avx512f, avx512_bf16, amx_tile, amx_bf16), 2 cores, 24 GiB memory";
    without importing torch (the rehearsal's parent stays without)."""
    name, flags = cpu_flags()
    has = [f for f in SPEED_FLAGS if f in flags]
    isa = f" ({', '.join(has)})" if has else ""
    try:
        memory = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB memory"
    except (ValueError, OSError, AttributeError):
        memory = ""
    return f"{name or 'unknown CPU'}{isa}, {os.cpu_count()} cores{memory}"
