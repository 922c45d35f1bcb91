"""Config of notification delivery (``notify:`` in the YAML file)."""

from __future__ import annotations

from gpuwatchd.configtypes import Section


class NotifyConfig(Section):
    """Placeholder until the notification issue lands: no receivers yet."""
