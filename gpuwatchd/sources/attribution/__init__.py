"""Who holds a GPU: containers (from /proc/PID/cgroup), Kubernetes pods (the kubelet's pod-resources API) and HPC
jobs (Slurm cgroups, dcgm-exporter's job-mapping directory).

The daemon runs :class:`gpuwatchd.sources.attribution.task.AttributionTask`; it hands an
:class:`gpuwatchd.model.Attribution` to the store (``Store.ingest``) after every snapshot. Nothing here
imports grpc unless a pod-resources socket exists (``kubelet.py``): importing it costs several MB.
"""
