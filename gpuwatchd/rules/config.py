"""Config of the built-in rules (``rules:`` in the YAML file)."""

from __future__ import annotations

from gpuwatchd.configtypes import Section


class RulesConfig(Section):
    """Placeholder until the rules issue lands: no rule settings yet."""
