"""Build the upstream components of the end-to-end suite from their Go modules.

Reads ``e2e/pins.toml`` and builds, with the Go toolchain on PATH and the Go module proxy,
into ``build/e2e`` (git-ignored):

    bin/kube-apiserver, bin/kube-controller-manager   k8s.io/kubernetes at its pin
    bin/etcd                                          go.etcd.io/etcd/server/v3 at its pin
    bin/keda-operator, bin/keda-adapter               github.com/kedacore/keda/v2 at its pin
    keda-crds/*.yaml                                  the CRDs of that same KEDA tree
    bin/scaler-client                                 e2e/grpcgo, on KEDA's grpc-go and stubs
    prometheus-operator/*.yaml                        the ServiceMonitor CRD, for the chart
    versions.json                                     what was built, from what, how long

A component the proxy cannot give (or that fails to build) is named and skipped; the others
are built, and the exit status is 1.

A component is built again only when its pin (or, for the client, its source) changes: each
build's key is kept in versions.json beside the sha256 of every binary it made, and a
component whose key and binaries are unchanged is skipped. ``--force`` builds everything.

Usage: python e2e/build.py [--out build/e2e] [--force] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "e2e" / "pins.toml"
RECIPE = 1
"""Bumped when the way a component is built changes, so every key changes with it."""

Pins = Mapping[str, Mapping[str, Any]]


class BuildError(Exception):
    """A component could not be built; the message names it and what failed."""


@dataclass
class Built:
    """One component's entry in versions.json."""

    name: str
    module: str
    version: str
    key: str
    files: dict[str, str] = field(default_factory=dict)
    """Every file the build made, relative to the output folder, with its sha256."""
    go: str = ""
    build_s: float = 0.0
    built_at: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _go_env() -> dict[str, str]:
    env = dict(os.environ)
    # The toolchain on PATH, never one downloaded on the fly; static binaries.
    env |= {"GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}
    return env


def _run(args: Sequence[str | Path], cwd: Path, what: str) -> str:
    print(f"e2e build: {what}: {' '.join(str(a) for a in args)}", flush=True)
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=_go_env(),
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-30:])
        raise BuildError(f"{what}: {' '.join(str(a) for a in args[:3])} failed:\n{tail}")
    return done.stdout


