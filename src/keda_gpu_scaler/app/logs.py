"""Structured logs: one JSON object per line with stable keys (time, level, event, context)."""

from __future__ import annotations

import logging
import sys
import time

import msgspec

_STANDARD = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}
_ENCODER = msgspec.json.Encoder(enc_hook=str)
LEVELS = ("debug", "info", "warning", "error")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "event": record.getMessage(),
            "logger": record.name,
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return _ENCODER.encode(entry).decode()


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # grpclib logs every reset stream at INFO; those are KEDA's normal cancellations.
    logging.getLogger("grpclib").setLevel(max(root.level, logging.WARNING))
