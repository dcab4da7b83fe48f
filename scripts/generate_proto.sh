#!/usr/bin/env bash
# Regenerate the betterproto2 code for KEDA's External Scaler contract.
# Usage: scripts/generate_proto.sh [OUTPUT_DIR]   (default: src/keda_gpu_scaler/serving/_proto)
# Needs the dev or test extra (betterproto2-compiler, grpcio-tools, ruff) in the active environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-"$root/src/keda_gpu_scaler/serving/_proto"}
python=${PYTHON:-python}
bindir=$(dirname "$(command -v "$python")")
rm -rf "$out"
mkdir -p "$out"
# The plugin and the ruff it calls are looked up on PATH.
PATH="$bindir:$PATH" "$python" -m grpc_tools.protoc -I "$root/protos" \
  --python_betterproto2_out="$out" \
  --python_betterproto2_opt=client_generation=async,server_generation=async \
  "$root/protos/externalscaler.proto" >/dev/null
