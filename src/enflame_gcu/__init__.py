"""Enflame GCU accelerators on Kubernetes: device plugin, container runtime and toolkit."""

__version__ = "0.1.0"
