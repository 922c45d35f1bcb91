"""Generated gRPC stubs of the kubelet's pod-resources v1 API (``api.proto``; regenerate with ``generate.sh``).

Import these only where a pod-resources socket exists: they import grpc and protobuf (several MB)."""
