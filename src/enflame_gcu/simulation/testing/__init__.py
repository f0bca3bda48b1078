"""Stand-ins the tests and the demo use: kubelet stubs over real gRPC, the plugin as a process."""
