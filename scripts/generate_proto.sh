#!/usr/bin/env bash
# Regenerate the betterproto2 code for KEDA's External Scaler contract and for the kubelet's
# PodResources API.
# Usage: scripts/generate_proto.sh [SERVING_OUT KUBELET_OUT]
#   defaults: src/keda_gpu_scaler/serving/_proto and src/keda_gpu_scaler/sources/kubelet/_proto
#   (give both or neither, so that a check writing elsewhere never touches the committed code)
# Needs the dev or test extra (betterproto2-compiler, grpcio-tools, ruff) in the active environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case $# in
  0)
    serving_out="$root/src/keda_gpu_scaler/serving/_proto"
    kubelet_out="$root/src/keda_gpu_scaler/sources/kubelet/_proto"
    ;;
  2)
    serving_out=$1
    kubelet_out=$2
    ;;
  *)
    echo "usage: $0 [SERVING_OUT KUBELET_OUT]" >&2
    exit 2
    ;;
esac
python=${PYTHON:-python}
bindir=$(dirname "$(command -v "$python")")

generate() {  # generate OUT PROTO: the server base too, which the kubelet fake in tests uses
  rm -rf "$1"
  mkdir -p "$1"
  # The plugin and the ruff it calls are looked up on PATH.
  PATH="$bindir:$PATH" "$python" -m grpc_tools.protoc -I "$root/protos" \
    --python_betterproto2_out="$1" \
    --python_betterproto2_opt=client_generation=async,server_generation=async \
    "$2" >/dev/null
}

generate "$serving_out" "$root/protos/externalscaler.proto"
generate "$kubelet_out" "$root/protos/kubelet/podresources/v1/api.proto"
