#!/usr/bin/env bash
# Build ckpred_select and ckpred_autotune_demo with CMake into BUILD_DIR (default build/cpp at the
# repository root, which git ignores; nothing is written into scripts/cpp):
#
#   ONNXRUNTIME_ROOT=<onnxruntime C/C++ package> scripts/cpp/build.sh [BUILD_DIR]
#
# ONNXRUNTIME_ROOT is the official onnxruntime release archive onnxruntime-linux-x64-<version>.tgz
# unpacked, of the version of the onnxruntime wheel ckpred runs on
# (python -c "import onnxruntime; print(onnxruntime.__version__)"), or any prefix onnxruntime was
# installed to. Without it, an installed onnxruntime CMake package is used (CMAKE_PREFIX_PATH, or
# a distribution's libonnxruntime-dev). See scripts/cpp/CMakeLists.txt.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${1:-$ROOT/build/cpp}"
args=(-S "$HERE" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCKPRED_REQUIRE_SELECT=ON)
if [[ -n "${ONNXRUNTIME_ROOT:-}" ]]; then
  args+=("-DONNXRUNTIME_ROOT=$ONNXRUNTIME_ROOT")
fi
if ! log="$(cmake "${args[@]}" 2>&1)"; then
  echo "$log" >&2
  echo "scripts/cpp/build.sh: cmake could not configure the build (see above)" >&2
  exit 1
fi
cmake --build "$BUILD" -j 2
echo "built $BUILD/ckpred_select and $BUILD/ckpred_autotune_demo"
