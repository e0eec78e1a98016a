#!/usr/bin/env python3
"""The first W2 training step of a fresh process: rocannl (cold and warm compile cache) beside
JAX, alternated in one session.

rocannl: `examples/first_step.rs` (built first with `cargo build --release --example
first_step`), its `to_first_step_s` (graph, shape inference, compile, parameter initialization,
data, one step). Cold: a fresh `ROCANNL_CACHE_DIR`; warm: the same folder again.
JAX: the anchors' `bench.py --framework jax --workload first-step`, its `t_first_step_s` (trace,
compile and run of the first step; its import and model build are not counted, as rocannl's
process start is not). Without JAX installed, only rocannl's figures are printed.

    python3 scripts/first_step.py [--rounds 5] [--anchors ../shared/anchors/perf]
"""
import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rocannl(cache, extra=()):
    env = dict(os.environ, ROCANNL_CACHE_DIR=cache)
    exe = os.path.join(ROOT, "target", "release", "examples", "first_step")
    out = subprocess.run([exe, *extra], env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def jax(anchors):
    bench = os.path.join(anchors, "bench.py")
    out = subprocess.run([sys.executable, bench, "--framework", "jax", "--workload", "first-step"],
                         check=True, capture_output=True, text=True)
    doc = json.loads(out.stdout)
    rec = doc["results"][0] if "results" in doc else doc
    return rec["t_first_step_s"]


def cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--anchors", default=os.path.join(ROOT, "..", "shared", "anchors", "perf"))
    args = ap.parse_args()
    try:
        import jax as _  # noqa: F401
        have_jax = os.path.exists(os.path.join(args.anchors, "bench.py"))
    except ImportError:
        have_jax = False
    cols = {"cold": [], "warm": [], "cold, no tiers": [], "jax": []}
    steady = []
    for _ in range(args.rounds):
        cache = tempfile.mkdtemp(prefix="rocannl-first-step-")
        try:
            r = rocannl(cache)
            cols["cold"].append(r["to_first_step_s"])
            steady.append(r["step_s"])
            cols["warm"].append(rocannl(cache)["to_first_step_s"])
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        cache = tempfile.mkdtemp(prefix="rocannl-first-step-")
        try:
            cols["cold, no tiers"].append(rocannl(cache, ["--no-tier"])["to_first_step_s"])
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        if have_jax:
            cols["jax"].append(jax(args.anchors))
    print(f"machine: {cpu()}, {os.cpu_count()} CPUs; {args.rounds} alternated rounds")
    jax_med = statistics.median(cols["jax"]) if cols["jax"] else None
    for name, v in cols.items():
        if not v:
            continue
        med = statistics.median(v)
        ratio = f"  ({med / jax_med:.2f}x JAX)" if jax_med and name != "jax" else ""
        print(f"  {name:<15} median {med * 1e3:7.1f} ms  min {min(v) * 1e3:7.1f}  max {max(v) * 1e3:7.1f}{ratio}")
    print(f"  rocannl steady-state step after the swap: median {statistics.median(steady) * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
