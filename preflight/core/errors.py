"""The configuration error, in a module of its own: the command line catches it (exit 2) without
loading the configuration code (:mod:`preflight.core.config` raises it and re-exports it)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""
