"""The layout's promises, checked: the shared layer `repro/` imports no paper (`papers/` depend on `repro/`, never
the reverse; each paper adds its commands through `repro.cli.registry`), the command layer `repro.cli` has no
import circle and sits above the library (no library module imports it), and `repro --help` lists the shared
commands, then each paper's under the paper's name. No source file under repro/ or papers/ is over 600
lines (a module does one job).

Floors: every folder of `repro/` (a subpackage, or a module at its top) stands on one floor and imports only folders
on its floor or below, and no two folders import each other, even through others. From the bottom:

1. foundation: `io` (files, checkpoints), `config` (dataclasses from plain dicts), `precision` (bf16 on a CPU);
2. research core: `nn`, `memory`, `metrics`, `data` (corpora, downloads, streams), `text` (tokenizers, documents,
   dialogue; it stands on `data`'s downloads and streams);
3. training and results: `lm` (the LightningModule), `callbacks`, `tracking`, `tables`, `claims`, `context`,
   `generate`, `generate_text`, `weights` (readers and exports of trained models);
4. operations: `ops` (benchmarks, the rehearsal's mirror, generated documentation);
5. commands: `cli`, and `__main__`.

Imports stand at the top of their file, where they are the file's map of what it stands on. One inside a function
says why on its line or the line above: `# heavy: LIBRARY` (slow to import, or bringing one that is: the commands
and modules that do without it start without it), `# optional: LIBRARY` (not one of the project's dependencies), or
`# cycle: A <-> B` (breaks an import circle)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "repro"


def _imports(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import statement of a file (also those inside functions), relative ones resolved."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    package = ".".join(parts[:-1])
    return _imports_of(path.read_text(), package=package, filename=str(path))


def _imports_of(text: str, *, package: str, filename: str = "<probe>") -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(text, filename=filename)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            out += [(base, node.lineno)] + [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return out


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_under_repro_imports_papers():
    offenders = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in sorted(REPRO.rglob("*.py"))
                 for name, line in _imports(p) if name == "papers" or name.startswith("papers.")]
    assert not offenders, "the shared layer must not import a paper:\n" + "\n".join(offenders)


def test_the_check_sees_every_form_of_importing_papers():
    # top level, inside a function, `from papers import x`, and a relative import climbing out of repro/
    for text, package in (("import papers.mgk.lra\n", "repro"), ("def f():\n    from papers.mgk import lra\n", "repro"),
                          ("from papers import mgk\n", "repro.cli"), ("from ..papers import mgk\n", "repro")):
        names = [n for n, _ in _imports_of(text, package=package)]
        assert any(n == "papers" or n.startswith("papers.") for n in names), text


def _string_imports(text: str, filename: str = "<probe>") -> list[tuple[str, int]]:
    """Strings and f-strings that name a module of papers/ (`"papers.mgk.tables"`, `f"papers.{paper}.tables"`):
    what importlib would import, which the import statements above do not show."""
    out = []
    for node in ast.walk(ast.parse(text, filename=filename)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("papers."):
            out.append((node.value, node.lineno))
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith("papers."):
            out.append((f"f-string {node.values[0].value}…", node.lineno))
    return out


def test_no_module_under_repro_names_a_paper_module_in_a_string():
    """A paper reaches the shared layer through entry points (repro.cli.registry), not importlib and a name."""
    offenders = [f"{p.relative_to(ROOT)}:{line} names {name}" for p in sorted(REPRO.rglob("*.py"))
                 for name, line in _string_imports(p.read_text(), str(p))]
    assert not offenders, "the shared layer must not name a paper's module:\n" + "\n".join(offenders)
    probes = ['importlib.import_module(f"papers.{paper}.tables")\n', 'x = "papers.mgk.tables"\n']
    assert all(_string_imports(t) for t in probes)  # the check sees both forms


def _cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """One import circle of `graph` (module → modules it imports), or None."""
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        seen[m] = 1
        for n in graph[m]:
            if seen.get(n) == 1:
                return [*path, m, n]
            if n not in seen and (found := visit(n, [*path, m])):
                return found
        seen[m] = 2
        return None

    for m in graph:
        if m not in seen and (found := visit(m, [])):
            return found
    return None


def test_no_import_circle_in_the_shared_layer():
    """Every import of every module under repro/, those inside functions too (a circle hidden in a function fails
    only when that function runs first in a process)."""
    modules = {_module_name(p): p for p in sorted(REPRO.rglob("*.py"))}

    def module_of(name: str) -> str | None:  # the longest prefix that is one of our modules
        parts = name.split(".")
        return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in modules), None)

    graph = {m: sorted({t for n, _ in _imports(p) if (t := module_of(n)) not in (None, m, "repro")})
             for m, p in modules.items()}
    found = _cycle(graph)
    assert found is None, "import circle: " + " -> ".join(found)
    assert _cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]  # the search finds one


# the floors of the module docstring, from the bottom; a folder imports only folders on its floor or below
FLOORS = (
    ("foundation", ("repro.io", "repro.config", "repro.precision")),
    ("research core", ("repro.nn", "repro.memory", "repro.metrics", "repro.data", "repro.text")),
    ("training and results", ("repro.lm", "repro.callbacks", "repro.tracking", "repro.tables", "repro.claims",
                              "repro.context", "repro.generate", "repro.generate_text", "repro.weights")),
    ("operations", ("repro.ops",)),
    ("commands", ("repro.cli", "repro.__main__")),
)


def _folder(module: str) -> str | None:
    """The folder of a module of repro/: its subpackage (`repro.data.sources` → `repro.data`), or the module itself at
    the top (`repro.lm`); None for `repro` itself (an empty `__init__.py`) and for anything outside repro/."""
    parts = module.split(".")
    if parts[0] != "repro" or len(parts) == 1:
        return None
    return ".".join(parts[:2])


def _folder_edges() -> dict[str, dict[str, list[str]]]:
    """folder → folder it imports → where (`repro/data/sources.py:29`), from every import of every file of repro/."""
    edges: dict[str, dict[str, list[str]]] = {}
    for p in sorted(REPRO.rglob("*.py")):
        src = _folder(_module_name(p))
        if src is None:
            continue
        edges.setdefault(src, {})
        for name, line in _imports(p):
            dst = _folder(name)
            if dst not in (None, src) and (REPRO.joinpath(*dst.split(".")[1:]).is_dir()
                                           or REPRO.joinpath(*dst.split(".")[1:]).with_suffix(".py").is_file()):
                edges[src].setdefault(dst, []).append(f"{p.relative_to(ROOT)}:{line}")
    return edges


def test_no_import_circle_between_the_folders_of_the_shared_layer():
    """The folders of repro/ (its subpackages, and each module at its top) import each other one way: a circle names
    each of its steps with the first import that makes it."""
    edges = _folder_edges()
    found = _cycle({m: sorted(targets) for m, targets in edges.items()})
    circle = [] if found is None else found[found.index(found[-1]):]  # without the path that led to it
    steps = [f"{a} -> {b} ({edges[a][b][0]})" for a, b in zip(circle, circle[1:])]
    assert found is None, "import circle between folders:\n" + "\n".join(steps)


def test_each_folder_imports_only_its_floor_and_below():
    floor_of = {m: i for i, (_, members) in enumerate(FLOORS) for m in members}
    edges = _folder_edges()
    unplaced = sorted(set(edges) - set(floor_of))
    assert not unplaced, f"on no floor: {unplaced}; place each in FLOORS (and in the module docstring, docs/layout.md)"
    gone = sorted(set(floor_of) - set(edges))
    assert not gone, f"no longer under repro/: remove {gone} from FLOORS"
    upward = [f"{a} ({FLOORS[floor_of[a]][0]}) imports {b} ({FLOORS[floor_of[b]][0]}): {', '.join(where)}"
              for a, targets in sorted(edges.items()) for b, where in sorted(targets.items())
              if floor_of[b] > floor_of[a]]
    assert not upward, ("an import reaches a higher floor; move what it uses down to the floor that needs it:\n"
                        + "\n".join(upward))


REASONS = ("# heavy:", "# optional:", "# cycle:")


def _unexplained_imports(text: str) -> list[int]:
    """The lines of the imports inside a function of `text` that carry no reason (`REASONS`) on their first line or
    on the line above."""
    lines = text.splitlines()
    out = []
    for fn in ast.walk(ast.parse(text)):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
                    near = lines[node.lineno - 1] + ("\n" + above if above.startswith("#") else "")
                    if not any(r in near for r in REASONS):
                        out.append(node.lineno)
    return sorted(set(out))


def test_imports_inside_functions_say_why():
    """An import inside a function hides an arrow of the file's map; it is kept only for a heavy or optional library,
    or to break a circle, and says which (see the module docstring)."""
    files = sorted([*REPRO.rglob("*.py"), *(ROOT / "papers").rglob("*.py")])
    offenders = [f"{p.relative_to(ROOT)}:{line}: {p.read_text().splitlines()[line - 1].strip()}"
                 for p in files for line in _unexplained_imports(p.read_text())]
    assert not offenders, ("imports inside functions without a reason; move each to the top of its file, or say why "
                           "(# heavy: LIBRARY, # optional: LIBRARY, # cycle: A <-> B):\n" + "\n".join(offenders))
    probe = ("import os\n\n\ndef f():\n    import json\n    import torch  # heavy: torch\n"
             "    # optional: google_crc32c\n    import google_crc32c\n    import re\n\n\nclass C:\n    def g(self):\n"
             "        from repro import io\n")
    assert _unexplained_imports(probe) == [5, 9, 14]  # methods too; the line above counts where it is a comment


def test_library_modules_do_not_import_the_command_layer():
    offenders = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in sorted(REPRO.rglob("*.py"))
                 if "cli" not in p.relative_to(REPRO).parts[:1] and p.name != "__main__.py"
                 for name, line in _imports(p) if name == "repro.cli" or name.startswith("repro.cli.")]
    assert not offenders, "the library must be importable without the CLI:\n" + "\n".join(offenders)


@pytest.mark.slow
def test_no_import_circle_among_the_cli_modules():
    modules = {_module_name(p): p for p in sorted((REPRO / "cli").glob("*.py"))}
    graph = {m: sorted({n for n, _ in _imports(p) if n in modules and n != m}) for m, p in modules.items()}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        seen[m] = 1
        for n in graph[m]:
            assert seen.get(n) != 1, "import circle: " + " -> ".join([*path, m, n])
            if n not in seen:
                visit(n, [*path, m])
        seen[m] = 2

    for m in graph:
        if m not in seen:
            visit(m, [])
    # and each one imports on its own, in a fresh interpreter, whatever was imported before it
    code = "import importlib, sys\nfor m in sys.argv[1:]:\n    importlib.import_module(m)\n"
    for m in modules:
        done = subprocess.run([sys.executable, "-c", code, m], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{m}: {done.stderr[-800:]}"


MAX_LINES = 600
# files allowed over MAX_LINES, each with its reason; none today (a file that grows past the limit is split along
# its seams, as repro/ops/mirror/, repro/data/lra*.py and repro/cli/{cli,lightning_cli,checkpoints,records}.py were)
LONG_FILES: dict[str, str] = {}


def test_no_source_file_is_over_600_lines():
    files = sorted([*REPRO.rglob("*.py"), *(ROOT / "papers").rglob("*.py")])
    lines = {p.relative_to(ROOT).as_posix(): len(p.read_text(encoding="utf-8").splitlines()) for p in files}
    over = {f: n for f, n in lines.items() if n > MAX_LINES and f not in LONG_FILES}
    assert not over, (f"over {MAX_LINES} lines: " + ", ".join(f"{f} ({n})" for f, n in over.items()) +
                      ": split each along its seams into modules of one job (or list it in LONG_FILES with the reason)")
    stale = [f for f in LONG_FILES if lines.get(f, 0) <= MAX_LINES]
    assert not stale, f"no longer over {MAX_LINES} lines (or gone): remove {stale} from LONG_FILES"


def test_help_lists_the_commands_by_paper():
    done = subprocess.run([sys.executable, "-m", "repro", "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    shared, _, papers = out.partition("commands of the papers")
    assert "shared commands:" in shared and "bench-attention" not in shared and "bench-context" not in shared
    assert "authors" not in shared
    for command in ("fit", "runs", "describe", "bench", "tables", "recl", "generate"):
        assert f"\n    {command} " in shared, command
    # each paper's heading, then its commands, indented under it
    lines = papers.splitlines()
    heading = {line.strip().rstrip(":"): i for i, line in enumerate(lines) if line.startswith("  ") and
               not line.startswith("    ")}
    assert list(heading) == ["arena", "infinity_former", "lamemo", "mgk", "transformer_xl"]
    assert lines[heading["arena"] + 1].split()[0] == "arena-budget"
    assert lines[heading["infinity_former"] + 1].split()[0] == "bench-context"
    assert lines[heading["lamemo"] + 1].split()[0] == "bench-lamemo-authors"
    assert lines[heading["mgk"] + 1].split()[0] == "bench-attention"
    assert lines[heading["transformer_xl"] + 1].split()[0] == "bench-txl-authors"


@pytest.mark.slow
def test_every_registered_command_runs_through_repro(tmp_path):
    from repro.cli.registry import paper_commands

    papers = paper_commands()
    assert {name for cmds in papers.values() for name in cmds} == {"bench-attention", "bench-context",
                                                                   "bench-lamemo-authors", "bench-mgk-authors",
                                                                   "bench-txl-authors", "ltm-gain",
                                                                   "bench-infinity-former-authors", "bench-sdpa",
                                                                   "arena-budget", "released"}
    for cmds in papers.values():
        for name in cmds:
            done = subprocess.run([sys.executable, "-m", "repro", name, "--help"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0 and done.stdout.startswith(f"usage: repro {name}"), done.stderr
