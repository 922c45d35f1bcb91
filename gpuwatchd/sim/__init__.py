"""Simulation: stand-in libnvidia-ml.so.1 (C, built on demand), its state file, scenario player, XML replay."""
