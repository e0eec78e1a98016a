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
#   PREBUILT=DIR       for a machine without Rust: the binaries made by scripts/gpu_bundle.sh
#                      (rocannl, char_gpt, moons and the test programs cuda-tests, nccl-tests)
#   KEEP_GOING=1       run every step and list the failed ones at the end
#   OUT=DIR            where reports are written (default target/gpu_check)
# pipefail holds in every step's subshell too: a failing program before `| tee` fails the step.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
backend="${BACKEND:-cuda}"
out="${OUT:-target/gpu_check}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cases="${CASES:-../shared/conformance/cases}"
[ -d "$cases" ] || cases=shared/conformance/cases
cases="$(cd "$cases" && pwd)"
runner="$(dirname "$cases")/run_conformance.py"
step() { printf '\n== %s\n' "$*"; }
failed=()
# Runs one step (a function); with KEEP_GOING=1 a failure is listed and the next step runs.
check() {
  local name="$1"
  shift
  step "$name"
  if [ "${KEEP_GOING:-}" = 1 ]; then
    set +e
    (set -e; "$@")
    local rc=$?
    set -e
    [ "$rc" = 0 ] || { echo "FAILED ($rc): $name"; failed+=("$name"); }
  else
    "$@"
  fi
}

if [ -n "${PREBUILT:-}" ]; then
  bin="${ROCANNL_BIN:-$PREBUILT/rocannl}"
  examples="$PREBUILT"
elif [ -z "${ROCANNL_BIN:-}" ]; then
  step "build"
  cargo build --release --bin rocannl --example char_gpt --example moons
  bin=target/release/rocannl
  examples=target/release/examples
else
  bin="$ROCANNL_BIN"
  examples=target/release/examples
fi
bin="$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")"
# Without a device or NCCL the CUDA and NCCL tests pass by saying so; here that is a failure.
export ROCANNL_REQUIRE_DEVICE=1 ROCANNL_REQUIRE_NVRTC=1
# A test program built elsewhere runs in its crate's folder, as cargo test runs it.
run_tests() {
  local crate="$1" prebuilt="$2"
  shift 2
  if [ -n "${PREBUILT:-}" ]; then
    (cd "$crate" && "$PREBUILT/$prebuilt" --test-threads=1 --nocapture)
  else
    cargo test --release "$@" -- --test-threads=1 --nocapture
  fi
}

device_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
}
cuda_tests() {
  run_tests arrayjit cuda-tests -p rocannl-arrayjit --test cuda 2>&1 | tee "$out/cuda_tests.txt"
}
conformance() {
  if [ -f "$runner" ]; then
    python3 "$runner" --bin "$bin" --cases "$cases" --backend "$backend" \
      --json-out "$out/conformance_$backend.json" | tail -3
  else
    echo "no conformance runner beside $cases: skipped"
  fi
}
against_sim() {
  python3 scripts/gpu_check.py --bin "$bin" --cases "$cases" --backend "$backend" \
    --report "$out/device_vs_sim.json"
}
examples_on_device() {
  "$examples/char_gpt" --backend cuda --steps 300 --json | tail -1 | tee "$out/char_gpt.json"
  "$examples/moons" --backend cuda --quick | tail -3
}
nccl_one_rank() {
  run_tests tensor nccl-tests -p rocannl-tensor --features nccl --test nccl 2>&1 \
    | tee "$out/nccl.txt"
}
bench() {
  local gen
  gen=$(dirname "$(dirname "$cases")")/tools/gen_docs.py
  if [ ! -f "$gen" ]; then
    echo "no gen_docs.py beside the cases: skipped"
    return
  fi
  for doc in "matmul 1024" mlp attention bmm; do
    local name=${doc// /_} reps=20
    python3 "$gen" $doc > "$out/$name.json"
    [ "$backend" = cuda-sim ] && reps=1
    # The simulator takes seconds per step: only the small documents.
    if [ "$backend" = cuda-sim ] && [ "$name" != attention ]; then continue; fi
    # gccjit beside the device where the host can run it (a machine without GCC 12 may not).
    "$bin" bench "$out/$name.json" --backend "$backend" --backend gccjit --reps "$reps" --json \
      > "$out/bench_$name.json" 2> "$out/bench_$name.err" \
      || "$bin" bench "$out/$name.json" --backend "$backend" --reps "$reps" --json \
        > "$out/bench_$name.json"
    echo "$name: $(python3 -c "import json,sys; print(', '.join(r['backend'] + ' ' + format(r['run_s']['median'] * 1e3, '.3f') + ' ms' for r in json.load(open(sys.argv[1]))['runs']))" "$out/bench_$name.json")"
  done
}

if [ "$backend" = cuda ]; then
  check "device" device_info
  check "arrayjit CUDA tests (conformance cases on the device)" cuda_tests
fi
check "conformance suite on $backend" conformance
check "$backend against the simulator, document by document" against_sim
if [ "$backend" = cuda ]; then
  check "examples on the device" examples_on_device
  check "NCCL: one rank on the device" nccl_one_rank
fi
check "rocannl bench, $backend beside gccjit" bench
if [ "${#failed[@]}" -gt 0 ]; then
  step "FAILED ($backend): ${failed[*]}; reports in $out"
  exit 1
fi
step "all checks passed ($backend); reports in $out"
