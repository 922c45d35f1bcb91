"""Prometheus exposition: families over the store, the encoder, the custom collector, DCGM compatibility."""
