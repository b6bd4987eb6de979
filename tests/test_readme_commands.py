"""Every `repro` command line in README.md and papers/*/README.md works as written (the README's multi-GPU
command exited at once, and nothing had run it since the option that broke it landed).

The commands are read from the code blocks (fenced, or indented by four spaces), a line ending in `\\` continued on
the next, `# …` comments dropped, globs of paths expanded from the repository root. Each goes through the real entry
point (`repro.cli.entry.main`), in this process:

- `fit`, `validate`, `test` as a dry run (`--run.dry_run true`): the config parsed and the model (meta device),
  data module and Trainer built, then stopped — the multi-GPU command included, on this CPU-only machine;
- `steps`: each quoted step so;
- every other command up to its argument parser: `argparse.ArgumentParser.parse_args` parses, then stops the command
  before it does anything. Every `.yaml` its arguments name must exist; `repro runs` also resolves its specs to
  configs, and `mirror --exec 'repro …'` has its inner command checked the same way.

What the prose writes as placeholders is substituted (`PLACEHOLDERS`) or skipped with the reason (`SKIPPED`); an
optional part in brackets (`[--model gpt2_lm]`) is checked as given."""

from __future__ import annotations

import argparse
import glob
import re
import shlex
from pathlib import Path

import pytest

from repro.cli.entry import main

ROOT = Path(__file__).resolve().parent.parent
READMES = [ROOT / "README.md", *sorted(ROOT.glob("papers/*/README.md")), *sorted(ROOT.glob("docs/*.md"))]

# placeholders of the MGK README's LRA commands: one task of the tiny profile stands for them all
PLACEHOLDERS = {"<profile>": "tiny", "<task>": "listops"}
# commands that cannot be checked as written, by a piece of their text
SKIPPED = {'"fit -c A.yaml --run.checkpoint a.ckpt"': "A.yaml and a.ckpt stand for any config and checkpoint"}


def code_blocks(text: str) -> list[list[tuple[int, str]]]:
    """(line number, line) of each fenced (```) or indented (four spaces, after a blank line) code block."""
    blocks, block, fenced, indented, blank = [], [], False, False, True
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if fenced:
                blocks.append(block)
                block = []
            fenced = not fenced
        elif fenced:
            block.append((number, line))
        elif line.startswith("    ") and (blank or indented):
            indented = True
            block.append((number, line[4:]))
        elif indented and line.strip():  # a blank line inside an indented block continues it
            blocks.append(block)
            block, indented = [], False
        blank = not line.strip()
    if block:
        blocks.append(block)
    return blocks


def readme_commands() -> list[tuple[str, str]]:
    """(file:line, command) of every command line that starts with `repro `, continuations joined."""
    out = []
    for readme in READMES:
        for block in code_blocks(readme.read_text(encoding="utf-8")):
            joined: list[tuple[int, str]] = []
            for number, line in block:
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
                else:
                    joined.append((number, line.strip()))
            out += [(f"{readme.relative_to(ROOT)}:{number}", command) for number, command in joined
                    if command.startswith("repro ")]
    return out


COMMANDS = readme_commands()
TABLES = sorted(ROOT.glob("results/**/*.md"))


def table_instructions() -> list[tuple[str, str]]:
    """(file, command) of every instruction a generated table prints: "run `repro …`" in its notes."""
    return [(str(t.relative_to(ROOT)), m[1]) for t in TABLES
            for m in re.finditer(r"[Rr]un `((?:repro|dvc) [^`]*)`", t.read_text(encoding="utf-8"))]


INSTRUCTIONS = table_instructions()


def arguments(command: str) -> list[str]:
    """The command's arguments (after `repro`) as the shell passes them."""
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    command = re.sub(r"\[(--[^\]]*)\]", r"\1", command)  # an optional part, checked as given
    args = []
    for arg in shlex.split(command, comments=True)[1:]:
        if "*" in arg and "/" in arg:  # a path glob; `--stages 'mgk_*'` is quoted, a stage glob for the command
            found = sorted(glob.glob(arg, root_dir=ROOT))
            assert found, f"{arg} matches no file"
            args += found
        else:
            args.append(arg)
    return args


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def parse_only(args: list[str], monkeypatch) -> argparse.Namespace:
    """`repro ARGS` up to its argument parser: the namespace it parsed (the command itself does not run)."""
    plain = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_intermixed_args")}

    def stopping(name):
        def parse_and_stop(self, *a, **kw):
            raise _Parsed(plain[name](self, *a, **kw))
        return parse_and_stop

    with monkeypatch.context() as m:
        for name in plain:  # `repro profile` parses intermixed (options before or after its stages)
            m.setattr(argparse.ArgumentParser, name, stopping(name))
        with pytest.raises(_Parsed) as parsed:
            main(args)
    return parsed.value.namespace


