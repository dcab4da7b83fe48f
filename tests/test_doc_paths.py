"""Every repository path that the README and docs/ name exists: in backticks or as a link."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("src/", "tests/", "k8s/", "docs/", "scripts/", "benchmarks/", "protos/", ".github/")
ROOT_FILES = {"Dockerfile", "Makefile", "LICENSE", "pyproject.toml", "README.md"}
_CODE = re.compile(r"`([^`\s]+)`")
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# Folders that .gitignore lists hold what a run writes (benchmark results): named, not shipped.
IGNORED_DIRS = tuple(
    line.strip()
    for line in (ROOT / ".gitignore").read_text().splitlines()
    if line.strip().endswith("/") and "*" not in line
)


def _named_paths(doc: Path) -> set[Path]:
    text = doc.read_text()
    found: set[Path] = set()
    for name in _CODE.findall(text):
        name = name.rstrip(".,:;")
        if name.startswith("keda_gpu_scaler/"):
            name = "src/" + name
        if name.startswith(IGNORED_DIRS):
            continue
        if name.startswith(TOP) or name in ROOT_FILES:
            found.add(ROOT / name.rstrip("/"))
    for target in _LINK.findall(text):
        target = target.split("#", 1)[0]
        if not target or "://" in target or target.startswith(("mailto:", "../")):
            continue
        found.add((doc.parent / target).resolve())
    return found


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    missing = sorted(str(p.relative_to(ROOT)) for p in _named_paths(doc) if not p.exists())
    assert missing == []


def test_the_scan_finds_paths() -> None:
    assert ROOT / "docs/configuration.md" in _named_paths(ROOT / "README.md")
    assert ROOT / "src/keda_gpu_scaler/sources/trace.py" in _named_paths(
        ROOT / "docs/gpu-metrics.md"
    )
