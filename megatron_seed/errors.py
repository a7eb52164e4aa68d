"""User-facing errors, in a leaf module every layer may import.

`ConfigError` (a bad config value) and `CommandError` (bad command input) are printed by the
`seed` command as one line with exit code 2, before any compute is spent.
"""

from __future__ import annotations


class CommandError(Exception):
    """A user-facing error: printed as one line, exit code 2."""


class ConfigError(CommandError, ValueError):
    """A config value out of its allowed range, of the wrong type, or an unknown key."""