def check_named_files(namespace: argparse.Namespace, monkeypatch) -> None:
    for value in vars(namespace).values():
        for item in value if isinstance(value, list) else [value]:
            for part in str(item).split(","):  # `bench --compare A.yaml,A.eval.yaml`
                if part.endswith(".yaml"):
                    assert (ROOT / part).is_file(), f"{part} does not exist"
    inner = getattr(namespace, "command", None)  # `mirror run DIR --exec 'repro …'`
    if isinstance(inner, str) and inner.startswith("repro "):
        check_named_files(parse_only(arguments(inner), monkeypatch), monkeypatch)


def dry_run(args: list[str], capsys) -> list[str]:
    main([*args, "--run.dry_run", "true"])
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("dry run:")]


def test_the_readmes_have_commands():
    names = [" ".join(shlex.split(c, comments=True)[:2]) for _, c in COMMANDS]
    assert len(COMMANDS) >= 25 and {"repro fit", "repro test", "repro steps", "repro runs"} <= set(names)
    multi_gpu = "repro fit -c configs/transformer_xl/paper/enwik8_12l.yaml --trainer.devices 4 --trainer.strategy ddp"
    assert any(" ".join(c.split()) == multi_gpu for _, c in COMMANDS)
    for piece in SKIPPED:  # a skip that no longer matches is removed, not kept
        assert any(piece in c for _, c in COMMANDS), piece


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_readme_command(where, command, monkeypatch, capsys):
    skip = next((why for piece, why in SKIPPED.items() if piece in command), None)
    if skip:
        pytest.skip(skip)
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("sys.argv", ["repro"])  # the command is given as arguments, not on pytest's command line
    args = arguments(command)
    if args[0] in ("fit", "validate", "test"):
        lines = dry_run(args, capsys)
        assert len(lines) == 1 and lines[0].startswith(f"dry run: {args[0]} "), lines
        if "--trainer.devices" in args:  # the multi-GPU command: its processes, on a machine without GPUs
            n = args[args.index("--trainer.devices") + 1]
            assert f"×{n}, ddp," in lines[0], lines[0]
    elif args[0] == "steps":
        main(["steps", *(f"{step} --run.dry_run true" for step in args[1:])])
        out = capsys.readouterr().out
        assert out.count("dry run: ") == len(args) - 1, out
    else:
        namespace = parse_only(args, monkeypatch)
        check_named_files(namespace, monkeypatch)
        if args[0] == "runs":
            from repro.cli.runs import runs_steps

            assert runs_steps(namespace.paper, namespace.profile, namespace.group, namespace.specs,
                              tests=namespace.tests)


def test_the_tables_print_instructions():
    assert any(c == "repro profile paper" for _, c in INSTRUCTIONS)


@pytest.mark.parametrize("where,command", INSTRUCTIONS, ids=[f"{w}:{c}" for w, c in INSTRUCTIONS])
def test_table_instruction(where, command, monkeypatch):
    """A table's instruction is a command that works: parsed by its command as given, its files present."""
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr("sys.argv", ["repro"])
    assert command.startswith("repro "), f"{where}: {command!r} is not a `repro` command this test can check"
    check_named_files(parse_only(arguments(command), monkeypatch), monkeypatch)


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """An empty working folder outside the repository, which is then the root (`repo_root`, cached per process)."""
    from repro.tracking import repo_root

    monkeypatch.chdir(tmp_path)
    repo_root.cache_clear()
    yield tmp_path
    repo_root.cache_clear()


def test_a_dry_run_builds_and_stops(elsewhere, monkeypatch, capsys):
    """A user's `--run.dry_run true`: one line, no file written, not even where the fit would save; a command that
    a real run refuses at once is refused here too."""
    monkeypatch.setattr("sys.argv", ["repro"])
    config = str(ROOT / "configs/transformer_xl/paper/wt103_base.yaml")
    lines = dry_run(["fit", "-c", config, "--trainer.devices", "4", "--trainer.strategy", "ddp"], capsys)
    assert lines == ["dry run: fit paper/wt103_base  TransformerXLLM 151.1M parameters  LMDataModule wt103  "
                     "Trainer: cpu ×4, ddp, 32-true, max_steps 200000  "
                     "checkpoint checkpoints/transformer_xl/paper/wt103_base.ckpt  (nothing run)"]
    assert list(elsewhere.iterdir()) == []
    with pytest.raises(SystemExit):
        dry_run(["test", "-c", config], capsys)
    assert "without --ckpt_path would score untrained weights" in capsys.readouterr().err
