"""``enflame-dra-plugin``: the gcu.enflame.com DRA driver (kubelet side and API side)."""
