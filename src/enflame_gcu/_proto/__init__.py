"""Generated gRPC stubs (regenerate with ``make proto``): the kubelet device plugin API
(``api``, v1beta1) and the DRA driver's protocols (``pluginregistration_v1``, ``dra_v1``,
``dra_v1beta1``, ``drahealth_v1``, ``drahealth_v1alpha1``)."""
