"""Regenerate `tests/parity/settings.json`, the authors' training and evaluation settings, from their checkouts:
`python tests/parity/make_settings.py --transformer-xl CHECKOUT --lamemo CHECKOUT --mgk CHECKOUT
--infinite-former CHECKOUT --nystromformer CHECKOUT`.

The paper configs (`configs/<paper>/paper/`) claim the authors' exact settings; `test_settings_parity.py` holds
them to it. What the authors' runs use is spread over two places: the commands they released and the defaults of
the programs those commands call, for every flag a command leaves out (`--clip 0.25`, `--scheduler cosine`,
`--eval-interval 4000`, ...). The commands read here:
- Transformer-XL and LaMemo: `pytorch/run_*.sh` (`train`, `eval` branches);
- MGK: `language-modeling/lmtool-fwms/README.md` and `src/script.sh` (one command per line), and the Retrieval
  commands in the code blocks of `lra/README.md`;
- the ∞-former: `sorting/run_sort_inftyformer.sh` and the GPT-2 commands of its README; for the dialogue, which has
  no released command, the defaults of `document_grounded_generation/train.py` and `eval.py`;
- Nyströmformer's `LRA/code/lra_config.py` (a dict literal), the task settings of the LRA pipeline MGK's code reuses.

All is read as text, without running any of their code: commands with `shlex`, programs with `ast` (every
`*.add_argument(...)` call: its flags, `default`, `type`, `action`; the dataclass fields of a program that parses
with `HfArgumentParser`, with the Trainer's `TrainingArguments`; simple module-level constants such as
Transformer-XL's `eval_batch_size = 10`). Flags are typed as argparse would type them; what a script forwards
(`${@:2}`) is left out.

Output: per source, the checkout's commit, each program's defaults and module-level constants, and per script and
command (`train`, `eval`; MGK's script: its `--job_name`, else its `--work_dir`'s name; a README: the line of text
above its code block) the program and the flags it sets. Flags the program does not define go under "undefined"
(argparse would refuse them); flags that a README block leaves after the end of its command (a missing `\\`) go
under "detached". A command's settings are its program's defaults updated by its flags (`theirs()` in the test).
Plain JSON: settings are data, none of their code.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.parity.common import HERE, checkout_commit

OUT = HERE / "settings.json"


def _dataclass_fields(tree: ast.Module, defaults: dict, flags: set[str]) -> None:
    """The fields of every class of a module, as `HfArgumentParser` turns dataclasses into flags: a bool field is a
    flag (`--do_train` alone sets it), any other takes a value typed by its annotation."""
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)) or node.value is None:
                continue
            value = node.value
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
                kw = {k.arg: k.value for k in value.keywords}
                value = kw.get("default", ast.Constant(None))  # required, or a default_factory: no literal
            try:
                value = ast.literal_eval(value)
            except ValueError:
                continue
            annotation = ast.unparse(node.annotation)
            if "bool" in annotation:
                flags.add(node.target.id)
                defaults[node.target.id] = bool(value)
            else:
                typ = next((t for t in ("int", "float") if t in annotation), None)
                defaults[node.target.id] = (value, typ)


def program_defaults(path: Path, dataclass_files: tuple[Path, ...] = ()) -> tuple[dict, dict, set[str]]:
    """(defaults by argparse dest, module-level literal constants, store_true dests) of a Python program. A program
    that parses its flags with `HfArgumentParser` gets the fields of its own dataclasses and of `dataclass_files`
    (the Trainer's `TrainingArguments`)."""
    source = path.read_text()
    tree = ast.parse(source)
    defaults, flags = {}, set()
    if "HfArgumentParser" in source:
        for f in (path, *dataclass_files):
            _dataclass_fields(ast.parse(f.read_text()), defaults, flags)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument" and node.args and isinstance(node.args[0], ast.Constant)):
            continue
        name = node.args[0].value
        if not isinstance(name, str) or not name.startswith("--"):
            continue
        kw = {k.arg: k.value for k in node.keywords}
        dest = ast.literal_eval(kw["dest"]) if "dest" in kw else name[2:].replace("-", "_")
        action = ast.literal_eval(kw["action"]) if "action" in kw else None
        if action == "store_true":
            flags.add(dest)
            defaults[dest] = False
            continue
        value = None
        if "default" in kw:
            try:
                value = ast.literal_eval(kw["default"])
            except ValueError:  # an expression (e.g. a call): not a setting a script could override by value
                continue
        typ = kw.get("type")
        defaults[dest] = (value, typ.id if isinstance(typ, ast.Name) else None)
    constants = {}
    for node in tree.body:  # module level only
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                pass
    resolved = {k: (v if k in flags else v[0]) for k, v in defaults.items()}
    types = {k: v[1] for k, v in defaults.items() if k not in flags}
    return resolved, {"types": types, "constants": constants}, flags


def _typed(value: str, typ: str | None):
    """As argparse types a flag's value: `type=bool` makes any non-empty string True ("False" included)."""
    return {"int": int, "float": float, "bool": bool}.get(typ, str)(value)


def parse_command(tokens: list[str], program: Path, dataclass_files: tuple[Path, ...] = ()) -> dict:
    """The flags of one `python PROGRAM FLAGS…` command, typed as PROGRAM's argparse would type them. A flag that
    PROGRAM does not define goes to "undefined" (argparse would refuse the command), with its value if one follows."""
    resolved, info, flags = program_defaults(program, dataclass_files)
    explicit, undefined = {}, {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            continue  # ${@:2}: what the caller forwards
        name, eq, inline = tok[2:].partition("=")
        dest = name.replace("-", "_")
        if dest in flags and not eq:
            explicit[dest] = True
            continue
        if dest in flags:  # `--flag=True` (HfArgumentParser's bool fields)
            explicit[dest] = inline.lower() in ("true", "1", "yes")
            continue
        has_value = bool(eq) or (i < len(tokens) and not tokens[i].startswith("--"))
        value = inline if eq else (tokens[i] if has_value else True)
        if has_value and not eq:
            i += 1
        if dest not in resolved:
            undefined[dest] = value
            continue
        # a valued flag without its value (a README's last `--work_dir `) is kept as None: argparse would refuse it
        explicit[dest] = _typed(value, info["types"].get(dest)) if has_value else None
    return {"program": program.name, "explicit": explicit, **({"undefined": undefined} if undefined else {})}


def _commands(text: str, *, markdown: bool = False) -> list[tuple[str | None, list[str], list[str]]]:
    """(key, tokens from the python program on, detached tokens) of every `python … X.py …` command of a shell
    script: the key is the `$1` value of the `if`/`elif [[ $1 == 'NAME' ]]` that contains it. In a README
    (`markdown`) the commands stand in code blocks and the key is the line of text above the block; flags on lines
    of the same block after the command ended (a missing `\\`) are its detached tokens: a shell would not pass them."""
    text = text.replace("\\\n", " ")
    out, branch = [], None
    for line in text.splitlines():
        m = re.search(r"\$1\s*==\s*'(\w+)'", line)
        if m:
            branch = m.group(1)
            continue
        if ".py" not in line or "python" not in line:
            if markdown and line.strip().startswith("--") and out:
                out[-1][2].extend(shlex.split(line))
            elif markdown and line.strip() and not line.startswith("```"):
                branch = line.strip().lstrip("#").strip()
            continue
        tokens = shlex.split(line, comments=not markdown)
        at = next(i for i, t in enumerate(tokens) if t.endswith(".py"))
        out.append((branch, [tokens[at], *tokens[at + 1:]], []))
    return out


def script_settings(script: Path, program_dir: Path, programs: dict, dataclass_files: tuple[Path, ...] = ()) -> dict:
    """{command key: {"program", "explicit"}} of one script; `programs` collects each program's defaults. A program
    is found at its path from `program_dir` (`./finetune_gpt2/…/run_clm.py`), else by its name there."""
    out = {}
    for branch, tokens, detached in _commands(script.read_text(), markdown=script.suffix == ".md"):
        program = program_dir / tokens[0]
        if not program.exists():
            program = program_dir / Path(tokens[0]).name
        if program.name not in programs:
            resolved, info, _ = program_defaults(program, dataclass_files)
            programs[program.name] = {"defaults": resolved, "constants": info["constants"]}
        cmd = parse_command(tokens[1:], program, dataclass_files)
        if detached:
            cmd["detached"] = parse_command(detached, program, dataclass_files)["explicit"]
        key = branch or cmd["explicit"].get("job_name") or Path(str(cmd["explicit"].get("work_dir", "command"))).name
        if key in out:
            if out[key]["explicit"] == cmd["explicit"]:
                continue  # MGK's script repeats some commands verbatim
            key = f"{key}#{sum(k.split('#')[0] == key for k in out) + 1}"
        out[key] = cmd
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--transformer-xl", type=Path, required=True, help="checkout of kimiyoung/transformer-xl")
    ap.add_argument("--lamemo", type=Path, required=True, help="checkout of thu-coai/LaMemo")
    ap.add_argument("--mgk", type=Path, required=True, help="checkout of minhtannguyen/transformer-mgk")
    ap.add_argument("--infinite-former", type=Path, required=True, help="checkout of deep-spin/infinite-former")
    ap.add_argument("--nystromformer", type=Path, required=True,
                    help="checkout of mlpen/Nystromformer (LRA/code/lra_config.py, which MGK's LRA configs cite)")
    args = ap.parse_args(argv)
    sources = {
        "transformer_xl": ("kimiyoung/transformer-xl", args.transformer_xl, "pytorch", "run_*.sh"),
        "lamemo": ("thu-coai/LaMemo", args.lamemo, "pytorch", "run_*.sh"),
        "mgk": ("minhtannguyen/transformer-mgk", args.mgk, "language-modeling/lmtool-fwms/src", "script.sh"),
        "infinity_former": ("deep-spin/infinite-former", args.infinite_former, "sorting", "run_*.sh"),
        "mgk_lra": ("minhtannguyen/transformer-mgk", args.mgk, "lra", "README.md"),
        # the WikiText-103 commands of the language-modelling README (training and sliding-window evaluation)
        "mgk_lm_readme": ("minhtannguyen/transformer-mgk", args.mgk, "language-modeling/lmtool-fwms", "README.md"),
        # Table 1's GPT-2 commands (the repository's README; run_clm.py parses its flags with HfArgumentParser)
        "infinity_former_gpt2": ("deep-spin/infinite-former", args.infinite_former, ".", "README.md"),
        # Table 2's dialogue: no command was released, the program's defaults alone
        "infinity_former_dialogue": ("deep-spin/infinite-former", args.infinite_former, "document_grounded_generation",
                                     ("train.py", "eval.py")),
    }
    trainer_args = args.infinite_former / "finetune_gpt2" / "src" / "transformers" / "training_args.py"
    dataclass_files = {"infinity_former_gpt2": (trainer_args,)}
    result = {}
    for paper, (repo, checkout, folder, pattern) in sources.items():
        scripts = ([checkout / folder / name for name in pattern if (checkout / folder / name).exists()]
                   if isinstance(pattern, tuple) else sorted((checkout / folder).glob(pattern)))
        if not scripts:
            raise SystemExit(f"{checkout / folder}: no {pattern}; is {checkout} a checkout of {repo}?")
        programs: dict = {}
        if isinstance(pattern, tuple):  # programs without a released command: their defaults
            for program in scripts:
                resolved, info, _ = program_defaults(program)
                programs[program.name] = {"defaults": resolved, "constants": info["constants"]}
            scripts = []
        result[paper] = {"repo": repo, "commit": checkout_commit(checkout),
                         "scripts": {s.stem: script_settings(s, checkout / folder, programs,
                                                             dataclass_files.get(paper, ()))
                                     for s in scripts},
                         "programs": programs}
    # the LRA settings by task of Nyströmformer's code, which MGK's LRA pipeline comes from (a dict literal)
    lra_config = args.nystromformer / "LRA" / "code" / "lra_config.py"
    if not lra_config.exists():
        raise SystemExit(f"{lra_config}: missing; is {args.nystromformer} a checkout of mlpen/Nystromformer?")
    assign = next(n for n in ast.parse(lra_config.read_text()).body if isinstance(n, ast.Assign))
    tasks = ast.literal_eval(assign.value)
    result["nystromformer_lra"] = {"repo": "mlpen/Nystromformer", "commit": checkout_commit(args.nystromformer),
                                   "config": {k: {part: v[part] for part in ("dataset", "model", "training")
                                                  if part in v}
                                              for k, v in tasks.items()}}
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    tmp.replace(OUT)
    n = sum(len(c) for p in result.values() for c in p.get("scripts", {}).values())
    print(f"{OUT}: {n} commands of {sum(len(p.get('scripts', {})) for p in result.values())} scripts")


if __name__ == "__main__":
    main()