def go_version() -> str:
    try:
        out = subprocess.run(
            ["go", "env", "GOVERSION"], capture_output=True, text=True, check=True, env=_go_env()
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BuildError(f"no usable Go toolchain on PATH ({exc})") from exc
    return out.stdout.strip()


def module_source(module: str, version: str, into: Path) -> Path:
    """Download ``module@version`` through the proxy and copy its tree, writable, to ``into``."""
    out = _run(["go", "mod", "download", "-json", f"{module}@{version}"], ROOT, module)
    info = json.loads(out)
    if info.get("Error"):
        raise BuildError(f"{module}@{version}: {info['Error']}")
    if into.exists():
        shutil.rmtree(into)
    shutil.copytree(info["Dir"], into)
    for path in [into, *into.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)
    return into


def module_mod_file(module: str, version: str, scratch: Path) -> str:
    """The go.mod of ``module@version``, as the proxy serves it."""
    out = _run(["go", "mod", "download", "-json", f"{module}@{version}"], scratch, module)
    info = json.loads(out)
    if info.get("Error"):
        raise BuildError(f"{module}@{version}: {info['Error']}")
    return Path(info["GoMod"]).read_text()


_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/", re.MULTILINE)
_GO_LINE = re.compile(r"^go\s+(\S+)", re.MULTILINE)
_REPLACE_BLOCK = re.compile(r"^replace\s*\((.*?)^\)", re.MULTILINE | re.DOTALL)
_REPLACE_LINE = re.compile(r"^replace\s+(?!\()(.+)$", re.MULTILINE)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The k8s.io modules that k8s.io/kubernetes builds from its own staging tree."""
    return sorted(set(_STAGING.findall(kubernetes_go_mod)))


def go_directive(go_mod: str) -> str:
    found = _GO_LINE.search(go_mod)
    if not found:
        raise BuildError("a go.mod without a go directive")
    return found.group(1)


def replace_directives(go_mod: str) -> list[str]:
    """Every ``replace`` of a go.mod, one ``old => new`` per entry, comments dropped."""
    lines = [ln for block in _REPLACE_BLOCK.findall(go_mod) for ln in block.splitlines()]
    lines += _REPLACE_LINE.findall(go_mod)
    entries = [ln.split("//", 1)[0].strip() for ln in lines]
    return [e for e in entries if "=>" in e]


def write_module(
    where: Path, name: str, go: str, requires: Mapping[str, str], replaces: Sequence[str]
) -> None:
    where.mkdir(parents=True, exist_ok=True)
    lines = [f"module {name}", "", f"go {go}", ""]
    lines += ["require (", *(f"\t{m} {v}" for m, v in sorted(requires.items())), ")", ""]
    if replaces:
        lines += ["replace (", *(f"\t{r}" for r in replaces), ")", ""]
    (where / "go.mod").write_text("\n".join(lines))
    (where / "go.sum").unlink(missing_ok=True)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _ldflags(*pairs: tuple[str, str]) -> str:
    return " ".join(["-s", "-w", *(f"-X '{k}={v}'" for k, v in pairs)])


def _kubernetes_ldflags(version: str) -> str:
    major, minor = version.removeprefix("v").split(".")[:2]
    fields = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "buildDate": "1970-01-01T00:00:00Z",
    }
    packages = ("k8s.io/client-go/pkg/version", "k8s.io/component-base/version")
    return _ldflags(*((f"{p}.{k}", v) for p in packages for k, v in fields.items()))


Product = tuple[list[Path], dict[str, Any]]
"""What a builder made (files under the output folder) and what to record beside them."""


def build_kubernetes(pin: Mapping[str, Any], out: Path, work: Path) -> Product:
    module, version, staging = pin["module"], pin["version"], pin["staging"]
    src = work / "kubernetes"
    go_mod = module_mod_file(module, version, ROOT)
    replaces = [f"{m} => {m} {staging}" for m in staging_modules(go_mod)]
    write_module(src, "e2e.local/kubernetes", go_directive(go_mod), {module: version}, replaces)
    imports = "\n".join(f'\t_ "{module}/{c}"' for c in pin["commands"])
    (src / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    _run(["go", "mod", "tidy"], src, "kubernetes: resolve")
    targets = [f"{module}/{c}" for c in pin["commands"]]
    flags: list[str | Path] = ["-trimpath", f"-ldflags={_kubernetes_ldflags(version)}"]
    flags += ["-o", out / "bin"]
    _run(["go", "build", *flags, *targets], src, "kubernetes: build")
    files = [out / "bin" / Path(c).name for c in pin["commands"]]
    return files, {"staging": staging, "replaced": len(replaces)}


def build_etcd(pin: Mapping[str, Any], out: Path, work: Path) -> Product:
    module, version = pin["module"], pin["version"]
    src = work / "etcd"
    go_mod = module_mod_file(module, version, ROOT)
    write_module(src, "e2e.local/etcd", go_directive(go_mod), {module: version}, [])
    (src / "tools.go").write_text(f'//go:build tools\n\npackage tools\n\nimport _ "{module}"\n')
    _run(["go", "mod", "tidy"], src, "etcd: resolve")
    flags: list[str | Path] = ["-trimpath", f"-ldflags={_ldflags()}", "-o", out / "bin" / "etcd"]
    _run(["go", "build", *flags, module], src, "etcd: build")
    return [out / "bin" / "etcd"], {}


def build_keda(pin: Mapping[str, Any], out: Path, work: Path) -> Product:
    module, version = pin["module"], pin["version"]
    src = module_source(module, version, work / "keda")
    flags = _ldflags((f"{module}/version.Version", version.removeprefix("v")))
    names = {"cmd/operator": "keda-operator", "cmd/adapter": "keda-adapter"}
    files = []
    for command in pin["commands"]:
        binary = out / "bin" / names.get(command, Path(command).name)
        args: list[str | Path] = ["go", "build", "-trimpath", f"-ldflags={flags}"]
        args += ["-o", binary, f"./{command}"]
        _run(args, src, f"keda: build {command}")
        files.append(binary)
    crds = copy_files(src / pin["crds"], out / "keda-crds")
    grpc = re.search(r"^\s*google\.golang\.org/grpc\s+(\S+)", (src / "go.mod").read_text(), re.M)
    return files + crds, {"grpc-go": grpc and grpc[1]}


def copy_files(source: Path, into: Path, names: Sequence[str] = ()) -> list[Path]:
    """The YAML files of ``source`` (or those ``names``) copied into a fresh ``into``."""
    if into.exists():
        shutil.rmtree(into)
    into.mkdir(parents=True)
    chosen = [source / n for n in names] if names else sorted(source.glob("*.yaml"))
    for file in chosen:
        if not file.is_file():
            raise BuildError(f"{file.name} is not in {source}")
        shutil.copy(file, into / file.name)
    return [into / f.name for f in chosen]


def build_crds(pin: Mapping[str, Any], out: Path, work: Path) -> Product:
    """CRDs only, from a module's tree: nothing is compiled."""
    src = module_source(pin["module"], pin["version"], work / pin["into"])
    return copy_files(src / pin["path"], out / pin["into"], pin["files"]), {}


def build_client(pin: Mapping[str, Any], pins: Pins, out: Path, work: Path) -> Product:
    keda = pins[pin["uses"]]
    source = ROOT / pin["source"]
    src = work / "grpc-go"
    if src.exists():
        shutil.rmtree(src)
    shutil.copytree(source, src)
    keda_mod = module_mod_file(keda["module"], keda["version"], ROOT)
    requires = {keda["module"]: keda["version"]}
    write_module(src, "e2e.local/scaler-client", go_directive(keda_mod), requires,
                 replace_directives(keda_mod))  # fmt: skip
    _run(["go", "mod", "tidy"], src, "grpc-go client: resolve")
    binary = out / "bin" / "scaler-client"
    _run(
        ["go", "build", "-trimpath", f"-ldflags={_ldflags()}", "-o", binary, "."],
        src,
        "grpc-go client: build",
    )
    listed = _run(["go", "list", "-m", "google.golang.org/grpc"], src, "grpc-go client: version")
    return [binary], {"grpc-go": listed.split()[-1]}


Builder = Callable[[Mapping[str, Any], Pins, Path, Path], Product]
BUILDERS: dict[str, Builder] = {
    "kubernetes": lambda pin, _pins, out, work: build_kubernetes(pin, out, work),
    "etcd": lambda pin, _pins, out, work: build_etcd(pin, out, work),
    "keda": lambda pin, _pins, out, work: build_keda(pin, out, work),
    "grpc-go": build_client,
    "prometheus-operator": lambda pin, _pins, out, work: build_crds(pin, out, work),
}


def build_key(name: str, pins: Pins, go: str) -> str:
    """What a component's binaries depend on: its pin, the toolchain, the recipe, its source."""
    parts: dict[str, Any] = {"pin": pins[name], "go": go, "recipe": RECIPE}
    if "uses" in pins[name]:
        parts["uses"] = pins[pins[name]["uses"]]
    if "source" in pins[name]:
        source = ROOT / pins[name]["source"]
        parts["source"] = {
            str(p.relative_to(source)): sha256(p) for p in sorted(source.rglob("*")) if p.is_file()
        }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def is_current(entry: Mapping[str, Any] | None, key: str, out: Path) -> bool:
    if not entry or entry.get("key") != key:
        return False
    files = entry.get("files", {})
    return bool(files) and all(
        (out / f).is_file() and sha256(out / f) == digest for f, digest in files.items()
    )


def build(out: Path, *, force: bool, only: Sequence[str]) -> list[str]:
    """Builds what is out of date; returns the components that failed (each one said why)."""
    pins: Pins = tomllib.loads(PINS.read_text())
    go = go_version()
    (out / "bin").mkdir(parents=True, exist_ok=True)
    record_path = out / "versions.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {}
    components = record.setdefault("components", {})
    failed = []
    for name in only or BUILDERS:
        key = build_key(name, pins, go)
        if not force and is_current(components.get(name), key, out):
            print(f"e2e build: {name}: up to date ({key})", flush=True)
            continue
        began = time.monotonic()
        try:
            files, extra = BUILDERS[name](pins[name], pins, out, out / "src")
        except BuildError as exc:
            print(f"e2e build: {name}: NOT BUILT: {exc}", file=sys.stderr, flush=True)
            components.pop(name, None)
            failed.append(name)
            continue
        pin = pins[name]
        entry = Built(
            name=name,
            module=pin.get("module", pin.get("source", "")),
            version=pin.get("version", pins.get(pin.get("uses", ""), {}).get("version", "")),
            key=key,
            files={str(f.relative_to(out)): sha256(f) for f in files},
            go=go,
            build_s=round(time.monotonic() - began, 1),
            built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            extra=extra,
        )
        components[name] = entry.__dict__
        record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        print(f"e2e build: {name}: built in {entry.build_s:.0f} s", flush=True)
    record_path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return failed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "e2e")
    parser.add_argument("--force", action="store_true", help="build every component again")
    parser.add_argument("--only", nargs="*", choices=sorted(BUILDERS), default=[])
    args = parser.parse_args(argv)
    try:
        failed = build(args.out.resolve(), force=args.force, only=args.only)
    except BuildError as exc:
        print(f"e2e build: {exc}", file=sys.stderr)
        return 1
    if failed:
        print(f"e2e build: not built: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
