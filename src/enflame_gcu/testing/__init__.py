"""Test helpers that are part of the product: a kubelet stub and a plugin process runner."""
