"""A GCU node without GCUs: fake sysfs and /dev trees, stand-ins for the kubelet, and the demo.

``simulate`` builds a node from a ``topofile`` description (built-in ones in ``topologies/``);
``testing`` holds the stand-ins the tests and the demo drive the programs with (a kubelet stub
over real gRPC, the plugin as a process, runc containers); ``demo`` is ``make demo``.
"""
