"""Acting on the GPUs' health (docs/remediation.md): drain the Slurm node when a GPU must go out of service and
resume it when the GPU recovers, escalate a failure that outlived the action it asked for, and record operators'
acknowledgements. Reads the health from the store; never writes it."""
