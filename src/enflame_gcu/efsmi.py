"""The efsmi adapter: the one place that runs Enflame's ``efsmi`` tool (DRS partitions).

DRS (hard partitions of a card) has no libefml call; the vendor's own plugin drives it with
``efsmi`` and parses its tables (EFML.md §5), and so do we:

===========================================  ================================================
command                                      what is read
===========================================  ================================================
``efsmi``                                    device rows: index, product, bus id; the next
                                             row's sixth field is the virtualisation state
``efsmi -i IDX --drs --list-profile``        rows naming a profile (``1g.8gb``): name, id,
                                             how many fit, memory, SIP cores
``efsmi [-i IDX] -L``                        rows naming a profile: card index, profile,
                                             instance id, UUID
``efsmi -i IDX --drs on|off``                exit status
``efsmi -i IDX --drs --create-instance P``   exit status; the new instance is the UUID that
                                             ``-L`` lists after and did not before
``efsmi -i IDX --drs --destroy-instance I``  exit status
===========================================  ================================================

Every call runs with an argument vector (no shell), a time limit, a small environment and its
output capped while it is read (a child that writes more is killed), and
fails with :class:`errors.EfsmiError` whose ``reason`` names what went wrong: ``missing``
(no such program), ``timeout``, ``failed`` (non-zero exit), ``unparseable`` (output we do
not understand) or ``not-found`` (no such card or instance; also efsmi's own "invalid device
index" for a card that is gone).
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from enflame_gcu.errors import EfsmiError

DEFAULT_TIMEOUT = 10.0  # seconds per call; creating an instance takes well under one
PROFILE = re.compile(r"\b(\d+)g\.(\d+)gb\b")
_BUS_ID = re.compile(r"\b((?:[0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\b")
_INVALID_INDEX = re.compile(r"invalid (?:device )?index", re.IGNORECASE)
_OUTPUT_LIMIT = 1 << 20  # an efsmi table is a few KiB; more is not efsmi talking


@dataclass(frozen=True, slots=True)
class EfsmiCard:
    """A card as efsmi numbers it: its index, product, PCI address and virtualisation state."""

    index: int
    product: str
    bus_id: str
    virt: str

    @property
    def drs_on(self) -> bool:
        """DRS is enabled on the card."""
        return self.virt.upper() == "DRS"


@dataclass(frozen=True, slots=True)
class Profile:
    """A DRS profile of one card: ``<slices>g.<memory>gb``, its id and how many fit."""

    name: str
    profile_id: str
    count: int
    memory: str
    sip: str

    @property
    def slices(self) -> int:
        """Compute slices one instance of the profile takes."""
        return int(_profile_match(self.name).group(1))

    @property
    def memory_gb(self) -> int:
        """Memory of one instance in GB, from the profile's name."""
        return int(_profile_match(self.name).group(2))


@dataclass(frozen=True, slots=True)
class Instance:
    """A DRS instance: its card's efsmi index, profile, instance id and UUID."""

    index: int
    profile: str
    instance_id: str
    uuid: str

    @property
    def visible_device(self) -> str:
        """How a container names it: ``TOPS_VISIBLE_DEVICES=DRS-<uuid>``."""
        return f"DRS-{self.uuid}"


def _profile_match(name: str) -> re.Match[str]:
    match = PROFILE.fullmatch(name)
    if match is None:
        raise EfsmiError("unparseable", f"{name!r} is not a DRS profile name (<n>g.<m>gb)")
    return match


def normal_bus_id(text: str) -> str:
    """``03:00.0`` and ``0000:03:00.0`` as sysfs spells them (lower case, with a domain)."""
    text = text.lower()
    return text if text.count(":") == 2 else f"0000:{text}"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_cards(output: str) -> list[EfsmiCard]:
    """The device table of plain ``efsmi``."""
    lines = [line for line in output.splitlines() if "-" not in line and line.strip()]
    cards = []
    for number, line in enumerate(lines):
        match = _BUS_ID.search(line)
        if match is None:
            continue
        cells = _cells(line)
        head = cells[0].split() if cells else []
        following = lines[number + 1] if number + 1 < len(lines) else ""
        state = following.replace("|", " ").replace("/", " ").split()
        if len(cells) < 3 or len(head) < 2 or not head[0].isdigit() or len(state) < 6:
            raise EfsmiError("unparseable", f"efsmi device row not understood: {line.strip()!r}")
        cards.append(
            EfsmiCard(
                index=int(head[0]),
                product=" ".join(head[1:]),
                bus_id=normal_bus_id(match.group(1)),
                virt=state[5],
            )
        )
    return cards


def parse_profiles(output: str) -> list[Profile]:
    """The rows of ``efsmi -i IDX --drs --list-profile``."""
    profiles = []
    for line in output.splitlines():
        if not PROFILE.search(line):
            continue
        fields = line.strip().strip("|").split()
        try:
            count = int(fields[3])
            profiles.append(Profile(fields[1], fields[2], count, fields[4], fields[5]))
            _profile_match(fields[1])
        except (IndexError, ValueError, EfsmiError):
            raise EfsmiError("unparseable", f"efsmi profile row not understood: {line!r}") from None
    return profiles


def parse_instances(output: str) -> list[Instance]:
    """The rows of ``efsmi [-i IDX] -L``."""
    instances = []
    for line in output.splitlines():
        if not PROFILE.search(line):
            continue
        fields = line.strip().strip("|").split()
        if len(fields) < 4 or not fields[0].isdigit():
            raise EfsmiError("unparseable", f"efsmi instance row not understood: {line!r}")
        instances.append(Instance(int(fields[0]), fields[1], fields[2], fields[3]))
    return instances


