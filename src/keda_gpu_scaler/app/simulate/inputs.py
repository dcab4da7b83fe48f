"""Reading the simulator's YAML inputs: one error type, every message naming the field."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import yaml

from keda_gpu_scaler.domain.errors import ScalerError

_T = TypeVar("_T")
_AT = re.compile(r"^(?P<message>.*) - at `\$\.?(?P<path>[^`]*)`$", re.DOTALL)


class BadInput(ScalerError):
    """An input the simulator cannot run: the message names the file and the field."""


def read_text(path: Path, *, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BadInput(f"cannot read {what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BadInput(f"{path}: not UTF-8 text (byte {exc.start})") from None


def read_yaml_documents(path: Path, *, what: str) -> list[Any]:
    """Every YAML document of ``path`` (``---`` between them), empty ones left out."""
    text = read_text(path, what=what)
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise BadInput(f"{path}: not YAML{where}: {problem}") from None


def read_yaml(path: Path, *, what: str) -> Any:
    """One YAML document from ``path``."""
    docs = read_yaml_documents(path, what=what)
    if len(docs) != 1:
        raise BadInput(f"{path}: expected one YAML document with a {what}, found {len(docs)}")
    return docs[0]


def convert(obj: Any, kind: type[_T], *, origin: str) -> _T:
    """``obj`` as ``kind`` (msgspec Structs), unknown fields refused, errors naming the field."""
    try:
        return msgspec.convert(obj, kind)
    except msgspec.ValidationError as exc:
        raise BadInput(f"{origin}: {field_message(str(exc))}") from None


def field_message(text: str) -> str:
    """msgspec's "Expected `int` - at `$.spec.x`" as "spec.x: expected `int`"."""
    match = _AT.match(text)
    if match is None:
        return text[:1].lower() + text[1:]
    message = match["message"]
    message = message[:1].lower() + message[1:]
    return f"{match['path']}: {message}" if match["path"] else message
