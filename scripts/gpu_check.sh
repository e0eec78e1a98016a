#!/usr/bin/env bash
# The device check of the CUDA backend, for a machine with an NVIDIA GPU (compute capability 9.0
# or later) and its driver. Runs, in order, stopping at the first failure:
#   1. the CUDA tests of arrayjit (with a device they run the conformance cases on it),
#   2. the shared conformance suite on --backend cuda,
#   3. every conformance document on the device and on the simulator (cuda-sim), values and
#      gradients compared cell by cell (scripts/gpu_check.py),
#   4. the examples on the device (char_gpt, moons), and NCCL's one-rank group (data
#      parallelism: an all-reduce and a data-parallel training step on the device),
#   5. rocannl bench on the W1-W4 documents, cuda beside gccjit.
# Without a GPU, BACKEND=cuda-sim rehearses steps 2, 3 and 5 on the simulator (checking the
# script itself). Environment:
#   CASES=DIR          the conformance cases (default ../shared/conformance/cases, else
#                      shared/conformance/cases inside the checkout)
#   BACKEND=cuda|cuda-sim
#   ROCANNL_BIN=PATH   a built CLI (default: build target/release/rocannl)
#   OUT=DIR            where reports are written (default target/gpu_check)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
backend="${BACKEND:-cuda}"
out="${OUT:-target/gpu_check}"
mkdir -p "$out"
cases="${CASES:-../shared/conformance/cases}"
[ -d "$cases" ] || cases=shared/conformance/cases
runner="$(dirname "$cases")/run_conformance.py"
step() { printf '\n== %s\n' "$*"; }

if [ -z "${ROCANNL_BIN:-}" ]; then
  step "build"
  cargo build --release --bin rocannl --example char_gpt --example moons
  bin=target/release/rocannl
else
  bin="$ROCANNL_BIN"
fi

if [ "$backend" = cuda ]; then
  step "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
  step "arrayjit CUDA tests (conformance cases on the device)"
  cargo test --release -p rocannl-arrayjit --test cuda 2>&1 | tee "$out/cuda_tests.txt"
fi

step "conformance suite on $backend"
if [ -f "$runner" ]; then
  python3 "$runner" --bin "$bin" --cases "$cases" --backend "$backend" \
    --json-out "$out/conformance_$backend.json" | tail -3
else
  echo "no conformance runner beside $cases: skipped"
fi

step "$backend against the simulator, document by document"
python3 scripts/gpu_check.py --bin "$bin" --cases "$cases" --backend "$backend" \
  --report "$out/device_vs_sim.json"

if [ "$backend" = cuda ]; then
  step "examples on the device"
  target/release/examples/char_gpt --backend cuda --steps 300 --json | tail -1 | tee "$out/char_gpt.json"
  target/release/examples/moons --backend cuda --quick | tail -3
  step "NCCL: one rank on the device"
  cargo test --release -p rocannl-tensor --features nccl --test nccl -- --nocapture 2>&1 \
    | tee "$out/nccl.txt"
fi

step "rocannl bench, $backend beside gccjit"
gen=$(dirname "$(dirname "$cases")")/tools/gen_docs.py
if [ -f "$gen" ]; then
  for doc in "matmul 1024" mlp attention bmm; do
    name=${doc// /_}
    python3 "$gen" $doc > "$out/$name.json"
    reps=20
    [ "$backend" = cuda-sim ] && reps=1
    # The simulator takes seconds per step: only the small documents.
    if [ "$backend" = cuda-sim ] && [ "$name" != attention ]; then continue; fi
    "$bin" bench "$out/$name.json" --backend "$backend" --backend gccjit --reps "$reps" --json \
      > "$out/bench_$name.json"
    echo "$name: $(python3 -c "import json,sys; print(', '.join(r['backend'] + ' ' + format(r['run_s']['median'] * 1e3, '.3f') + ' ms' for r in json.load(open(sys.argv[1]))['runs']))" "$out/bench_$name.json")"
  done
else
  echo "no gen_docs.py beside the cases: skipped"
fi
step "all checks passed ($backend); reports in $out"
