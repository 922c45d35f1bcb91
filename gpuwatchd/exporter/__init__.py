"""Prometheus exposition (custom collector over the store) and the aiohttp application."""
