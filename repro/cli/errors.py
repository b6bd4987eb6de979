"""Errors of `repro` in one line (`repro.cli.cli.main` and `repro.cli.entry` print them, with the fix): a
jsonargparse error without its namespace dump, an unknown option with the nearest known one (`--model.n_layers`:
did you mean `--model.init_args.n_layer`?), and, where jsonargparse says only that a value fits none of a Union's
types, the reason one of them gave.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import re
import typing
from typing import Any


def _did_you_mean(class_path: str, key: str) -> str:
    """The known key nearest to an unknown `key` (`model.n_layers` → `model.n_layer`) of the class `class_path`
    (the constructor's parameters, then a dataclass parameter's fields), or ''."""
    try:
        module, name = class_path.rsplit(".", 1)
        obj: Any = getattr(importlib.import_module(module), name)
        parts = key.split(".")
        for i, part in enumerate(parts):
            if dataclasses.is_dataclass(obj):
                known = {f.name: f.type for f in dataclasses.fields(obj)}
                hints = typing.get_type_hints(obj)
            else:
                known = dict(inspect.signature(obj).parameters)
                hints = typing.get_type_hints(obj.__init__)
            if part not in known:
                close = difflib.get_close_matches(part, list(known), n=1)
                return ".".join([*parts[:i], close[0]]) if close else ""
            nxt = hints.get(part)
            options = [t for t in typing.get_args(nxt) if dataclasses.is_dataclass(t)] or [nxt]
            obj = options[0]
    except Exception:  # a suggestion is a courtesy: never let it hide the error itself
        return ""
    return ""


def one_line(message: str) -> str:
    """A jsonargparse error in one line: the inner message of a nested (Union) error, without the namespace dump;
    an unknown key with a suggestion."""
    text = str(message)
    unknown = re.search(r"class_path '([\w.]+)':\s*unrecognized arguments: --([\w.]+)", text)
    # a misspelt key in a config file: "Group 'model' does not accept option 'n_layers'" or "Option 'memry.mem_len'
    # is not accepted" under the class's "Problem with given class_path"
    in_file = re.search(r"class_path '([\w.]+)':\s*(?:Group '([\w.]+)' does not accept option '(\w+)'|"
                        r"Option '([\w.]+)' is not accepted)", text)
    if unknown or in_file:
        cls, key = unknown.groups() if unknown else (
            in_file.group(1), in_file.group(4) or f"{in_file.group(2)}.{in_file.group(3)}")
        outer = re.search(r'Parser key "([\w.]+)"', text)
        full = f"{outer.group(1)}.init_args.{key}" if outer else key
        near = _did_you_mean(cls, key)
        hint = f" (did you mean --{full[: len(full) - len(key)]}{near}?)" if near else ""
        return f"unknown option --{full} for {cls.rsplit('.', 1)[-1]}{hint}"
    # the trainer's or run's misspelt key: on the command line, in a config file, or in one a command builds
    unknown = (re.search(r"(?:unrecognized arguments: --|does not accept option '|Option ')"
                         r"(trainer|run)\.([\w.]+)", text)
               or re.search(r"Group '(trainer|run)' does not accept option '([\w.]+)'", text))
    if unknown:
        group, key = unknown.groups()
        if group == "trainer":
            from lightning.pytorch import Trainer  # heavy: Lightning

            known = list(inspect.signature(Trainer).parameters)
        else:
            known = ["paper", "experiment", "profile", "record", "checkpoint", "select", "curves", "tracking",
                     "last_every_steps", "last_every_minutes", "resume", "untrained", "dry_run"]
        near = difflib.get_close_matches(key, known, n=1)
        return f"unknown option --{group}.{key}" + (f" (did you mean --{group}.{near[0]}?)" if near else "")
    literal = re.search(r'Parser key "([\w.]+)":\s*Expected a typing.Literal\[(.*?)\]\. Got value: (.*)', text)
    if literal:
        return f"--{literal.group(1)} is one of {literal.group(2)}, got {literal.group(3).strip()!r}"
    if "Does not validate against any of the Union subtypes" in text:
        inner = [m.strip()[2:] for m in text.splitlines() if m.strip().startswith("- ")
                 and "Expected a <class 'NoneType'>" not in m]
        key = re.search(r'Parser key "([\w.]+)"', text)
        if inner:
            reason = re.search(r"Problem with given class_path '[\w.]+':\s*\n\s*(.+)", text)  # its first line
            return (f"{key.group(1)}: " if key else "") + inner[0] + (f" {reason.group(1).strip()}" if reason else "")
    lines = [l.strip() for l in text.splitlines()
             if l.strip() and not l.strip().startswith(("Given value", "Subtypes"))]
    out = " ".join(lines)
    out = re.sub(r'^Parser key "([\w.]+)":\s*', r"--\1: ", out)
    return out[:400]



def error_line(err: BaseException) -> str:
    """The error in one line (`one_line`). Where jsonargparse says only that a value fits none of a Union's types,
    the reason one of them gave (a settings class's own check, e.g. `ltm.n_basis must be positive`), found down
    the chain of causes."""
    union = "Does not validate against any of the Union subtypes"
    line = one_line(str(err))
    cause, seen = err, set()
    while union in line and cause.__cause__ is not None and id(cause) not in seen:
        seen.add(id(cause))
        cause = cause.__cause__
        if union not in str(cause):
            return one_line(str(cause))
    return line
