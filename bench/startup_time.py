"""Start-up time of the CLI (issue 10, item 6): goals `planner --help` and `planner presets` under
0.3 s, `planner estimate` (default example) under 0.6 s wall.

    python bench/startup_time.py [--repeat 7]

Runs each command in a fresh interpreter `repeat` times and prints the best and median wall time
and the best user+system CPU time (on a shared, loaded machine the CPU time is the steadier
number; the best wall time is the one to compare with the goal). Then the ten slowest imports of
`planner estimate` from `python -X importtime`.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {"planner --help": (["--help"], 0.3), "planner presets": (["presets"], 0.3),
            "planner estimate": (["estimate"], 0.6)}


def timed(args: list[str]) -> tuple[float, float]:
    before = os.times()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "planner.cli", *args], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return wall, cpu


def slowest_imports(args: list[str], n: int = 10) -> list[tuple[int, str]]:
    err = subprocess.run([sys.executable, "-X", "importtime", "-m", "planner.cli", *args],
                         capture_output=True, text=True, check=True).stderr
    rows = []
    for line in err.splitlines():
        if line.startswith("import time:") and "|" in line:
            _, cumulative, name = line.split("|")
            if cumulative.strip().isdigit():
                rows.append((int(cumulative), name.rstrip()))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    repeat = parser.parse_args().repeat
    print(f"{'command':20} {'best wall s':>12} {'median wall s':>14} {'best cpu s':>11} {'goal s':>7}")
    for label, (args, goal) in COMMANDS.items():
        runs = [timed(args) for _ in range(repeat)]
        walls = [w for w, _ in runs]
        print(f"{label:20} {min(walls):12.3f} {statistics.median(walls):14.3f} "
              f"{min(c for _, c in runs):11.3f} {goal:7.1f}")
    print("\nslowest imports of `planner estimate` (cumulative microseconds):")
    for micro_s, name in slowest_imports(["estimate"]):
        print(f"  {micro_s:9,d} {name}")


if __name__ == "__main__":
    main()
