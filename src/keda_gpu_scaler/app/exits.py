"""How every command ends: one line and a status, never a traceback, for what a user can fix.

Kept free of heavy imports, so that the commands can load everything else under its guard.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import TypeVar

from keda_gpu_scaler.app.scaler.listen import ListenError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
_E = TypeVar("_E", bound=BaseException)
_LISTEN_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def exit_status(exc: BaseException, *, prog: str, source_hint: str = "") -> int:
    """The exit status of a command that ended with ``exc``, after one line on stderr.

    Ctrl-C (130) and a closed standard output (0) end quietly, whenever they happen, even
    inside a task group; a configuration error is one line and 2; anything else propagates.
    ``source_hint`` ends the line when the error is a source that cannot be read.
    """
    leaves = _leaves(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in leaves):
        return EXIT_INTERRUPTED
    if any(isinstance(e, BrokenPipeError) for e in leaves):
        quiet_stdout()
        return 0
    from keda_gpu_scaler.domain.errors import ScalerError, SourceUnavailable

    for leaf in leaves:
        if isinstance(leaf, ScalerError | ListenError):
            hint = source_hint if isinstance(leaf, SourceUnavailable) else ""
            print(f"{prog}: {leaf}{hint}", file=sys.stderr)
            return EXIT_USAGE
        if isinstance(leaf, OSError) and leaf.errno in _LISTEN_ERRNOS:
            print(f"{prog}: cannot listen: {leaf.strerror or leaf}", file=sys.stderr)
            return EXIT_USAGE
    raise exc


def find_leaf(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first ``kind`` in ``exc``, looking inside exception groups."""
    return next((leaf for leaf in _leaves(exc) if isinstance(leaf, kind)), None)


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def quiet_stdout() -> None:
    """After a reader closed standard output: point it at /dev/null, so that the flush at
    exit does not fail a second time with "Exception ignored ... BrokenPipeError"."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no real file behind sys.stdout
        pass
