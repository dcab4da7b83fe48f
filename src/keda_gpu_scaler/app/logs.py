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
    # A library's warnings.warn() becomes a log record ("py.warnings"), so standard error
    # stays one JSON object per line.
    logging.captureWarnings(True)
    for name, floor in QUIETER.items():
        logging.getLogger(name).setLevel(max(root.level, floor))
    # One line per engine scrape ("HTTP Request: GET ..."), logged at INFO: not a state
    # change, so hidden at info; kept at debug, where it is one readable line per scrape.
    logging.getLogger("httpx").setLevel(logging.WARNING if root.level >= logging.INFO else 0)


QUIETER = {
    # Every reset stream at INFO: those are KEDA's normal cancellations.
    "grpclib": logging.WARNING,
    # Per-frame and per-connection-step lines, unreadable at debug.
    "httpcore": logging.WARNING,
    "hpack": logging.WARNING,
    "h2": logging.WARNING,
    "h11": logging.WARNING,
    "asyncio": logging.INFO,
}
"""Libraries held at or above these levels whatever the chosen one, so that ``debug`` adds
this project's decisions and one line per engine scrape, not every HTTP/2 frame."""
