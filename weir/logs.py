"""Structured logs (structlog): JSON lines for machines, console rendering on a terminal."""

from __future__ import annotations

import logging
import os
import sys

import structlog


def configure(process: str, level: str | None = None) -> None:
    """Configure structlog once per process; every event carries the process name."""
    json_output = os.environ.get("WEIR_LOG_FORMAT", "").lower() == "json" or not sys.stderr.isatty()
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelName((level or os.environ.get("WEIR_LOG_LEVEL", "INFO")).upper())
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(process=process)
