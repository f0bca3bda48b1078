"""``--feature-file``: the node's ``enflame.com/gcu.*`` labels kept current for NFD.

Rewritten (atomically, mode 0644) whenever discovery or health changes what the labels say:
cards appearing or going, a card turning unhealthy or healthy again (``count.healthy``), a new
driver version. Nothing is written while the text stays the same, so NFD sees no churn.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from enflame_gcu import devices, fileio, health
from enflame_gcu.presentation import labels

log = logging.getLogger(__name__)


class FeatureFile:
    """One NFD local feature file owned by this process."""

    def __init__(self, path: str, on_write: Callable[[], None] | None = None) -> None:
        self.path = path
        self._on_write = on_write
        self._failing: str | None = None

    def _current(self) -> str | None:
        try:
            return fileio.read_regular(self.path).decode("utf-8")
        except (OSError, UnicodeDecodeError):  # missing, not a file or not text: rewritten
            return None

    def update(
        self,
        inventory: devices.Inventory,
        report: health.HealthReport,
        *,
        slices: Mapping[str, int] | None = None,
        node_mode: str | None = None,
    ) -> bool:
        """Write the labels for the node as it is now; True when the file changed."""
        healthy = {card.name for card in report.cards if card.healthy}
        found = labels.for_inventory(inventory, healthy, slices=slices, node_mode=node_mode)
        text = labels.feature_file(found)
        if text == self._current():  # also after a restart: the file already says it
            return False
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            fileio.atomic_write_text(self.path, text, mode=0o644)
        except OSError as exc:
            reason = f"cannot write the feature file {self.path}: {exc.strerror or exc}"
            if reason != self._failing:
                log.error("%s; the node's labels are not kept current", reason)
                self._failing = reason
            return False
        if self._failing is not None:
            log.info("feature file %s is writable again", self.path)
            self._failing = None
        log.info("feature file %s: %s", self.path, " ".join(text.split()))
        if self._on_write is not None:
            self._on_write()
        return True
