"""Allocation traces: one event model, readers and writers for the formats tools write, replay."""

from ..events import TraceEvent
from .file_checks import TraceFormatError
from .formats import FORMATS, detect_format, read_trace, write_trace

__all__ = ["FORMATS", "TraceEvent", "TraceFormatError", "detect_format", "read_trace", "write_trace"]
