"""enflame-gcu-operator: deploys the GCU components from the vendor's GcuResource, node by node."""
