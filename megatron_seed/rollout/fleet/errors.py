"""The fleet's errors."""

from __future__ import annotations


class FleetError(RuntimeError):
    """An engine kept failing (beyond max_restarts) or the fleet is misused."""


class WeightSyncError(FleetError):
    """A weight sync that could not finish (an engine the transfer needs died or stalled)."""
