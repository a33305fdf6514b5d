"""GB300's compute rate against its fit group (GB200), fitted on the first Megatron-Bridge release
that published GB300 runs and tested on every later one.

    PYTHONPATH=. python bench/fit_gb300_rate.py [--write]

The reference (../shared/reference) has one GB300 run (a Megatron MoE ModelZoo Qwen3-235B row) and
the Megatron-Bridge tables it holds none, so the GB300 preset takes GB200's fit. The held-out Bridge rows (bench/heldout_bridge.py) show the same layouts running 1.2-1.3x faster on
GB300 than on GB200 at equal datasheet FP8/BF16 peaks (Blackwell Ultra: 160 SMs against 148,
1,400 W against 1,200 W, twice the softmax-exponent rate; NVIDIA "Inside NVIDIA Blackwell Ultra").
Which of these sets the rate is not separable from step times, so the preset gets one named
factor, `compute_rate_vs_fit_group`, on its GEMM and attention rates.

Which rows fit it (a temporal split, as if fitted when the first GB300 table appeared):
- every GB300 row of the reference;
- of the held-out Bridge rows, release FIT_RELEASE only; every later release's GB300 rows stay held out and are the test;
- models the reference already runs on GB200 (matched by shape): their GB200 rows are in-sample,
  so what is left on GB300 is the GPU's, not the model's (GPT-OSS and Qwen3-30B-A3B, which the
  reference never ran, are test rows only).
The fit minimises mean |log(predicted/measured)| by golden-section search (planner.fit._golden).
`--write` stores the factor in hardware/presets/accelerators/gb300-288gb.yaml.
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
from pathlib import Path

import heldout_bridge

from planner import fit
from planner.calibration import load_reference
from planner.evidence import model_shape

ACCELERATOR = "GB300-288GB"
FIT_GROUP_ACCELERATOR = "GB200-186GB"
FIT_RELEASE = "25.11"
PRESET = Path(__file__).resolve().parents[1] / "hardware/presets/accelerators/gb300-288gb.yaml"
BOUNDS = (0.8, 1.6)


def heldout_cases() -> list:
    cases, _ = heldout_bridge.read_back(heldout_bridge.records()[0])
    return [c for c in cases if c.system.accelerator.name == ACCELERATOR]


def release_of(case) -> str:
    return case.id.split("_")[1]


def split(cases: list) -> tuple[list, list, list]:
    """(reference GB300 rows, held-out fit rows, held-out test rows) of the held-out GB300 `cases`,
    by the rule in the module docstring."""
    reference, _ = load_reference()
    on_fit_group = {model_shape(c.model) for c in reference if c.system.accelerator.name == FIT_GROUP_ACCELERATOR}
    fit_rows = [c for c in cases if release_of(c) == FIT_RELEASE and model_shape(c.model) in on_fit_group]
    in_reference = [c for c in reference if c.system.accelerator.name == ACCELERATOR]
    return in_reference, fit_rows, [c for c in cases if release_of(c) != FIT_RELEASE]


def errors_at(prepared: list, rate: float) -> list[float]:
    """predicted / measured - 1 of each prepared row (planner.fit.prepare) at this compute rate."""
    return [p.predict_s({"compute_rate_vs_fit_group": rate}) / p.case.measured_step_s - 1 for p in prepared]


def fit_rate(fit_rows: list) -> float:
    prepared = fit.prepare(fit_rows)
    rate, _ = fit._golden(lambda r: statistics.mean(abs(math.log1p(e)) for e in errors_at(prepared, r)),
                          *BOUNDS, 1.0, 30)
    return round(rate, 3)


def write(rate: float) -> None:
    text = PRESET.read_text()
    line = re.search(r"^efficiency: \{(.*)\}$", text, flags=re.M)
    fields = [f for f in line.group(1).split(", ") if not f.startswith("compute_rate_vs_fit_group:")]
    fields.append(f"compute_rate_vs_fit_group: {rate}")
    PRESET.write_text(text.replace(line.group(0), "efficiency: {" + ", ".join(fields) + "}"))
    print(f"wrote {PRESET}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    in_reference, heldout_fit, test_rows = split(heldout_cases())
    rate = fit_rate(in_reference + heldout_fit)
    print(f"{ACCELERATOR} compute_rate_vs_fit_group = {rate}, fitted on {len(in_reference)} reference rows and "
          f"{len(heldout_fit)} held-out rows of release {FIT_RELEASE}: "
          f"{', '.join(c.id for c in in_reference + sorted(heldout_fit, key=lambda c: c.id))}")
    for label, rows in (("fit", in_reference + heldout_fit), ("test", test_rows)):
        prepared = fit.prepare(rows)
        for r in (1.0, rate):
            errs = errors_at(prepared, r)
            print(f"  {label:4s} {len(rows):3d} rows at {r:5.3f}: mean |err| {statistics.mean(map(abs, errs)):6.1%}, "
                  f"mean err {statistics.mean(errs):+6.1%}, max |err| {max(map(abs, errs)):6.1%}")
    if args.write:
        write(rate)


if __name__ == "__main__":
    main()
