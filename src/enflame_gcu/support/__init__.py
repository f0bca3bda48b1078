"""Helpers below the domain that wrap an operating-system facility: inotify, unix sockets."""
