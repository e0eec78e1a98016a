#!/usr/bin/env python3
"""Every conformance document evaluated on a backend (the device) and on the kernel simulator
(cuda-sim), compared cell by cell: the same kernels, so the values (and gradients) must agree to
the rounding of the device's math library (exp, log, tanh: a few ulps) — a larger difference is
a defect of the device code or of the simulator, and is reported with its cell.

Used by scripts/gpu_check.sh; `--backend cuda-sim` compares the simulator with itself (a check of
this script)."""

import argparse
import glob
import json
import math
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor


def evaluate(binary, doc_path, backend, precision, extra):
    cmd = [binary, "eval", doc_path, "--backend", backend]
    if precision and "--precision" not in extra:
        cmd += ["--precision", precision]
    cmd += [a for a in extra if a != "--backend"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"error": {"kind": "no-json", "message": (p.stdout + p.stderr)[-400:]}}


def cells(x, path, out):
    """Every number of an answer, keyed by its path."""
    if isinstance(x, dict):
        for k in sorted(x):
            cells(x[k], path + "." + k, out)
    elif isinstance(x, list):
        for i, y in enumerate(x):
            cells(y, "%s[%d]" % (path, i), out)
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        out[path] = float(x)
    elif isinstance(x, str):
        out[path] = x
    return out


def close(a, b, precision):
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    rel = {"f16": 4e-3, "bf16": 2e-2, "f64": 1e-12}.get(precision, 3e-6)
    return abs(a - b) <= rel * max(1.0, abs(a), abs(b))


def compare(args, case_id, doc_path, extra, precision):
    """One document in one precision, on the device and on the simulator."""
    device = evaluate(args.bin, doc_path, args.backend, precision, extra)
    sim = evaluate(args.bin, doc_path, "cuda-sim", precision, extra)
    a, b = cells(device, "", {}), cells(sim, "", {})
    bad = [k for k in sorted(set(a) | set(b)) if k not in a or k not in b
           or not close(a[k], b[k], precision or "f32")]
    return {"case": case_id, "precision": precision or "default", "cells": len(a),
            "ok": not bad, "first_differences": [(k, a.get(k), b.get(k)) for k in bad[:5]]}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--cases", required=True)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--report", required=True)
    ap.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1),
                    help="documents compared at once (default: up to 8)")
    args = ap.parse_args()
    files = sorted(glob.glob(os.path.join(args.cases, "*.json")))
    with tempfile.TemporaryDirectory() as tmp:
        tasks = []
        for f in files:
            case = json.load(open(f))
            if case.get("command") != "eval":
                continue
            doc_path = os.path.join(tmp, os.path.basename(f))
            with open(doc_path, "w") as out:
                if "doc_text" in case:
                    out.write(case["doc_text"])
                else:
                    json.dump(case["doc"], out)
            extra = list(case.get("cli_args", []))
            if "--backend" in extra:
                continue
            tasks += [(case["id"], doc_path, extra, p) for p in (None, "f64")]
        # Each document is its own pair of processes: they run side by side.
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            results = list(pool.map(lambda t: compare(args, *t), tasks))
    failures = 0
    for r in results:
        failures += not r["ok"]
        if not r["ok"]:
            print("MISMATCH %s (%s): %s" % (r["case"], r["precision"], r["first_differences"]))
    with open(args.report, "w") as out:
        json.dump({"backend": args.backend, "results": results}, out, indent=1)
    compared = sum(r["cells"] for r in results)
    print("%d documents × precisions, %d cells compared, %d mismatching"
          % (len(results), compared, failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
