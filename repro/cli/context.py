"""`repro recl`: the command of the RECL analysis (`repro.context`, Transformer-XL §4.3 and Appendix C).

The measurement itself — per-token losses against the attention length offered at test time, relative gains and
RECL — is library code in `repro.context`; this module only reads the command line, builds each model of the group
from its config files and checkpoint (`repro.cli.cli.load_module`), and writes the JSON record and the plot.
"""

from __future__ import annotations

import json

from repro.io import atomic_write_json


def main(args) -> None:
    """`repro recl`: measure a group, write the JSON record (and the plot)."""
    from repro.cli.cli import load_module  # heavy: Lightning
    from repro.context import ContextModel, measure, plot  # heavy: Lightning

    models = [ContextModel.parse(m) for m in args.model]
    contexts = [int(x) for x in args.contexts.split(",") if x]
    ratios = [float(x) for x in args.ratios.split(",") if x]
    result = measure(models, contexts, load=load_module, split=args.split, max_tokens=args.max_tokens,
                     ratios=ratios, threshold=args.threshold, stride=args.stride, threads=args.threads,
                     batch_size=args.batch_size, device=args.device)
    if args.output:
        atomic_write_json(args.output, result)
    if args.plot:
        plot(result, args.plot, r=ratios[0])
    summary = {name: {r: ("≥" if v[name]["censored"] else "") + str(v[name]["recl"]) for r, v in result["recl"].items()}
               for name in result["models"]}
    if not args.output:  # no file: the result goes to standard output, as JSON
        print(json.dumps({"recl": summary, "mean_loss": {n: m["mean_loss"] for n, m in result["models"].items()}}))
        return
    rs = list(result["recl"])  # the record is in the file; the terminal gets one line
    print(f"repro recl: RECL at r = {' / '.join(rs)}: "
          + ", ".join(f"{name} {' / '.join(summary[name][r] for r in rs)}" for name in result["models"])
          + f" ({result['tokens']:,} tokens) in {args.output}", flush=True)
