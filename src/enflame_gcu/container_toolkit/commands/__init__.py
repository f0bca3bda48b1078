"""Subcommand groups of enflame-ctk; each module exposes register(subparsers)."""
