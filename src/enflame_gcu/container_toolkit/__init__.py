"""Container side: the OCI runtime shim, CDI specs, engine configuration and the toolkit CLI."""
