"""`repro profile`: `dvc repro` of a profile other than the default, with its own params and lock files.

DVC reads one `params.yaml` and writes one `dvc.lock`, and the stage names are the same in every profile (outputs
differ by `${profile}` in their paths). The default profile (`tiny`) owns `params.yaml` and `dvc.lock`; any other
profile keeps its parameters in `params.<profile>.yaml` and its lock in `dvc.<profile>.lock`, both committed.
`repro profile small [STAGE ...]` swaps them in, runs `dvc repro`, keeps the new lock as `dvc.small.lock` and puts
the default's files back, so that a plain `dvc repro` afterwards sees its own lock (and reruns only the tables,
whose inputs now include the other profile's records). It is the equivalent of DVC's `-S` overrides, which
`dvc repro` lacks, for parameters that are whole lists of experiments.

Safety: one profile run at a time (a lock under `.dvc/tmp/`); the default's files are copied to
`.dvc/tmp/profile-backup/` before the swap and restored at the end, on an error or Ctrl-C; if a run was killed
outright (the backup is still there), the next `repro profile` restores them first and says so. DVC's autostage
(`core.autostage`, on here) stages the lock it writes, which during the swap is the profile's, under `dvc.lock`:
the git index entries of `params.yaml` and `dvc.lock` are put back as they were too, so that a `git commit` after
a profile run never records the profile's files under the default's names.

`repro profile small --commit STAGE …` records the named stages' current dependencies and outputs in the
profile's lock without running them (`dvc commit -f`): for a change that no run reads, such as a new registration
in `configs/<paper>/small/claims.yaml`, which lies in the folder every run stage of the paper depends on.
"""

from __future__ import annotations

import argparse
import fcntl
import shutil
import subprocess
import sys
from contextlib import contextmanager
from fnmatch import fnmatch
from pathlib import Path

from repro.io import atomic_path

FILES = ("params.yaml", "dvc.lock")


def _write(path: Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _backup_dir(root: Path) -> Path:
    return root / ".dvc" / "tmp" / "profile-backup"


def restore(root: Path) -> bool:
    """Put back the default profile's params.yaml and dvc.lock from an interrupted run; True if there was one."""
    backup = _backup_dir(root)
    if not backup.exists():
        return False
    for name in FILES:
        saved = backup / name
        if saved.exists():
            _write(root / name, saved.read_bytes())
        elif (backup / f"{name}.absent").exists():
            (root / name).unlink(missing_ok=True)
    shutil.rmtree(backup)
    return True


def _index_entries(root: Path) -> dict[str, str] | None:
    """`mode,sha,path` of the git index entries of FILES (None outside a git work tree)."""
    try:
        out = subprocess.run(["git", "ls-files", "-s", "--", *FILES], cwd=root, capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    entries = {}
    for line in out.splitlines():
        info, path = line.split("\t", 1)
        mode, sha, _ = info.split()
        entries[path] = f"{mode},{sha},{path}"
    return entries


def _restore_index(root: Path, before: dict[str, str] | None) -> None:
    """Put the index entries of FILES back as `before` (what DVC's autostage changed during the swap)."""
    if before is None:
        return
    after = _index_entries(root) or {}
    for name in FILES:
        if after.get(name) == before.get(name):
            continue
        if name in before:
            subprocess.run(["git", "update-index", "--cacheinfo", before[name]], cwd=root, check=False)
        else:
            subprocess.run(["git", "rm", "-q", "--cached", "--", name], cwd=root, check=False,
                           capture_output=True)


@contextmanager
def swapped(root: Path, profile: str):
    """params.<profile>.yaml and dvc.<profile>.lock in place of the default's for the duration of the block."""
    params = root / f"params.{profile}.yaml"
    if profile == "rehearsal":  # params.rehearsal.yaml is an overlay of params.paper.yaml, not a profile
        raise ValueError("the rehearsal is not a profile of its own: run `repro rehearse` (a scratch copy, the mirror)")
    if not params.exists():
        known = sorted(p.name[len("params."):-len(".yaml")] for p in root.glob("params.*.yaml")
                       if p.name != "params.rehearsal.yaml")
        raise ValueError(f"no params.{profile}.yaml in {root}: profiles with a parameter file: {', '.join(known)}")
    lock_path = root / ".dvc" / "tmp" / "repro-profile.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(
                "another `repro profile` run holds .dvc/tmp/repro-profile.lock; wait for it to end") from None
        if restore(root):
            print("repro profile: restored params.yaml and dvc.lock left swapped by an interrupted run", flush=True)
        index = _index_entries(root)
        backup = _backup_dir(root)
        backup.mkdir(parents=True)
        for name in FILES:
            if (root / name).exists():
                shutil.copy2(root / name, backup / name)
            else:
                (backup / f"{name}.absent").touch()
        own_lock = root / f"dvc.{profile}.lock"
        try:
            _write(root / "params.yaml", params.read_bytes())
            if own_lock.exists():
                _write(root / "dvc.lock", own_lock.read_bytes())
            else:
                (root / "dvc.lock").unlink(missing_ok=True)
            yield
        finally:
            if (root / "dvc.lock").exists():
                _write(own_lock, (root / "dvc.lock").read_bytes())
            restore(root)
            _restore_index(root, index)


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="repro profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("profile", help="a profile with a params.<profile>.yaml (small, paper)")
    ap.add_argument("stages", nargs="*",
                    help="stages to reproduce (default: all), as for `dvc repro`; shell globs such as 'lamemo_*' work")
    ap.add_argument("--force", "-f", action="store_true", help="`dvc repro -f`: rerun even if nothing changed")
    ap.add_argument("--commit", action="store_true",
                    help="record the named stages in the profile's lock without running them (`dvc commit -f`): "
                         "for a change no run reads, e.g. a new registration in claims.yaml")
    args = ap.parse_intermixed_args(argv)  # options before or after the stages
    root = Path.cwd()
    if not (root / "dvc.yaml").exists():
        raise ValueError(f"{root} has no dvc.yaml: run `repro profile` from the repository root")
    if args.commit and (args.force or not args.stages):
        raise ValueError("repro profile --commit records the stages it is given (e.g. 'lamemo_run@*'), never all of "
                         "them, and reruns nothing (no --force)")
    with swapped(root, args.profile):
        if args.commit:  # stage names depend on the profile's params (foreach groups): listed inside the swap
            listed = subprocess.run(["dvc", "stage", "list", "--name-only"], cwd=root, capture_output=True,
                                    text=True, check=True).stdout.split()
            targets = [n for n in listed if any(fnmatch(n, pattern) for pattern in args.stages)]
            if not targets:
                raise ValueError(f"no stage of profile {args.profile} matches {' '.join(args.stages)}")
            cmd = ["dvc", "commit", "-f", "-q", *targets]  # our line below says what happened
        else:
            wild = any(ch in st for st in args.stages for ch in "*?[")
            cmd = ["dvc", "repro", *(["-f"] if args.force else []), *(["--glob"] if wild else []), *args.stages]
        print(f"repro profile {args.profile}: {' '.join(cmd)}", flush=True)
        done = subprocess.run(cmd, cwd=root)
    if done.returncode:
        raise SystemExit(done.returncode)
    if args.commit:
        print(f"repro profile {args.profile}: recorded {len(targets)} stage(s) in dvc.{args.profile}.lock without "
              "running them.", flush=True)
        return
    print(f"repro profile {args.profile}: done; lock kept as dvc.{args.profile}.lock. Run `dvc repro` to rebuild the "
          "tables with this profile's column.", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
