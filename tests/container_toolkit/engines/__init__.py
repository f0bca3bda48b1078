"""Tests of the container engine config editors and ``enflame-ctk runtime``."""
