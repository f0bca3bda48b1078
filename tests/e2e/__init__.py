"""End-to-end tests: the runtime wrapper in front of the real runc on a simulated node."""
