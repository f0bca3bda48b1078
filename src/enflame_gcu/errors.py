"""The project's exception tree; every message says what was being done and what exists.

EnflameError
├── DiscoveryError          reading sysfs or /dev under a host root failed as a whole
├── TopologyError           a topology description or PCI chain makes no sense
├── SimulationError         a simulated node cannot be created or changed
├── InvalidRequestError     a device request names unknown, unhealthy or duplicate devices
│   ├── AllocationError     no set of devices satisfies the request
│   └── ClaimError          a DRA ResourceClaim cannot be prepared on this node
├── ConfigError             a config file, flag or environment variable is invalid
├── SpecError               an OCI or CDI spec cannot be read, edited or written
├── EngineConfigError       a container engine config cannot be read, edited or written
├── InstallError            installing or uninstalling the toolkit on a host failed
├── PathOutsideRootError    a path under a host root would lead out of it (symlink or ..)
├── KubeletApiError         a kubelet API (PodResources) cannot be reached or is not offered
├── EfsmiError              running Enflame's efsmi failed (reason: missing, timeout, ...)
└── NodeStateError          a node-state annotation is malformed or of an unknown version
"""

from __future__ import annotations


class EnflameError(Exception):
    """Base of every error this project raises on purpose."""


class DiscoveryError(EnflameError):
    """Discovery under a host root failed as a whole (not a single unusable card)."""


class TopologyError(EnflameError):
    """A topology description or a PCI ancestor chain is malformed."""


class SimulationError(EnflameError):
    """A simulated GCU node cannot be created or changed."""


class InvalidRequestError(EnflameError):
    """A device request names unknown, unhealthy or duplicate devices, or is malformed."""


class AllocationError(InvalidRequestError):
    """No set of available devices satisfies the request."""


class ClaimError(InvalidRequestError):
    """A DRA ResourceClaim is missing, not allocated here, or names devices it cannot have."""


class ConfigError(EnflameError):
    """A configuration file, flag or environment variable is invalid."""


def number_flag(text: str, flag: str, low: float, high: float) -> float:
    """``--flag``'s value as a number within ``low..high``, or ConfigError naming the flag (the
    daemons that take such flags as text from the environment as well share it)."""
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"invalid --{flag}: {text!r} is not a number") from None
    if not low <= value <= high:
        raise ConfigError(f"invalid --{flag}: {text} is outside {low:g}..{high:g}")
    return value


class SpecError(EnflameError):
    """An OCI runtime spec or CDI spec cannot be read, edited or written."""


class EngineConfigError(EnflameError):
    """A container engine's configuration cannot be read, edited or written."""


class InstallError(EnflameError):
    """Installing or uninstalling the toolkit on a host failed."""


class PathOutsideRootError(EnflameError):
    """A path resolved under a host root would leave it (a ``..`` or symlink past the root)."""


class KubeletApiError(EnflameError):
    """A kubelet API (PodResources) cannot be reached, is not offered, or answered an error."""


class EfmlError(EnflameError):
    """A libefml call failed: the function, its return code and the code's name."""

    def __init__(self, function: str, code: int, name: str, detail: str = "") -> None:
        self.function, self.code, self.name = function, code, name
        text = f"{function}: {name} ({code})"
        super().__init__(f"{text}: {detail}" if detail else text)


class EfmlTimeout(EfmlError):
    """A libefml call did not return in time (a hung card or library)."""


class EfmlNotSupported(EfmlError):
    """The call returned NOT_SUPPORTED, or this libefml does not export the function at all."""


class EfsmiError(EnflameError):
    """Running ``efsmi`` failed; ``reason`` names how (missing, timeout, failed, unparseable,
    not-found), for metrics and for callers that treat some of them differently."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class NodeStateError(EnflameError):
    """A node-state annotation (``enflame.com/gcu-node-state``) is malformed or unknown."""
