"""Spec modifiers: small objects that each make one change to an OCI spec; a chain is one too."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from enflame_gcu import edits, oci_edits
from enflame_gcu.errors import SpecError


class SpecModifier(Protocol):
    """Changes an OCI spec in place; raises SpecError saying what could not be done."""

    @property
    def name(self) -> str:
        """Short description used in error messages and logs."""
        ...

    def modify(self, spec: dict[str, Any]) -> None:
        """Apply the change to ``spec``."""
        ...


@dataclass(frozen=True, slots=True)
class DeviceNodes:
    """Adds device nodes to ``linux.devices`` with matching ``linux.resources.devices`` rules."""

    nodes: tuple[edits.DeviceNodeEdit, ...]
    name: str = "adding device nodes"

    def modify(self, spec: dict[str, Any]) -> None:
        """Add every node once, with an allow rule for its major:minor."""
        edits.ContainerEdits(device_nodes=self.nodes).apply_to(spec)


@dataclass(frozen=True, slots=True)
class Mounts:
    """Adds read-only bind mounts (driver tools and libraries), skipping taken destinations."""

    mounts: tuple[edits.MountEdit, ...]
    name: str = "adding mounts"

    def modify(self, spec: dict[str, Any]) -> None:
        """Add the mounts."""
        edits.ContainerEdits(mounts=self.mounts).apply_to(spec)


@dataclass(frozen=True, slots=True)
class Env:
    """Sets environment variables in ``process.env``, replacing earlier definitions."""

    env: tuple[tuple[str, str], ...]
    name: str = "setting environment variables"

    def modify(self, spec: dict[str, Any]) -> None:
        """Set the variables."""
        edits.ContainerEdits(env=self.env).apply_to(spec)


@dataclass(frozen=True, slots=True)
class MarkProcessed:
    """Records in an annotation that the spec was edited, so it is never edited twice."""

    value: str
    name: str = "marking the spec processed"

    def modify(self, spec: dict[str, Any]) -> None:
        """Set the processed annotation."""
        oci_edits.mark_processed(spec, self.value)


@dataclass(frozen=True, slots=True)
class Chain:
    """Applies modifiers in order; itself a modifier. A failure names the step that failed."""

    modifiers: tuple[SpecModifier, ...]
    name: str = "editing the spec"

    def modify(self, spec: dict[str, Any]) -> None:
        """Run each modifier; wrap unexpected spec shapes in SpecError with the step's name."""
        for modifier in self.modifiers:
            try:
                modifier.modify(spec)
            except SpecError:
                raise
            except (AttributeError, TypeError, ValueError, KeyError) as exc:
                problem = f"{modifier.name}: the spec has an unexpected shape ({exc})"
                raise SpecError(problem) from exc


def is_processed(spec: dict[str, Any]) -> bool:
    """True when an earlier run already edited this spec."""
    return oci_edits.is_processed(spec)


def for_edits(container_edits: edits.ContainerEdits, marker: str) -> Chain:
    """The chain that applies one ContainerEdits and marks the spec processed.

    Steps run in :func:`oci_edits.apply`'s order, so the chain writes the same JSON as the
    runtime's prepared-edits fast path, which applies the rendering in one call.
    """
    steps: list[SpecModifier] = []
    if container_edits.device_nodes:
        steps.append(DeviceNodes(container_edits.device_nodes))
    if container_edits.env:
        steps.append(Env(container_edits.env))
    if container_edits.mounts:
        steps.append(Mounts(container_edits.mounts))
    steps.append(MarkProcessed(marker))
    return Chain(tuple(steps))


def chain(modifiers: Sequence[SpecModifier]) -> Chain:
    """A chain of the given modifiers."""
    return Chain(tuple(modifiers))
