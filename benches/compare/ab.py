#!/usr/bin/env python3
"""Alternating A/B runs of two spilljoin command lines.

    python3 benches/compare/ab.py ROUNDS "old::/path/spilljoin-old join ..." "new::/path/spilljoin join ..."

Each round runs both commands back to back, the order alternating from round to
round, and reads the `elapsed: X s` that spilljoin prints. Prints every round, then
per command the median elapsed time, and the median of the rounds' ratios of the
second command over the first (the paired ratio: both runs of a round see the same
machine, which on a VM drifts by more than the change being measured).
"""
import re
import shlex
import statistics
import subprocess
import sys


def elapsed(command: str) -> float:
    run = subprocess.run(shlex.split(command), capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"failed ({run.returncode}): {command}\n{run.stderr}")
    found = re.search(r"elapsed: ([0-9.]+) s", run.stderr)
    if not found:
        sys.exit(f"no elapsed time in the output of: {command}\n{run.stderr}")
    return float(found.group(1))


def main() -> None:
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    rounds = int(sys.argv[1])
    named = [arg.split("::", 1) for arg in sys.argv[2:]]
    if any(len(n) != 2 for n in named):
        sys.exit("each command is NAME::COMMAND")
    times: dict[str, list[float]] = {name: [] for name, _ in named}
    ratios = []
    for r in range(rounds):
        order = named if r % 2 == 0 else named[::-1]
        this = {name: elapsed(command) for name, command in order}
        for name, t in this.items():
            times[name].append(t)
        (a, _), (b, _) = named
        ratios.append(this[b] / this[a])
        print(f"round {r + 1}: " + ", ".join(f"{n} {this[n]:.3f} s" for n, _ in named), flush=True)
    for name, _ in named:
        print(f"{name}: median {statistics.median(times[name]):.3f} s over {rounds} rounds")
    (a, _), (b, _) = named
    print(f"paired {b}/{a}: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
