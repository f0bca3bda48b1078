"""The extender's HTTPS context, whose certificate, key and client CA follow their files
(:class:`enflame_gcu.bounded_http.ReloadingTLS`, shared with the DRA webhook).

Certificates rotate (cert-manager, a Secret's files swapped under a mounted volume) while the
extender runs for months. The context the server listens with picks, at each handshake (its
``sni_callback``, which OpenSSL calls with or without a server name), the newest context built
from the files: when a file's inode, size or modification time moved (checked at most every
``check_every`` seconds), a fresh context is built and used for the handshakes that follow;
connections already open keep theirs. Files that cannot be used (half written, a key that does
not match) keep the previous context: one WARNING per new set of files, and the extender goes
on answering with what worked.
"""

from __future__ import annotations

from enflame_gcu.bounded_http import ReloadingTLS, Stamp

__all__ = ["ReloadingTLS", "Stamp"]
