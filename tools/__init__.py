"""Maintainers' tools. A package so the tests import them as modules (`from tools import gpu_check`)."""
