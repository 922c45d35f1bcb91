"""Process plumbing of the daemon: clocks, start-up checks, sd_notify, the NVML outage log; the client that talks to
a running daemon (``daemon_client``, ``status_client``)."""
