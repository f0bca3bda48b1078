"""Generated stubs of the kubelet device plugin API (v1beta1); regenerate with ``make proto``."""
