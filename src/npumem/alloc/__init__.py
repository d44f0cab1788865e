"""Memory resources: the caching pool, the pinned host pool, adaptors and planned arenas."""

from .static_plan import StaticPlan

__all__ = ["StaticPlan"]
