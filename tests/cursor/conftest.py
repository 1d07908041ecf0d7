"""Fixtures for the cursor engine's tests: each policy's own (the backfill's ``pair``, the
stream's ``stream``), as their faces' tests use them."""

from tests.backfill.conftest import pair
from tests.incremental.conftest import stream

__all__ = ["pair", "stream"]
