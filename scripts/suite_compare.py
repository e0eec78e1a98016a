"""Runs the model suite side by side: for each model of benches/suite/models.json, rocannl
(examples/suite.rs), PyTorch eager and torch.compile (scripts/reference/suite.py) and, with
--jax-python, JAX (scripts/reference/suite_jax.py, jitted steps), alternated round by round in
one sitting, so that the machine's drift falls on every side alike.

    python3 scripts/suite_compare.py [--rounds R] [--steps N] [--models a,b] [--out results.json]
        [--torch-python PATH] [--no-compile] [--jax-python PATH] [--device cuda]
        [--suite-bin PATH]

With --device cuda, rocannl runs on its cuda backend and PyTorch on the GPU (JAX is not run).

Prints, per model, the median over rounds of each side's median step time and the ratios
rocannl / other in steps per second (above 1: rocannl is faster), and writes every run's JSON
to --out. Build first: `cargo build --release --example suite`.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def gpu_name():
    out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                         capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def run_json(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="")
    ap.add_argument("--out", default="suite_results.json")
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--jax-python", default=None,
                    help="a Python with jax installed: adds the JAX side (skipped without it)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: rocannl's cuda backend against PyTorch on the GPU")
    ap.add_argument("--suite-bin", default=os.path.join(ROOT, "target", "release", "examples",
                                                        "suite"),
                    help="the built examples/suite.rs")
    a = ap.parse_args()
    suite_bin = a.suite_bin
    on_gpu = a.device == "cuda"
    torch_script = os.path.join(ROOT, "scripts", "reference", "suite.py")
    jax_script = os.path.join(ROOT, "scripts", "reference", "suite_jax.py")
    models = a.models.split(",") if a.models else subprocess.run(
        [suite_bin, "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    sides = {
        "rocannl": lambda m: [suite_bin, "--model", m, "--steps", str(a.steps),
                              "--warmup", str(a.warmup)] + (["--backend", "cuda"] if on_gpu
                                                            else []),
        "torch": lambda m: [a.torch_python, torch_script, "--model", m, "--mode", "eager",
                            "--steps", str(a.steps), "--warmup", str(a.warmup),
                            "--device", a.device],
    }
    if not a.no_compile:
        sides["torch.compile"] = lambda m: [a.torch_python, torch_script, "--model", m,
                                            "--mode", "compile", "--steps", str(a.steps),
                                            "--warmup", str(a.warmup), "--device", a.device]
    if a.jax_python and not on_gpu:
        sides["jax"] = lambda m: [a.jax_python, jax_script, "--model", m, "--steps",
                                  str(a.steps), "--warmup", str(a.warmup)]
    runs = []
    table = []
    for m in models:
        per = {s: [] for s in sides}
        for r in range(a.rounds):
            # Alternate the order from round to round as well.
            order = list(sides) if r % 2 == 0 else list(reversed(list(sides)))
            for s in order:
                rec = run_json(sides[s](m))
                rec.update({"side": s, "round": r})
                runs.append(rec)
                per[s].append(rec)
        med = {s: statistics.median(x["step_s"] for x in per[s]) for s in sides}
        first = {s: statistics.median(x["first_step_s"] for x in per[s]) for s in sides}
        row = {"model": m, "step_s": med, "first_step_s": first,
               "ratio": {s: med[s] / med["rocannl"] for s in sides if s != "rocannl"}}
        table.append(row)
        ratios = ", ".join(f"{s} {v:.2f}x" for s, v in row["ratio"].items())
        print(f"{m:22} rocannl {1000 * med['rocannl']:8.2f} ms/step  ({ratios})", flush=True)
    with open(a.out, "w") as f:
        json.dump({"cpu": cpu_name(), "cores": os.cpu_count(), "device": a.device,
                   "gpu": gpu_name() if on_gpu else None, "rounds": a.rounds,
                   "steps": a.steps, "table": table, "runs": runs}, f, indent=1)
    gpu = f", GPU: {gpu_name()}" if on_gpu else ""
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores{gpu}; all runs in {a.out}")


if __name__ == "__main__":
    main()
