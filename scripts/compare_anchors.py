#!/usr/bin/env python3
"""rocannl side by side with numpy, JAX and PyTorch on the anchors' workloads, in one session.

    bash scripts/compare_anchors.sh [--reps N] [--frameworks numpy,jax,torch] [--isa avx2] [--no-write]

Runs, on this machine and one after the other:
- `rocannl bench --backend gccjit --json` on the documents of `../shared/tools/gen_docs.py`:
  W1 `matmul N` (N = 256, 512, 1024, 2048), W4 `attention` and `bmm`;
- `examples/first_step` for W2 and (`--moons`) W3, the whole training steps the anchors time
  (forward, backward and the SGD update; a document has no optimizer): the steady-state step,
  over 5 processes;
- the anchors' `bench.py` (`../shared/anchors/perf/`) for each framework that is installed:
  workloads `matmul`, `einsum`, `mlp` and `moons`.

Prints a Markdown table (medians, min–max over repetitions, the machine) and, unless
`--no-write`, puts it in `docs/benchmarks.md` between the `compare_anchors` markers. Every
process uses 2 threads, as the anchors' protocol does.

`--isa avx2` measures what an AVX2-only host would run, on an AVX-512 host: every process is
limited to AVX2 (rocannl by `ROCANNL_ISA=avx2`, PyTorch by `ATEN_CPU_CAPABILITY=avx2` and
`MKL_ENABLE_INSTRUCTIONS=AVX2`, numpy's OpenBLAS by `OPENBLAS_CORETYPE=Haswell` and numpy's own
loops by `NPY_DISABLE_CPU_FEATURES`, JAX by `XLA_FLAGS=--xla_cpu_max_isa=AVX2`), and the table
goes between the `compare_anchors_avx2` markers. The clock, caches and memory stay the host's,
so this is the AVX2 code paths' figure, not an AVX2-only machine's.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SHARED = os.path.join(ROOT, "..", "shared")
GEN = os.path.join(SHARED, "tools", "gen_docs.py")
ANCHORS = os.path.join(SHARED, "anchors", "perf", "bench.py")
DOC = os.path.join(ROOT, "docs", "benchmarks.md")
BEGIN = "<!-- compare_anchors: begin -->"
END = "<!-- compare_anchors: end -->"
SIZES = (256, 512, 1024, 2048)
ENV = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2",
           BENCH_THREADS="2", PYTHONDONTWRITEBYTECODE="1")
# Every framework limited to AVX2 (`--isa avx2`).
AVX2_ENV = dict(ROCANNL_ISA="avx2", ATEN_CPU_CAPABILITY="avx2", MKL_ENABLE_INSTRUCTIONS="AVX2",
                OPENBLAS_CORETYPE="Haswell",
                NPY_DISABLE_CPU_FEATURES="AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL AVX512_SPR",
                XLA_FLAGS="--xla_cpu_max_isa=AVX2")

# Rows of the table: (label, unit, rocannl document, anchors' (workload, case prefix)).
ROWS = [(f"W1 matmul n={n}", "GFLOP/s", ["matmul", str(n)], ("matmul", f"n={n}")) for n in SIZES] + [
    ("W4 attention scores bhqd,bhkd->bhqk", "GFLOP/s", ["attention"], ("einsum", "attn_scores")),
    ("W4 bmm bij,bjk->bik", "GFLOP/s", ["bmm"], ("einsum", "bmm ")),
    ("W2 MLP training step", "steps/s", [], ("mlp", "")),
    ("W3 moons training step", "steps/s", ["--moons"], ("moons", "")),
]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def machine():
    info, flags = {}, set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "cpu family", "model") and key not in info:
                    info[key] = value.strip()
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except OSError:
        pass
    model = f"{info.get('model name', 'unknown CPU')} (family {info.get('cpu family', '?')} model {info.get('model', '?')})"
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    if "avx512_bf16" in flags:
        isa += " with BF16"
    return f"{model}, {os.cpu_count()} vCPUs, {isa}, {platform.system()} {platform.release()}"


def train_steps(example, flags):
    """A training step's steady-state steps/s from `examples/first_step`: the median over 5
    processes of each one's median step, and the range of those medians."""
    rates = []
    for _ in range(5):
        r = subprocess.run([example, *flags], capture_output=True, text=True, env=ENV)
        if r.returncode != 0:
            log(f"first_step failed: {r.stderr}")
            return None
        rates.append(1 / json.loads(r.stdout.strip().splitlines()[-1])["step_s"])
    rates.sort()
    return (rates[len(rates) // 2], rates[0], rates[-1])


def rocannl_runs(binary, example, reps):
    """rocannl's figure per row: (median, min, max) in the row's unit."""
    out = {}
    for label, unit, gen, _ in ROWS:
        if unit == "steps/s":
            log("examples/first_step", *gen)
            out[label] = train_steps(example, gen)
            continue
        doc = subprocess.run([sys.executable, GEN, *gen], capture_output=True, text=True, check=True).stdout
        path = os.path.join(ROOT, "target", f"compare_{'_'.join(gen)}.json")
        with open(path, "w") as f:
            f.write(doc)
        log("rocannl bench", " ".join(gen))
        r = subprocess.run([binary, "bench", path, "--backend", "gccjit", "--reps", str(reps), "--json"],
                           capture_output=True, text=True, env=ENV)
        if r.returncode != 0:
            log(f"rocannl bench {gen} failed: {r.stdout} {r.stderr}")
            continue
        run = json.loads(r.stdout)["runs"][0]
        t = run["run_s"]
        if unit == "GFLOP/s":
            f = run["flops"]
            out[label] = (f / t["median"] / 1e9, f / t["max"] / 1e9, f / t["min"] / 1e9)
        else:
            out[label] = (1 / t["median"], 1 / t["max"], 1 / t["min"])
    return out


def anchor_runs(framework, reps):
    """A framework's figure per row, or None when it is not installed."""
    out, versions = {}, None
    for workload in ("matmul", "einsum", "mlp", "moons"):
        log(f"bench.py {framework} {workload}")
        r = subprocess.run([sys.executable, ANCHORS, "--framework", framework, "--workload", workload,
                            "--reps", str(reps), "--max-wait-s", "10"],
                           capture_output=True, text=True, env=ENV)
        if r.returncode != 0:
            log(f"{framework} {workload} unavailable: {r.stderr.strip().splitlines()[-1:]}")
            return None, None
        doc = json.loads(r.stdout)
        versions = doc.get("versions")
        for res in doc["results"]:
            for label, _, _, (w, prefix) in ROWS:
                if w == workload and res.get("case", "").startswith(prefix) and "reference" not in res.get("case", ""):
                    out[label] = (res["median"], res["min"], res["max"])
                if w == workload and workload in ("mlp", "moons") and res.get("metric") == "steps/s":
                    out[label] = (res["median"], res["min"], res["max"])
    return out, versions


def fmt(cell):
    if cell is None:
        return "—"
    m, lo, hi = cell
    return f"{m:,.0f} ({lo:,.0f}–{hi:,.0f})" if m >= 100 else f"{m:,.1f} ({lo:,.1f}–{hi:,.1f})"


def table(ours, others, versions, reps, isa=None):
    names = [f for f in others if others[f] is not None]
    # JAX's products run AVX-512 code whatever `--xla_cpu_max_isa` says (above the AVX2 FMA
    # ceiling), so with `--isa avx2` it is shown but not compared with.
    compared = [f for f in names if not (isa == "avx2" and f == "jax")]
    best_of = "best other" if compared == names else "best of " + ", ".join(compared)
    head = "| workload | unit | rocannl gccjit | " + " | ".join(names) + f" | rocannl ÷ {best_of} |"
    lines = [head, "|" + "---|" * (4 + len(names))]
    for label, unit, _, _ in ROWS:
        mine = ours.get(label)
        theirs = [others[f].get(label) for f in names]
        best = max((others[f][label][0] for f in compared if others[f].get(label)), default=None)
        ratio = f"{mine[0] / best:.2f}×" if mine and best else "—"
        lines.append(f"| {label} | {unit} | {fmt(mine)} | " + " | ".join(fmt(c) for c in theirs) + f" | {ratio} |")
    missing = [f for f in others if others[f] is None]
    vers = "; ".join(f"{f}: {json.dumps(v)}" for f, v in versions.items() if v)
    notes = [
        "",
        f"Measured {time.strftime('%Y-%m-%d %H:%M')} by `scripts/compare_anchors.sh` on {machine()}: "
        f"medians and (min–max) over {reps} repetitions of about 0.3 s (rocannl: at least 30 single runs), "
        "2 threads everywhere, one process after "
        "the other. rocannl: `rocannl bench --backend gccjit` on `gen_docs.py` documents (f32, `-O3`), "
        "W2 and W3 the steady-state step of `examples/first_step` (median of 5 processes' medians, "
        "their range); the others: the anchors' `bench.py`.",
    ]
    if isa == "avx2":
        notes.append("Every process limited to AVX2 on this AVX-512 host (`--isa avx2`: "
                     + ", ".join(f"`{k}={v}`" for k, v in AVX2_ENV.items())
                     + "); the clock, caches and memory are the host's. JAX's products ignore "
                     "`--xla_cpu_max_isa` (they run above the AVX2 FMA ceiling), so its column is "
                     "not an AVX2 figure and the ratio leaves it out.")
    if vers:
        notes.append(f"Versions: {vers}.")
    if missing:
        notes.append(f"Not installed here: {', '.join(missing)}.")
    return "\n".join(lines + notes)


def write(text, begin=BEGIN, end=END):
    with open(DOC) as f:
        doc = f.read()
    block = f"{begin}\n{text}\n{end}"
    if begin in doc and end in doc:
        before, rest = doc.split(begin, 1)
        after = rest.split(end, 1)[1]
        doc = before + block + after
    else:
        doc = doc.rstrip("\n") + "\n\n## rocannl, numpy, JAX and PyTorch side by side\n\n" + block + "\n"
    with open(DOC, "w") as f:
        f.write(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--frameworks", default="numpy,jax,torch")
    ap.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "rocannl"))
    ap.add_argument("--example", default=os.path.join(ROOT, "target", "release", "examples", "first_step"))
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--isa", choices=["avx2"], help="limit every framework to AVX2")
    args = ap.parse_args()
    if args.isa == "avx2":
        ENV.update(AVX2_ENV)
    for need in (GEN, ANCHORS, args.bin, args.example):
        if not os.path.exists(need):
            sys.exit(f"compare_anchors: {need} is missing (build with `cargo build --release --bin rocannl --example first_step`; "
                     "the shared folder must be beside this checkout)")
    # rocannl's repetitions are single runs (milliseconds each), the anchors' about 0.3 s each.
    ours = rocannl_runs(args.bin, args.example, max(args.reps, 30))
    others, versions = {}, {}
    for fw in args.frameworks.split(","):
        others[fw], versions[fw] = anchor_runs(fw, args.reps)
    text = table(ours, others, versions, args.reps, args.isa)
    print(text)
    if not args.no_write:
        if args.isa == "avx2":
            write(text, BEGIN.replace("anchors", "anchors_avx2"), END.replace("anchors", "anchors_avx2"))
        else:
            write(text)
        log(f"written to {DOC}")


if __name__ == "__main__":
    main()
