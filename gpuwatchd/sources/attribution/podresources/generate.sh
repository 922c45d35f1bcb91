#!/bin/sh
# Regenerates the committed Python stubs of the kubelet's pod-resources API (api_pb2.py, api_pb2.pyi,
# api_pb2_grpc.py) from api.proto. Run from the repository root:  sh gpuwatchd/sources/attribution/podresources/generate.sh
# The -I . keeps the package path in the generated imports (from gpuwatchd...podresources import api_pb2).
# Generated with grpcio-tools 1.85.1; pyproject.toml requires grpcio/protobuf at least as new as the generator.
set -eu
python -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. --grpc_python_out=. \
    gpuwatchd/sources/attribution/podresources/api.proto
