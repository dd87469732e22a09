"""Moved to kforge.timing (a leaf module anything may import); kept so old imports work."""
from ..timing import Timing, bench, bench_many, bench_pair  # noqa: F401
