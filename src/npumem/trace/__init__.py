"""Allocation traces: one event model, readers for the formats tools write, and replay."""

from .events import TraceEvent, TraceFormatError
from .readers import read_trace

__all__ = ["TraceEvent", "TraceFormatError", "read_trace"]
