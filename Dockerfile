# keda-gpu-scaler container image (docs/image.md).
#
#   docker build -t ghcr.io/keda-gpu-scaler/keda-gpu-scaler:0.1.0 .
#   make image        # the same, offline, with buildah and a Debian base made here
#
# NVML (libnvidia-ml.so.1) is not in the image: the NVIDIA container runtime mounts the
# node driver's copy when NVIDIA_DRIVER_CAPABILITIES includes "utility".

# The base of both stages: a Python 3.11+ on glibc with the venv module. By default the
# official python:3.12-slim-bookworm, pinned by the digest of its multi-platform index;
# scripts/build_image.sh passes a Debian bookworm root file system it makes itself
# (debootstrap, python3 and python3-venv) instead.
ARG BASE=docker.io/library/python:3.12-slim-bookworm@sha256:a116514e19457bcb7af7efe9c3dd0b9b71e85b317694e7882a1c52aa15a78134

# Build stage: this project and its pinned dependencies in a virtual environment that the
# final stage copies as a whole. Wheels in wheelhouse/ (scripts/build_image.sh puts the
# project's and all its dependencies' there) are installed without any index, so the build
# needs no network; an empty wheelhouse/ builds the project here and asks PyPI.
FROM ${BASE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
COPY wheelhouse/ /wheels/

RUN python3 -m venv /opt/keda-gpu-scaler \
    && if ls /wheels/keda_gpu_scaler-*.whl > /dev/null 2>&1; then \
        /opt/keda-gpu-scaler/bin/pip install --no-compile --no-index --find-links /wheels \
            keda-gpu-scaler; \
    else \
        /opt/keda-gpu-scaler/bin/pip wheel --no-deps --wheel-dir /wheels . \
        && /opt/keda-gpu-scaler/bin/pip install --no-compile /wheels/keda_gpu_scaler-*.whl; \
    fi \
    && /opt/keda-gpu-scaler/bin/pip uninstall --yes pip

# Final stage: the same Python, the virtual environment, no compilers, no pip, no root.
FROM ${BASE}

LABEL org.opencontainers.image.title="keda-gpu-scaler" \
      org.opencontainers.image.description="KEDA External Scaler for GPU workloads (NVML and inference-engine metrics)" \
      org.opencontainers.image.source="https://github.com/keda-gpu-scaler/keda-gpu-scaler" \
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
