"""gRPC stubs generated from ``health_event.proto``: gpuwatchd's own hand-written, wire-compatible subset of
NVSentinel's platform connector schema (regenerate with ``generate.sh``; README.md says what it must keep and how to
check it against a newer NVSentinel).

Imported only when ``remediation.nvsentinel`` is enabled: they import grpc and protobuf (several MB)."""
