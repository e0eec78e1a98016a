#!/usr/bin/env bash
# One-line setup for a fresh Debian bookworm machine (run as root, or with sudo available).
# Idempotent: running it again only reports what is already there.
#
#  1. libgccjit (Debian's libgccjit-12-dev) for the native gccjit backend, and gcc-12 (the
#     driver of builds made in the calling process);
#  2. with --cuda, or when an NVIDIA driver is present: NVRTC (the Python package
#     nvidia-cuda-nvrtc-cu12, about 100 MB) unpacked into .nv/ of this workspace, where the CUDA
#     backend finds it (after ROCANNL_NVRTC_DIR and before the system's paths). Without it the
#     CUDA backend reports that NVRTC is missing and its compile tests are skipped. The NVIDIA
#     files are never committed (.nv/ is ignored by git);
#  3. numpy (with pip) for the differential test against the reference in tests/reference/;
#  4. with --mpi: Open MPI (openmpi-bin, libopenmpi-dev) and libclang-dev (bindgen, for the
#     `mpi` crate's build), what the `mpi` feature needs (docs/distributed.md).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cuda=no
mpi=no
for arg in "$@"; do
  case "$arg" in
    --cuda) cuda=yes ;;
    --mpi) mpi=yes ;;
    *) echo "setup: error: unknown argument $arg (usage: setup.sh [--cuda] [--mpi])" >&2; exit 2 ;;
  esac
done
if [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi >/dev/null 2>&1; then
  cuda=yes
fi
say() { echo "setup: $*"; }
fail() { echo "setup: error: $*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else fail "need root (or sudo) to run: $*"
  fi
}

# --- 1. libgccjit -----------------------------------------------------------------------------
# And gcc-12: a build made in the calling process runs GCC's driver as the program
# x86_64-linux-gnu-gcc-12 (docs/backends.md), which libgccjit-12-dev does not pull in.
gcc_missing=()
for pkg in libgccjit-12-dev gcc-12; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || gcc_missing+=("$pkg")
done
if [ ${#gcc_missing[@]} -eq 0 ]; then
  say "libgccjit-12-dev and gcc-12 are already installed"
else
  command -v apt-get >/dev/null 2>&1 || fail "apt-get not found: install ${gcc_missing[*]} by hand"
  say "installing ${gcc_missing[*]} with apt-get"
  as_root apt-get update -qq || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${gcc_missing[@]}" >/dev/null \
    || fail "apt-get could not install ${gcc_missing[*]}"
  say "installed ${gcc_missing[*]}"
fi

# --- 2. NVRTC into .nv/ -----------------------------------------------------------------------
nv="$root/.nv"
nvlib="$nv/nvidia/cuda_nvrtc/lib"
if compgen -G "$nvlib/libnvrtc.so.*" >/dev/null; then
  say "NVRTC is already in $nvlib"
elif [ "$cuda" = no ]; then
  say "no NVIDIA driver here: NVRTC not fetched (scripts/setup.sh --cuda fetches it)"
else
  command -v python3 >/dev/null 2>&1 || fail "python3 not found: it is needed to fetch NVRTC"
  python3 -m pip --version >/dev/null 2>&1 || fail "pip for python3 not found: it is needed to fetch NVRTC"
  say "installing NVRTC (nvidia-cuda-nvrtc-cu12) into $nv"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --upgrade \
    --target "$nv" 'nvidia-cuda-nvrtc-cu12>=12.4,<13' \
    || fail "pip could not install nvidia-cuda-nvrtc-cu12 into $nv"
  compgen -G "$nvlib/libnvrtc.so.*" >/dev/null || fail "NVRTC was installed but $nvlib has no libnvrtc.so.*"
  say "installed NVRTC into $nvlib"
fi
# The wheel ships alternative builds next to the ones that are loaded; they are never used.
removed=$( [ -d "$nv" ] && find "$nv" -name '*.alt.so*' -print -delete | wc -l || echo 0)
[ "$removed" -gt 0 ] && say "removed $removed unused *.alt.so* files"

# --- 3. numpy for the differential test (tests/reference/) ---------------------------------
if python3 -c 'import numpy' >/dev/null 2>&1; then
  say "numpy is already installed ($(python3 -c 'import numpy; print(numpy.__version__)'))"
else
  python3 -m pip --version >/dev/null 2>&1 || fail "pip for python3 not found: it is needed to install numpy"
  say "installing numpy with pip"
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore numpy \
    || fail "pip could not install numpy"
  python3 -c 'import numpy' >/dev/null 2>&1 || fail "numpy was installed but python3 cannot import it"
  say "installed numpy"
fi

# --- 4. Open MPI for the `mpi` feature ----------------------------------------------------------
if [ "$mpi" = yes ]; then
  missing=()
  for pkg in openmpi-bin libopenmpi-dev libclang-dev; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    say "Open MPI and libclang are already installed ($(mpirun --version 2>/dev/null | head -1))"
  else
    command -v apt-get >/dev/null 2>&1 || fail "apt-get not found: install ${missing[*]} by hand"
    say "installing ${missing[*]} with apt-get"
    as_root apt-get update -qq || fail "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null \
      || fail "apt-get could not install ${missing[*]}"
    command -v mpirun >/dev/null 2>&1 || fail "Open MPI was installed but mpirun is not on PATH"
    say "installed ${missing[*]}"
  fi
fi

say "done"
