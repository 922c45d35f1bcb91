"""The kernel log: the reader of /dev/kmsg (and its saved position), the parser, Xid de-duplication against NVML,
and what the daemon does with the records (the task wiring them together)."""
