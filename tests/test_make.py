"""The Makefile: `make test` fetches nothing once the environment is built.

Dry runs (``make --dry-run``) against a scratch environment whose stamps are up to date:
they print what would run, and run nothing.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _dry_run(target: str, venv: Path) -> list[str]:
    result = subprocess.run(
        ["make", "--dry-run", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if not k.startswith("MAKE")},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def _built(tmp_path: Path) -> Path:
    """An environment as `make test` leaves it: the interpreter and both stamps, newer
    than what they depend on, and none of the binaries the install step fetches."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    for stamp in (".installed", ".installed-test"):
        (venv / stamp).touch()
    return venv


def test_make_test_needs_no_network_once_the_environment_is_built(tmp_path: Path) -> None:
    venv = _built(tmp_path)
    commands = _dry_run("test", venv)
    programs = [Path(c.split()[0]).name for c in commands]
    assert programs == ["ruff", "ruff", "mypy", "lint-imports", "pytest"], commands
    assert not [c for c in commands if "pip" in c or "fetch" in c or "download" in c]


def test_building_the_test_environment_fetches_the_chart_tools(tmp_path: Path) -> None:
    venv = _built(tmp_path)
    (venv / ".installed-test").unlink()
    commands = _dry_run("test", venv)
    install = [c for c in commands if "pip install" in c or "fetch_tools.py" in c]
    assert install == [
        f"{venv}/bin/python -m pip install -q -e '.[test]'",
        f"{venv}/bin/python scripts/fetch_tools.py {venv}/bin",
    ]
