#!/usr/bin/env bash
# rocannl side by side with numpy, JAX and PyTorch on the anchors' workloads (W1, W2, W4), in one
# session, 2 threads each; writes the table into docs/benchmarks.md. Options: see
# scripts/compare_anchors.py (--reps N, --frameworks numpy,jax,torch, --no-write).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --bin rocannl --example first_step
exec python3 scripts/compare_anchors.py "$@"
