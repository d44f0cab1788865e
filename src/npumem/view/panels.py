"""The side panels: leaks and steps (the report's own analysis), pinned host memory."""

from __future__ import annotations


def leaks(source) -> dict:
    return {"leaks": [], "heading": "", "steps": []}


def host(source) -> dict:
    return {"host": False}
