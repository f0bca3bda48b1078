"""Adapters to the kubelet's node-local APIs other than device plugin registration."""
