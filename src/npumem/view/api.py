"""The viewer's JSON API: the opened sources and the routes over them. Each handler checks its
query, finds its source and hands the work to the module that knows it (aggregate, moment,
jobs, panels). A bad query is a RequestError (400/404) with one line."""

from __future__ import annotations

import json
import math

from .errors import RequestError, SourceError
from .source import Source
from .sources import load

MAX_PATHS = 2


def open_sources(paths: list[str], progress=None, device: int | None = None) -> list[Source]:
    """Each path loaded and precomputed (SourceError for one that cannot be), on one axis:
    each source's time from its own first entry, so two runs line up at their starts; where
    one of two has no time stamps, both go by entry number. `device`: the device to show
    (default: the one that ran out of memory, else the first with entries)."""
    from ..trace import TraceFormatError

    sources = []
    for number, path in enumerate(paths):
        if progress:
            progress(f"reading {path}")
        loaded = load(path)
        try:
            sources.append(Source(number, loaded, device))
        except SourceError:
            raise
        except TraceFormatError as exc:
            raise SourceError(str(exc)) from None
        except (ValueError, TypeError, OverflowError, KeyError, IndexError) as exc:
            # a file that reads but holds what no recording can (hostile or damaged): one
            # line, never a traceback
            raise SourceError(f"{path}: cannot be shown: {exc}") from None
    if len(sources) > 1 and not all(source.timed for source in sources):
        for source in sources:
            source.timed, source.times = False, None
    for source in sources:
        if source.times is not None and len(source.times):
            source.origin = float(source.times[0])
            source.offset = -source.origin
    return sources


class App:
    def __init__(self, sources: list[Source]):
        from .jobs import Jobs

        self.sources = sources
        self.jobs = Jobs()
        self.routes = {
            ("GET", "/api/info"): self.info,
            ("GET", "/api/timeline"): self.timeline,
            ("GET", "/api/moment"): self.moment,
            ("GET", "/api/allocation"): self.allocation,
            ("POST", "/api/whatif"): self.whatif,
            ("GET", "/api/job"): self.job,
            ("GET", "/api/leaks"): self.leaks,
            ("GET", "/api/host"): self.host,
            ("GET", "/api/usage"): self.usage,
            ("GET", "/api/diff"): self.diff,
        }

    def route(self, method: str, path: str, query: dict, body: bytes | None):
        handler = self.routes.get((method, path))
        if handler is None:
            if any(route == path for _, route in self.routes):
                raise RequestError(f"{path} does not answer {method}", 405)
            raise RequestError(f"no such route: {path}", 404)
        return handler(query, body)

    # --- query helpers ----------------------------------------------------------------------

    def source(self, query: dict) -> Source:
        number = _integer(query, "source", 0)
        if not 0 <= number < len(self.sources):
            raise RequestError(f"no source {number}: there are {len(self.sources)}", 404)
        return self.sources[number]

    # --- routes -----------------------------------------------------------------------------

    def info(self, query, body) -> dict:
        from .settings import settings

        return {"sources": [source.info() for source in self.sources],
                "settings": settings(self.sources[0]),
                "aligned": "start" if all(s.timed for s in self.sources) else "entry"}

    def timeline(self, query, body) -> dict:
        from .aggregate import timeline

        source = self.source(query)
        return timeline(source, _number(query, "t0"), _number(query, "t1"),
                        _integer(query, "width", 800))

    def moment(self, query, body) -> dict:
        from .moment import moment

        source = self.source(query)
        t = _number(query, "t")
        if t is None:
            raise RequestError("moment needs t (a time on the timeline's axis)")
        return moment(source, t)

    def allocation(self, query, body) -> dict:
        from .moment import allocation

        source = self.source(query)
        number = _integer(query, "id", None)
        if number is None:
            raise RequestError("allocation needs id (an allocation's id from /api/moment)")
        try:
            return allocation(source, number)
        except KeyError:
            raise RequestError(f"no allocation {number} in source {source.id}", 404) from None

    def whatif(self, query, body) -> dict:
        try:
            request = json.loads(body or b"{}")
        except (ValueError, UnicodeDecodeError):
            raise RequestError("the body is not JSON: send {\"source\": 0, \"setting\": "
                               "\"expandable_segments:True\"}") from None
        if not isinstance(request, dict) or not isinstance(request.get("setting"), str):
            raise RequestError("send {\"source\": 0, \"setting\": \"expandable_segments:True\"}")
        source = self.source({"source": str(request.get("source", 0))})
        return {"job": self.jobs.start_whatif(source, request["setting"])}

    def job(self, query, body) -> dict:
        name = query.get("id")
        job = self.jobs.get(name) if name else None
        if job is None:
            raise RequestError(f"no job {name!r}", 404)
        return job.state()

    def leaks(self, query, body) -> dict:
        from .panels import leaks

        return leaks(self.source(query))

    def host(self, query, body) -> dict:
        from .panels import host

        return host(self.source(query))

    def diff(self, query, body) -> dict:
        """With two sources: what `npumem diff A B` prints (what grew between them, by site)."""
        from ..profile import diff

        if len(self.sources) != 2:
            raise RequestError("a diff needs two paths: npumem view A B", 404)
        before, after = self.sources
        top = max(1, min(_integer(query, "top", 20), 200))
        known = before.extras.get(("diff", top))
        if known is None:
            known = before.extras[("diff", top)] = diff(before.data, after.data, top)
        return {"before": before.path, "after": after.path, "lines": known.splitlines()}

    def usage(self, query, body) -> dict:
        from .panels import usage

        return usage(self.source(query))


def _number(query: dict, name: str) -> float | None:
    text = query.get(name)
    if text in (None, ""):
        return None
    try:
        value = float(text)
    except ValueError:
        raise RequestError(f"{name} must be a number, not {text[:40]!r}") from None
    if not math.isfinite(value):
        raise RequestError(f"{name} must be a finite number")
    return value


def _integer(query: dict, name: str, default):
    text = query.get(name)
    if text in (None, ""):
        return default
    try:
        return int(text)
    except ValueError:
        raise RequestError(f"{name} must be a whole number, not {text[:40]!r}") from None

