#!/bin/sh
# Regenerates the committed Python stubs (health_event_pb2.py, health_event_pb2.pyi, health_event_pb2_grpc.py) from
# health_event.proto, gpuwatchd's hand-written subset of NVSentinel's health event API (README.md). Run from the repository root:
#   sh gpuwatchd/remediation/nvsentinel_pb/generate.sh
# The -I . keeps the package path in the generated imports (from gpuwatchd...nvsentinel_pb import health_event_pb2).
# Generated with grpcio-tools 1.85.1 (its bundled google/protobuf/*.proto); pyproject.toml pins it.
set -eu
python -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    gpuwatchd/remediation/nvsentinel_pb/health_event.proto
