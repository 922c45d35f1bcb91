"""The aiohttp side: the application and its routes (``http``), listening sockets (``server``), connection limits
(``connections``, the ``http:`` section in ``config``), TLS and basic auth (``auth``, ``webconfig``), the API's status
JSON (``status``), and the daemon's own views: the status page at ``/`` and the JSON it adds to ``/api/v1/status``."""
