"""What people and other tools read about a node: ``enflame-ctk info`` and node labels."""
