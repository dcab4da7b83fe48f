"""The product's Helm chart, installed into the real API server with the real ``helm``."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.k8s_tools import tool

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "k8s" / "helm" / "keda-gpu-scaler"
VALUES = CHART / "ci"


class HelmError(Exception):
    pass


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    objects: tuple[dict[str, Any], ...]
    warnings: str

    def find(self, kind: str, name: str | None = None) -> dict[str, Any]:
        for obj in self.objects:
            if obj["kind"] == kind and (name is None or obj["metadata"]["name"] == name):
                return obj
        raise KeyError(f"the release has no {kind} {name or ''}")

    def all(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


class Helm:
    """``helm`` with a scratch home and the run's administrator kubeconfig."""

    def __init__(self, kubeconfig: Path, home: Path) -> None:
        self._kubeconfig = kubeconfig
        self._home = home
        home.mkdir(parents=True, exist_ok=True)

    def run(self, *args: str | Path, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(self._home),
            "XDG_CONFIG_HOME": str(self._home),
            "HELM_CACHE_HOME": str(self._home / "cache"),
            "HELM_DATA_HOME": str(self._home / "data"),
            "KUBECONFIG": str(self._kubeconfig),
        }
        done = subprocess.run(
            [str(tool("helm")), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=env,
        )
        if done.returncode != 0:
            raise HelmError(f"helm {' '.join(map(str, args[:2]))}: {done.stderr.strip()}")
        return done

    def install(
        self,
        release: str,
        namespace: str,
        *,
        values: Sequence[Path] = (),
        set_values: Sequence[str] = (),
        upgrade: bool = False,
    ) -> Release:
        verb = ["upgrade", "--install"] if upgrade else ["install"]
        args: list[str | Path] = [*verb, release, CHART, "--namespace", namespace]
        for file in values:
            args += ["--values", file]
        for pair in set_values:
            args += ["--set", pair]
        done = self.run(*args)
        manifest = self.run("get", "manifest", release, "--namespace", namespace).stdout
        objects = tuple(d for d in yaml.safe_load_all(manifest) if d)
        return Release(release, namespace, objects, done.stderr)

    def uninstall(self, release: str, namespace: str) -> None:
        self.run("uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")
