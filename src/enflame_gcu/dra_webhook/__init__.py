"""``enflame-dra-webhook``: unmodified ``enflame.com/gcu: N`` pods get switch-local claims."""
