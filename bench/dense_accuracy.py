"""Accuracy of the fitted dense Megatron-stack rows (issue 9: <= 5 % mean, in-sample AND
leave-one-family-out), by source, model family and accelerator.

    PYTHONPATH=. python bench/dense_accuracy.py [--no-lofo] [--worst N] [--json OUT]

In-sample: the hardware parameters fitted on all fitted rows (planner/fit.py `fit_all`, what
bench/calibrate.py writes into the presets, so after `calibrate.py --write` this equals
`planner validate`). LOFO: refitted without the row's model family (`fit.lofo_predictions`).
Only the fitted rows (reference.fits_hardware: dense, Megatron/NeMo/Bridge) enter; they alone
move the hardware fit, so the numbers equal `planner validate --lofo`'s for these rows. About two
minutes on one core (the LOFO refits), seconds with --no-lofo.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from planner import fit
from planner.calibration import load_reference


def source_group(case) -> str:
    """Bridge releases pooled (one recipe set), other sources as the loader names them."""
    return "bridge (dense)" if case.source.startswith("bridge") else case.source


def table(errors: dict[str, float], prepared, key) -> dict[str, dict]:
    groups: dict[str, list[float]] = {}
    for p in prepared:
        groups.setdefault(key(p.case), []).append(abs(errors[p.case.id]))
    groups["all fitted dense"] = [abs(errors[p.case.id]) for p in prepared]
    return {k: {"rows": len(v), "mean": float(np.mean(v)), "max": float(np.max(v))} for k, v in groups.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-lofo", action="store_true")
    ap.add_argument("--worst", type=int, default=12, help="list the N largest in-sample misses")
    ap.add_argument("--json", default=None, help="write rows and tables here")
    args = ap.parse_args()
    cases, _ = load_reference()
    t0 = time.perf_counter()
    prepared = fit.prepare([c for c in cases if c.fit])
    full = fit.fit_all(prepared)
    insample = {p.case.id: p.predict_s(full.get(p.group) or None) / p.case.measured_step_s - 1 for p in prepared}
    lofo = None
    if not args.no_lofo:
        pred = fit.lofo_predictions(prepared, full)
        lofo = {p.case.id: pred[p.case.id] / p.case.measured_step_s - 1 for p in prepared}
    keys = {"source": source_group, "family": lambda c: c.family, "gpu": lambda c: c.system.accelerator.name}
    out = {"fit": full, "tables": {}}
    for name, key in keys.items():
        ins = table(insample, prepared, key)
        lo = table(lofo, prepared, key) if lofo else None
        out["tables"][name] = {"in_sample": ins, "lofo": lo}
        print(f"\nby {name}: rows, in-sample mean / max" + (", LOFO mean / max" if lo else ""))
        for g, s in ins.items():
            extra = f"   {lo[g]['mean']:6.1%} {lo[g]['max']:6.1%}" if lo else ""
            print(f"  {g:28s} {s['rows']:4d}   {s['mean']:6.1%} {s['max']:6.1%}{extra}")
    print(f"\nworst {args.worst} in-sample:")
    for p in sorted(prepared, key=lambda p: -abs(insample[p.case.id]))[:args.worst]:
        lo = f" LOFO {lofo[p.case.id]:+.1%}" if lofo else ""
        print(f"  {insample[p.case.id]:+6.1%}{lo}  {p.case.id}  {p.case.plan.short()}")
    print("\nfit:", {g: {k: round(v, 3) for k, v in prm.items()} for g, prm in full.items()})
    print(f"{time.perf_counter() - t0:.0f} s")
    if args.json:
        out["rows"] = [{"id": p.case.id, "in_sample": insample[p.case.id],
                        "lofo": lofo[p.case.id] if lofo else None} for p in prepared]
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
