"""Device plugin tests: proto, config, service, and the plugin process against the stub kubelet."""
