"""The daemon tests here reuse the real ``preflight serve`` fixture of tests/serve."""

from tests.serve.conftest import serve

__all__ = ["serve"]
