"""``enflame-device-plugin``: serves the node's GCUs to the kubelet over the v1beta1 API."""
