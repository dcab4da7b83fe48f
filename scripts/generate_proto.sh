#!/usr/bin/env bash
# Regenerate the betterproto2 code for KEDA's External Scaler contract, for the kubelet's
# PodResources API and for the node agent's own stream (NodeAgent.WatchNode).
# Usage: scripts/generate_proto.sh [SERVING_OUT KUBELET_OUT AGENT_OUT]
#   defaults: src/keda_gpu_scaler/serving/_proto, src/keda_gpu_scaler/sources/kubelet/_proto
#   and src/keda_gpu_scaler/_proto_agent (give all three or none, so that a check writing
#   elsewhere never touches the committed code)
# The node agent's stream is served by serving and read by sources.agents, which may not import
# each other: its code is a package of its own, outside the layers.
# Needs the dev or test extra (betterproto2-compiler, grpcio-tools, ruff) in the active environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case $# in
  0)
    serving_out="$root/src/keda_gpu_scaler/serving/_proto"
    kubelet_out="$root/src/keda_gpu_scaler/sources/kubelet/_proto"
    agent_out="$root/src/keda_gpu_scaler/_proto_agent"
    ;;
  3)
    serving_out=$1
    kubelet_out=$2
    agent_out=$3
    ;;
  *)
    echo "usage: $0 [SERVING_OUT KUBELET_OUT AGENT_OUT]" >&2
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
generate "$agent_out" "$root/protos/kedagpuscaler/v1/node_agent.proto"
