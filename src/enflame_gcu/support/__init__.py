"""Helpers below the domain: inotify, unix sockets, options shared by our programs."""
