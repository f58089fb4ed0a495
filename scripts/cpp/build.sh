#!/usr/bin/env bash
# Build scripts/cpp/build/ckpred_select: assemble the onnxruntime SDK if needed, then CMake.
#   PYTHON=/path/to/venv/bin/python scripts/cpp/build.sh
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$HERE/../get_onnxruntime_sdk.sh" "$HERE/third_party/onnxruntime"
cmake -S "$HERE" -B "$HERE/build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$HERE/build" -j 2
echo "built $HERE/build/ckpred_select"
