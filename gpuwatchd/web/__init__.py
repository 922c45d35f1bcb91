"""The daemon's own web views: the status page at ``/`` and the JSON it adds to ``/api/v1/status``."""
