"""The web tests share the exporter tests' stores built from fixture files."""

from tests.exporter.conftest import mixed_store

__all__ = ["mixed_store"]
