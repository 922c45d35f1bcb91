"""The daemon's side of ``gpuwatchd.training``: a unix socket that training processes report PyTorch's allocator on
(``listener``), who is on the other end (``peer``: the kernel's credentials, the host pid) and what a line says
(``message``: schema 1, validated and matched to the GPUs NVML lists the process on). docs/training.md."""
