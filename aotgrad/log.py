"""aotgrad's logging: `logging.getLogger("aotgrad")` and its children, one per module.

A compile logs one INFO line per stage (its time and the sizes of what it produced), and
DEBUG lines with the partition's and the memory-budget solver's detail. Stages that can take
long (the memory-budget curve) log their progress at INFO every `PROGRESS_S` seconds.
Set `AOTGRAD_LOG=info` (or `debug`) to print them on stderr without configuring logging,
as `TORCH_LOGS` does for torch; or configure the "aotgrad" logger as any other.
"""

from __future__ import annotations

import logging
import os
import time
import warnings

ENV = "AOTGRAD_LOG"
PROGRESS_S = 5.0  # a long stage logs where it is at most this often
logger = logging.getLogger("aotgrad")
# Values of AOTGRAD_LOG besides the level names.
_ALIASES = {"1": "INFO", "on": "INFO", "true": "INFO", "0": "", "off": "", "false": ""}


def configure_from_env(value: str | None = None) -> logging.Handler | None:
    """Print aotgrad's log on stderr at the level AOTGRAD_LOG names; the handler, if any."""
    value = os.environ.get(ENV, "") if value is None else value
    name = _ALIASES.get(value.strip().lower(), value.strip().upper())
    if not name:
        return None
    level = logging.getLevelName(name)
    if not isinstance(level, int):
        warnings.warn(f"aotgrad: {ENV}={value!r} is not a logging level; use info or debug")
        return None
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[%(name)s %(levelname)s] %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(level)
    return handler


class Progress:
    """Logs `what` at INFO at most every PROGRESS_S seconds, for a stage that may be long."""

    def __init__(self, log: logging.Logger, what: str):
        self.log, self.what = log, what
        self.start = self.last = time.monotonic()

    def report(self, detail: str) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_S:
            self.last = now
            self.log.info("%s: %s (%.0f s so far)", self.what, detail, now - self.start)
