"""The checkout's own import graph, read from the source, and the digests that say whether a file changed what it does:
the inputs of a rehearsal stage (`repro.cli.rehearsal_record`).

Follows the standard library's `modulefinder`: imports are read from the syntax tree, never run. Restricted to the
repository's packages (`repro`, `papers`); every `import` and `from … import` of a file counts, at the top or inside a
function, relative ones resolved, `from package import name` as the submodule where `name` is one, importing a module
runs its packages' `__init__.py`, and a string that names a module of the checkout (`importlib.import_module(
"repro.cli.bench")`) counts as an import of it. Differs from one run of the interpreter: it
follows every branch, so the set is what any run of the module may import.

`digest` hashes what a file does, not how it is written: a Python file through its syntax tree without docstrings
(comments, docstrings and layout leave it unchanged), a YAML file through its parsed value (comments and key layout
likewise), any other file byte for byte.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import re
from collections.abc import Iterable
from pathlib import Path

import yaml

PACKAGES = ("repro", "papers")
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MODULE_NAME = re.compile(r"(?:repro|papers)(?:\.\w+)+")


def module_file(root: Path, name: str) -> Path | None:
    """The file of the checkout's module `name` (`repro.cli.runs` → `repro/cli/runs.py`, a package's
    `__init__.py`), or None."""
    if name.split(".")[0] not in PACKAGES:
        return None
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_of(root: Path, dotted: str) -> str | None:
    """The longest prefix of `dotted` that is a module of the checkout (`papers.lamemo.module.LaMemoLM` →
    `papers.lamemo.module`), or None."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if module_file(root, ".".join(parts[:n])) is not None:
            return ".".join(parts[:n])
    return None


def module_name(root: Path, path: Path) -> str:
    """The dotted name of the checkout's file `path` (`repro/cli/runs.py` → `repro.cli.runs`)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(root: Path, path: Path) -> set[str]:
    """The modules of the checkout that the file `path` imports (see the module's docstring)."""
    return set(_imported(root.resolve(), path.resolve(), path.stat().st_mtime_ns))


@functools.lru_cache(maxsize=4096)
def _imported(root: Path, path: Path, mtime_ns: int) -> frozenset[str]:
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    named: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            named.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            named.add(base)
            named.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            named.update(a.value for a in node.args[:1] if isinstance(a, ast.Constant) and isinstance(a.value, str)
                         and MODULE_NAME.fullmatch(a.value))
    found = {m for m in (module_of(root, n) for n in named) if m is not None}
    return frozenset({p for m in found for p in _with_packages(m)} - {name})


def _with_packages(name: str) -> list[str]:
    """`a.b.c` → `a`, `a.b`, `a.b.c`: importing a module runs each package's `__init__.py` above it."""
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def closure(root: Path, modules: Iterable[str], *, shallow: Iterable[str] = (), stop: Iterable[str] = ()
            ) -> set[str]:
    """The files (relative to `root`) of `modules` and of everything they import, transitively; a module of
    `shallow` adds its own file and its packages' but none of its imports (a dispatcher, such as the `repro` command,
    whose branches import every subcommand); a module of `stop` adds nothing."""
    seen: set[str] = set(stop)
    todo = [p for m in modules for p in _with_packages(m)]
    todo += [p for m in shallow for p in _with_packages(m)[:-1]]
    files: set[str] = {str(f.relative_to(root)) for m in shallow if (f := module_file(root, m)) is not None}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(root, name)
        if path is None:
            continue
        files.add(str(path.relative_to(root)))
        todo.extend(imported(root, path) - seen)
    return files


def yaml_value(path: Path):
    """A YAML file's value (cached while the file is unchanged: a rehearsal's steps share their configs)."""
    return _yaml_value(path.resolve(), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=4096)
def _yaml_value(path: Path, mtime_ns: int):
    return yaml.load(path.read_bytes(), Loader=LOADER)


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


def digest(path: Path) -> str:
    """The sha256 of what the file does (see the module's docstring); a file that does not parse is hashed byte for
    byte (its change is then always seen). Cached while the file's size and modification time stay."""
    st = path.stat()
    return _digest(path.resolve(), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8192)
def _digest(path: Path, mtime_ns: int, size: int) -> str:
    data = path.read_bytes()
    try:
        if path.suffix == ".py":
            data = ast.dump(_strip_docstrings(ast.parse(data, filename=str(path)))).encode()
        elif path.suffix in (".yaml", ".yml"):
            data = json.dumps(yaml_value(path), sort_keys=True, default=str).encode()
    except (SyntaxError, ValueError, yaml.YAMLError):
        pass
    return hashlib.sha256(data).hexdigest()
