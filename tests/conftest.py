import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(autouse=True)
def _no_env_config(monkeypatch):
    """Tests choose their allocator config explicitly; a developer's MINIALLOC_ALLOC_CONF must not leak in."""
    monkeypatch.delenv("MINIALLOC_ALLOC_CONF", raising=False)
