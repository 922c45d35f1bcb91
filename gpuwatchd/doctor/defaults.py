"""Defaults of ``gpuwatchd doctor``'s options, apart from the checks so the command line's parser can show them
without importing the config models."""

from __future__ import annotations

# NVML and torch run in child processes that are killed after this (seconds): a wedged GPU must not hang doctor.
DEFAULT_DEADLINE = 15.0
# The user the shipped systemd unit runs the daemon as (systemd/gpuwatchd.service User=, SupplementaryGroups=).
SERVICE_USER = "gpuwatchd"
