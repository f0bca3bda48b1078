"""Tests of enflame-container-runtime: argv, config, requests, modifiers, create flow."""
