#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs for a GPU machine that has no Rust toolchain (or no
# network): the release CLI, the examples it runs (and the model suite's, for
# `scripts/suite_compare.py --device cuda --suite-bin /tmp/bundle/suite`), the CUDA and NCCL test programs, the shared
# conformance cases and timing documents, and libgccjit with the few GCC 12 files its driver
# links with (so that gccjit can run beside the device where the host has no GCC 12).
#
#   scripts/gpu_bundle.sh [DEST]      (default target/gpu_bundle.tar.xz)
#
# On the GPU machine, from the checkout:
#   mkdir -p /tmp/bundle && tar xJf DEST -C /tmp/bundle && bash /tmp/bundle/run.sh
# run.sh puts the bundle's libraries, the CUDA driver, the CUDA toolkit and NCCL on the library
# path and runs scripts/gpu_check.sh with PREBUILT=/tmp/bundle KEEP_GOING=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
dest="${1:-target/gpu_bundle.tar.xz}"
shared="${SHARED:-../shared}"
stage=target/gpu_bundle
rm -rf "$stage"
mkdir -p "$stage/lib" "$stage/gcc12" "$stage/shared/conformance" "$stage/shared/tools"

cargo build --release --bin rocannl --example char_gpt --example moons --example suite
# The test programs' paths, as cargo reports them.
test_program() {
  cargo test --release "$@" --no-run --message-format=json 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["executable"])'
}
cp "$(test_program -p rocannl-arrayjit --test cuda)" "$stage/cuda-tests"
cp "$(test_program -p rocannl-tensor --features nccl --test nccl)" "$stage/nccl-tests"
for p in rocannl examples/char_gpt examples/moons examples/suite; do cp "target/release/$p" "$stage/"; done
strip "$stage"/{rocannl,char_gpt,moons,suite,cuda-tests,nccl-tests}

cp -r "$shared/conformance/cases" "$shared/conformance/run_conformance.py" \
  "$stage/shared/conformance/"
cp "$shared/tools/gen_docs.py" "$stage/shared/tools/"

for l in libgccjit.so.0 libisl.so.23 libmpc.so.3 libmpfr.so.6; do
  cp -L "/lib/x86_64-linux-gnu/$l" "$stage/lib/"
done
gcc=/usr/lib/gcc/x86_64-linux-gnu/12
cp -L "$gcc"/{collect2,crtbeginS.o,crtendS.o,libgcc.a,libgcc_s.so,liblto_plugin.so} \
  "$stage/gcc12/"

cat > "$stage/run.sh" <<'EOF'
#!/usr/bin/env bash
# Runs scripts/gpu_check.sh (from the current folder, a checkout) with this bundle's programs.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
gcc=/usr/lib/gcc/x86_64-linux-gnu/12
# libgccjit's driver links with GCC 12's start files; add them only where GCC 12 is absent.
[ -e "$gcc/crtbeginS.o" ] || { mkdir -p "$gcc" && cp -n "$here"/gcc12/* "$gcc/"; }
# cudarc opens NCCL as libnccl.so (the development link); the runtime packages (the pip wheel
# nvidia-nccl-cu*, the libnccl2 package) install only libnccl.so.2.
nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], "lib"))' \
  2>/dev/null || true)
for d in "$nccl" /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64; do
  if [ -n "$d" ] && [ -e "$d/libnccl.so.2" ]; then
    ln -sf "$d/libnccl.so.2" "$here/lib/libnccl.so"
    break
  fi
done
export LD_LIBRARY_PATH="$here/lib:/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${nccl:+$nccl:}${LD_LIBRARY_PATH:-}"
PREBUILT="$here" KEEP_GOING=1 CASES="$here/shared/conformance/cases" bash scripts/gpu_check.sh
EOF
chmod +x "$stage/run.sh"
tar cf - -C "$stage" . | xz -T0 -6 > "$dest"
ls -la "$dest"
