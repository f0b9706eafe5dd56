"""A/B of this checkout against an earlier revision, on one backend, in one run.

Each round runs the anchor case (keras-hub, from this checkout) and the measured case in a
checkout of `--base` and in this one, each in its own process, in an order that rotates from
round to round so that neither side always runs first. The ratio of each side to the anchor
of its round is what is compared: machine drift within a run moves both.

    KERAS_BACKEND=torch python -m benchmarks.ab --base 6776b4c --case generate_xf \
        --anchor generate_hub --rounds 5 --output benchmarks/results/ab.json

The base checkout is a detached `git worktree` under the system's temporary folder, removed
at the end. Prints, per measure, the median ratio of each side with its range over the rounds
and the new/base change of the medians.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import tempfile

from benchmarks.run import ROOT
from benchmarks.run import run_case


def _measures(result):
    return {k: v for k, v in result.items() if isinstance(v, float) and k.endswith("_per_s")}


def _ratios(result, anchor):
    values, anchors = _measures(result), _measures(anchor)
    return {key: values[key] / anchors[key] for key in values if key in anchors}


def run_rounds(base_tree, case, anchor, rounds, backend):
    sides = [("anchor", anchor, ROOT), ("base", case, base_tree), ("new", case, ROOT)]
    records = []
    for index in range(rounds):
        order = sides[index % 3:] + sides[: index % 3]
        record = {}
        for side, name, tree in order:
            record[side] = run_case(name, backend, tree=tree)
        records.append(record)
    return records


def summarise(records):
    summary = {}
    for measure in _ratios(records[0]["new"], records[0]["anchor"]):
        sides = {}
        for side in ("base", "new"):
            ratios = [_ratios(r[side], r["anchor"])[measure] for r in records]
            sides[side] = {"median": statistics.median(ratios), "min": min(ratios),
                           "max": max(ratios), "ratios": ratios}
        sides["change"] = sides["new"]["median"] / sides["base"]["median"] - 1.0
        summary[measure] = sides
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the earlier revision (any git ref)")
    parser.add_argument("--case", default="generate_xf")
    parser.add_argument("--anchor", default="generate_hub")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", help="JSON file for every round's results and the summary")
    args = parser.parse_args()
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    base_tree = pathlib.Path(tempfile.mkdtemp(prefix="keras_xf_ab_")) / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(base_tree), args.base],
                   cwd=ROOT, check=True, capture_output=True)
    try:
        records = run_rounds(base_tree, args.case, args.anchor, args.rounds, backend)
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(base_tree)], cwd=ROOT,
                       check=False, capture_output=True)
    summary = summarise(records)
    print(f"{backend}: {args.case} / {args.anchor}, {args.rounds} rounds, base {args.base}")
    for measure, sides in summary.items():
        line = "  ".join(
            f"{side} {s['median']:.3f} [{s['min']:.3f}, {s['max']:.3f}]"
            for side, s in sides.items() if side != "change"
        )
        print(f"  {measure}: {line}  change {sides['change']:+.1%}")
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(
            {"backend": backend, "base": args.base, "case": args.case, "anchor": args.anchor,
             "rounds": records, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