def _collect(
    child: subprocess.Popen[bytes], shown: str, timeout: float
) -> tuple[bytes, bytes, int]:
    """Read the child's stdout and stderr until both end, each capped at
    :data:`_OUTPUT_LIMIT` while reading (the caller kills a child that passes it or the time
    limit); ``(stdout, stderr, exit status)``."""
    deadline = time.monotonic() + timeout
    buffers: dict[int, bytearray] = {}
    with selectors.DefaultSelector() as selector:
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                buffers[pipe.fileno()] = bytearray()
                selector.register(pipe.fileno(), selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise EfsmiError("timeout", f"{shown} did not finish within {timeout:g}s (killed)")
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                buffer = buffers[key.fd]
                buffer += chunk
                if len(buffer) > _OUTPUT_LIMIT:
                    raise EfsmiError(
                        "unparseable",
                        f"{shown} wrote more than {_OUTPUT_LIMIT} bytes, which is not an efsmi "
                        "table (killed)",
                    )
    try:
        status = child.wait(max(deadline - time.monotonic(), 0.001))
    except subprocess.TimeoutExpired:
        raise EfsmiError(
            "timeout", f"{shown} did not finish within {timeout:g}s (killed)"
        ) from None
    out = bytes(buffers[child.stdout.fileno()]) if child.stdout is not None else b""
    err = bytes(buffers[child.stderr.fileno()]) if child.stderr is not None else b""
    return out, err, status


class Efsmi:
    """Runs ``efsmi`` (``binary``: a path, or a name looked up on PATH) with a time limit."""

    def __init__(self, binary: str = "efsmi", *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.binary = binary
        self.timeout = timeout

    def _run(self, *args: str) -> str:
        command = [self.binary, *args]
        shown = " ".join(command)
        # A small environment: efsmi needs PATH and its library path, nothing of ours.
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "LD_LIBRARY_PATH", "HOME")}
        try:
            child = subprocess.Popen(  # an argument vector, never a shell
                command,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except FileNotFoundError:
            raise EfsmiError("missing", f"cannot run {shown}: {self.binary} not found") from None
        except PermissionError as exc:
            raise EfsmiError("missing", f"cannot run {shown}: {exc}") from None
        try:
            stdout, stderr, status = _collect(child, shown, self.timeout)
        finally:
            if child.poll() is None:
                child.kill()  # out of time or talking too much: it gets no more
            child.wait()
            for pipe in (child.stdout, child.stderr):
                if pipe is not None:
                    pipe.close()
        output = stdout.decode(errors="replace")
        if status != 0:
            said = (stderr or stdout)[:400].decode(errors="replace").strip()
            # efsmi names a card it does not have (unplugged, fallen off the bus) this way.
            reason = "not-found" if _INVALID_INDEX.search(said) else "failed"
            raise EfsmiError(
                reason, f"{shown} failed (exit status {status}): {said or 'no output'}"
            )
        return output

    def cards(self) -> list[EfsmiCard]:
        """Every card efsmi sees."""
        return parse_cards(self._run())

    def card_for(self, bus_id: str) -> EfsmiCard:
        """The card at a PCI address (``not-found`` when efsmi does not list it)."""
        wanted = normal_bus_id(bus_id)
        found = self.cards()
        for card in found:
            if card.bus_id == wanted:
                return card
        listed = ", ".join(c.bus_id for c in found) or "none"
        raise EfsmiError("not-found", f"efsmi lists no card at {wanted}; it lists: {listed}")

    def set_drs(self, index: int, on: bool) -> None:
        """Turn DRS on or off on one card."""
        self._run("-i", str(index), "--drs", "on" if on else "off")

    def profiles(self, index: int) -> list[Profile]:
        """The DRS profiles one card offers."""
        return parse_profiles(self._run("-i", str(index), "--drs", "--list-profile"))

    def instances(self, index: int | None = None) -> list[Instance]:
        """DRS instances of one card, or of every card."""
        args: Sequence[str] = ("-L",) if index is None else ("-i", str(index), "-L")
        return parse_instances(self._run(*args))

    def create_instance(
        self, index: int, profile_id: str, before: Collection[str] | None = None
    ) -> Instance:
        """Create an instance of ``profile_id`` on a card; returns it (found by its new UUID).

        ``before``: the card's UUIDs listed just before (saves listing them again)."""
        if before is None:
            before = {i.uuid for i in self.instances(index)}
        self._run("-i", str(index), "--drs", "--create-instance", profile_id)
        new = [i for i in self.instances(index) if i.uuid not in before]
        if len(new) != 1:
            raise EfsmiError(
                "unparseable",
                f"efsmi created an instance of profile {profile_id} on card {index} but -L shows "
                f"{len(new)} new instance(s)",
            )
        return new[0]

    def destroy_instance(self, index: int, instance_id: str, uuid: str | None = None) -> bool:
        """Destroy an instance; False when the card has no such instance (already gone).

        With ``uuid``, an instance whose id was reused by a newer instance counts as gone: the
        newer one is someone else's.
        """
        if all(
            i.instance_id != instance_id or (uuid is not None and i.uuid != uuid)
            for i in self.instances(index)
        ):
            return False
        self._run("-i", str(index), "--drs", "--destroy-instance", instance_id)
        return True
