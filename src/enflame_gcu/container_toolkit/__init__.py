"""``enflame-ctk``: CDI specs, engine configuration, installers, doctor and the toolkit CLI."""
