# keda-gpu-scaler container image.
#
#   docker build -t ghcr.io/keda-gpu-scaler/keda-gpu-scaler:0.1.0 .
#
# NVML (libnvidia-ml.so.1) is not in the image: the NVIDIA container runtime mounts the
# node driver's copy when NVIDIA_DRIVER_CAPABILITIES includes "utility".

# Build stage: a wheel of this project, installed with its pinned dependencies into a
# virtual environment that the final stage copies as a whole.
FROM python:3.12-slim AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src

RUN python -m venv /opt/keda-gpu-scaler \
    && python -m pip wheel --no-deps --wheel-dir /wheels . \
    && /opt/keda-gpu-scaler/bin/pip install --no-compile /wheels/keda_gpu_scaler-*.whl \
    && /opt/keda-gpu-scaler/bin/pip uninstall --yes pip

# Final stage: the same Python, the virtual environment, no compilers, no pip, no root.
FROM python:3.12-slim

LABEL org.opencontainers.image.title="keda-gpu-scaler" \
      org.opencontainers.image.description="KEDA External Scaler for GPU workloads (NVML and inference-engine metrics)" \
      org.opencontainers.image.licenses="Apache-2.0"

ENV PATH=/opt/keda-gpu-scaler/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility

COPY --from=builder /opt/keda-gpu-scaler /opt/keda-gpu-scaler

# A numeric user, so that Kubernetes can check runAsNonRoot without /etc/passwd.
USER 65532:65532

# gRPC (External Scaler and gRPC health), metrics and debug tap, probes.
EXPOSE 6000 9090 8081

# No HEALTHCHECK: Kubernetes probes /healthz and /readyz on port 8081.
ENTRYPOINT ["keda-gpu-scaler"]
CMD ["serve"]
