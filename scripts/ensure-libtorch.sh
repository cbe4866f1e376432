#!/usr/bin/env bash
# Prints the path of a libtorch 2.13.0 usable by tch 0.26, installing it when missing.
#
# - If LIBTORCH is set, it is used as is (the user's own libtorch).
# - Otherwise the PyPI wheel torch==2.13.0 (or torch==$TESSERA_TORCH_VERSION, for a build against
#   another libtorch: scripts/build-for-torch.sh) is installed with pip into a cache folder outside the
#   repository ($TESSERA_CACHE, default ~/.cache/tessera), once; later builds, CI and other
#   checkouts reuse it. The install goes to a temporary folder that is renamed when complete, so an
#   interrupted install is never mistaken for a good one.
# - A CUDA build of that wheel also gets the headers that compile c10d's NCCL backend into
#   Tessera (nccl.h, the CUDA runtime's, cuBLAS', cuSPARSE's, cuSOLVER's, CCCL's
#   nv/target and crt/host_config.h;
#   host/build.rs looks for them in $DEST/nvidia/*/include). torch's own dependencies bring most;
#   the missing ones are installed from PyPI (cuda-toolkit[...] / nvidia-*-cu12 packages of the
#   wheel's CUDA version, and the nvidia-nccl package torch pins) and copied next to the others.
set -euo pipefail
TORCH_VERSION=${TESSERA_TORCH_VERSION:-2.13.0}
if [ -n "${LIBTORCH:-}" ]; then
  if [ ! -d "$LIBTORCH/lib" ] || [ ! -d "$LIBTORCH/include" ]; then
    echo "LIBTORCH=$LIBTORCH has no lib/ and include/ folders: point it at an unpacked libtorch" >&2
    exit 1
  fi
  echo "$LIBTORCH"
  exit 0
fi
CACHE=${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}
DEST="$CACHE/torch-$TORCH_VERSION"
if [ ! -f "$DEST/torch/lib/libtorch_cpu.so" ]; then
  mkdir -p "$CACHE"
  PARTIAL="$DEST.partial.$$"
  rm -rf "$PARTIAL"
  echo "installing libtorch $TORCH_VERSION (PyPI wheel torch==$TORCH_VERSION, ~4.7 GB) into $DEST" >&2
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --target "$PARTIAL" "torch==$TORCH_VERSION" >&2
  rm -rf "$DEST"
  mv "$PARTIAL" "$DEST"
fi

# The headers of the NCCL backend (see above), for a CUDA wheel.
missing_cuda_headers() {
  local h
  for h in nccl.h cuda_runtime_api.h crt/host_config.h nv/target cublas_v2.h cublasLt.h cusparse.h cusolverDn.h; do
    compgen -G "$DEST/nvidia/*/include/$h" >/dev/null || echo "$h"
  done
}
if [ -f "$DEST/torch/lib/libtorch_cuda.so" ] && [ -n "$(missing_cuda_headers)" ]; then
  CUDA_VERSION=$(sed -n "s/^cuda[^=]*= *'\([0-9.]*\)'.*/\1/p" "$DEST/torch/version.py")
  CUDA_MAJOR=${CUDA_VERSION%%.*}
  NCCL_PIN=$(sed -n "s/^Requires-Dist: \(nvidia-nccl-cu[0-9]*==[0-9.]*\).*/\1/p" \
    "$DEST"/torch-*.dist-info/METADATA | head -1)
  if [ "$CUDA_MAJOR" -ge 13 ]; then
    PACKAGES=("cuda-toolkit[cudart,crt,cccl,cublas,cusparse,cusolver]==$CUDA_VERSION.*")
  else
    PACKAGES=()
    for p in cuda-runtime cuda-nvcc cuda-cccl cublas cusparse cusolver; do
      PACKAGES+=("nvidia-$p-cu$CUDA_MAJOR==$CUDA_VERSION.*")
    done
  fi
  PACKAGES+=("${NCCL_PIN:-nvidia-nccl-cu$CUDA_MAJOR}")
  echo "installing the CUDA $CUDA_VERSION headers of c10d's NCCL backend ($(missing_cuda_headers | tr '\n' ' ')) from PyPI: ${PACKAGES[*]}" >&2
  HEADERS="$CACHE/cuda-headers.partial.$$"
  rm -rf "$HEADERS"
  PYTHON=${PYTHON:-python3}
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-cache-dir \
    --target "$HEADERS" "${PACKAGES[@]}" >&2
  mkdir -p "$DEST/nvidia"
  # Only what is missing: the libraries torch loads stay torch's own.
  cp -rn "$HEADERS"/nvidia/. "$DEST/nvidia/"
  rm -rf "$HEADERS"
  if [ -n "$(missing_cuda_headers)" ]; then
    echo "warning: still missing $(missing_cuda_headers | tr '\n' ' ')under $DEST/nvidia: Tessera builds without NCCL" >&2
  fi
fi
echo "$DEST/torch"
