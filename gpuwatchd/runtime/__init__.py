"""Process plumbing of the daemon: clocks, start-up checks, sd_notify, the NVML outage log."""
