"""Helpers below the domain: inotify, unix sockets and their locks, shared CLI options."""
