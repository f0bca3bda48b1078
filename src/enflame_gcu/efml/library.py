"""Find, load and initialise libefml; typed wrappers over its calls, in base units.

Loading follows gcu-exporter (EFML.md §1): the names libefml.so, .so.1, .so.2, .so.2.1, .so.2.0,
.so.1.0.0 in the loader's search path, then /usr/lib/, /usr/lib64/, /usr/lib/x86_64-linux-gnu/;
first hit wins. In a container the host's / is mounted elsewhere, so the same directories are
tried under the host root first (and an explicit path before everything). A function the loaded
library lacks raises :class:`~enflame_gcu.errors.EfmlNotSupported` ("not supported by this
libefml") when called, as cgo's lazily bound symbols do. Every wrapper returns Python values:
bytes for memory, degrees Celsius, and the library's own numbers where efml.h states no unit
(usage, power, clocks, PCIe throughput; docs/metrics.md says which).

EfmlInit and EfmlShutdown never run while another call is inside the library: the collector
reads cards on several threads and events on one more, and a re-initialisation (after a driver
reload) under a call in flight is what crashes a library built for one caller at a time. Calls
share the library with each other; init and shutdown wait until it is empty, and calls that
arrive meanwhile wait behind them (so a steady stream of calls cannot starve them). A call that
never returns keeps init out: after ``EXCLUSIVE_WAIT`` seconds init gives up with EfmlTimeout
rather than initialise under it (and is tried again on the next occasion).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from enflame_gcu import fileio
from enflame_gcu.efml import types
from enflame_gcu.errors import EfmlError, EfmlNotSupported, EfmlTimeout, PathOutsideRootError

NAMES = (
    "libefml.so",
    "libefml.so.1",
    "libefml.so.2",
    "libefml.so.2.1",
    "libefml.so.2.0",
    "libefml.so.1.0.0",
)
DIRS = ("", "/usr/lib/", "/usr/lib64/", "/usr/lib/x86_64-linux-gnu/")
MiB = 1 << 20
NO_VDEV = 65536  # the wrapper's "vGCUs unsupported" list entry
EXCLUSIVE = frozenset({"EfmlInit", "EfmlShutdown"})
EXCLUSIVE_WAIT = 10.0  # seconds init/shutdown wait for the calls inside to return


def candidates(host_root: str = "/", explicit: str | None = None) -> list[str]:
    """Paths to try, in order: ``explicit``, the directories under the host root, then the
    vendor's order (bare names through the loader, then each directory)."""
    found = [explicit] if explicit else []
    if os.path.normpath(host_root) != "/":
        for folder in DIRS[1:]:
            found += [fileio.host_path(host_root, folder + name) for name in NAMES]
    for folder in DIRS:
        found += [folder + name for name in NAMES]
    return found


def locate(host_root: str, path: str) -> str:
    """``path`` with its links followed hop by hop, a path under the host root kept inside it
    (an absolute link target such as ``/usr/local/efsmi/...`` is the host's, found under the
    host root, never this container's own); other paths as the OS resolves them."""
    if os.path.normpath(host_root) != "/":
        base = os.path.abspath(host_root).rstrip("/") + "/"
        if os.path.abspath(path).startswith(base):
            return fileio.resolve(host_root, "/" + os.path.relpath(path, base))
    return os.path.realpath(path)


@dataclass(frozen=True, slots=True)
class Identity:
    """efmlDeviceInfo_t as values: the PCI address as a BDF string."""

    name: str
    vendor_id: int
    device_id: int
    bdf: str
    logic_id: int


@dataclass(frozen=True, slots=True)
class Memory:
    """Total and used device memory in bytes (the library reports used in MiB)."""

    total_bytes: int
    used_bytes: int


@dataclass(frozen=True, slots=True)
class Temperatures:
    """Degrees Celsius; ``board`` only from the GCU300 call, ``mem`` is HBM0 on older ones."""

    asic: float
    mem: float
    board: float | None


@dataclass(frozen=True, slots=True)
class Power:
    """The library's numbers; efml.h states no unit (the vendor's tools show watts)."""

    consumption: float
    capability: float


@dataclass(frozen=True, slots=True)
class Clocks:
    """Current clocks, probably MHz (efml.h states no unit; its sibling calls use MHz)."""

    dtu: int
    hbm: int


@dataclass(frozen=True, slots=True)
class Ecc:
    """ECC state and error counts (double-bit from the RMA details when ECC gives none)."""

    enabled: bool
    single_bit: int
    double_bit: int


@dataclass(frozen=True, slots=True)
class PcieLink:
    """PCIe generation (1-5) and lanes, current and maximum."""

    generation: int
    max_generation: int
    width: int
    max_width: int


@dataclass(frozen=True, slots=True)
class PcieThroughput:
    """Throughput in the library's unit (unstated) and NAK counts."""

    tx: float
    rx: float
    tx_nak: int
    rx_nak: int


def ignore_user_signals() -> None:
    """The library uses SIGUSR1: ignore SIGUSR1/2 as gcu-exporter does (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)


class _Gate:
    """Many calls inside at once, or one init/shutdown alone; a waiting init goes first."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._inside = 0
        self._exclusive = False
        self._waiting = 0  # inits/shutdowns waiting: new calls queue behind them

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            while self._exclusive or self._waiting:
                self._changed.wait()
            self._inside += 1
        try:
            yield
        finally:
            with self._changed:
                self._inside -= 1
                self._changed.notify_all()

    @contextlib.contextmanager
    def alone(self, what: str, timeout: float) -> Iterator[None]:
        deadline = time.monotonic() + timeout
        with self._changed:
            self._waiting += 1
            try:
                while self._exclusive or self._inside:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise EfmlTimeout(
                            what,
                            types.TIMEOUT,
                            "timeout",
                            f"{self._inside} libefml call(s) still inside after {timeout:g} s; "
                            "not run under them",
                        )
                    self._changed.wait(left)
            finally:
                self._waiting -= 1
                self._changed.notify_all()
            self._exclusive = True
        try:
            yield
        finally:
            with self._changed:
                self._exclusive = False
                self._changed.notify_all()

    def inside(self) -> int:
        """Calls inside the library right now."""
        with self._changed:
            return self._inside


class Library:
    """One loaded libefml; call :meth:`init` before anything else. Thread-safe: see the module
    docstring for how init and shutdown are kept apart from every other call."""

    def __init__(self, handle: ctypes.CDLL, path: str) -> None:
        self.handle = handle
        self.path = path
        self.gate = _Gate()
        self.exclusive_wait = EXCLUSIVE_WAIT

    @classmethod
    def load(cls, host_root: str = "/", explicit: str | None = None) -> Library:
        """The first library that loads; EfmlError LIBRARY_NOT_FOUND lists what was tried and
        names every dangling candidate (a link whose target is not there)."""
        tried, dangling = [], []
        for path in candidates(host_root, explicit):
            target = path
            if "/" in path:
                try:
                    target = locate(host_root, path)
                except PathOutsideRootError as exc:
                    dangling.append(str(exc))
                    continue
                if not os.path.exists(target):
                    if os.path.lexists(path):
                        dangling.append(
                            f"{path} -> {os.readlink(path)} (dangling: {target} missing)"
                        )
                    continue
            try:
                handle = ctypes.CDLL(target, mode=os.RTLD_LAZY | os.RTLD_GLOBAL)
            except OSError as exc:
                tried.append(f"{path}: {exc}")
                continue
            return cls(handle, target)
        detail = "tried " + ", ".join(candidates(host_root, explicit)[:8]) + " and the rest"
        if dangling:
            detail += "; dangling: " + "; ".join(dangling[:3])
        if tried:
            detail += "; failed to load: " + "; ".join(tried[:3])
        raise EfmlError("dlopen", 4, types.code_name(4), detail)

    def function(self, name: str) -> Callable[..., int]:
        """The exported function ``name`` with its argument types from :data:`types.SIGNATURES`
        (a name missing there is a bug: ValueError); EfmlNotSupported when the library lacks it."""
        try:
            argtypes = types.SIGNATURES[name]
        except KeyError:
            raise ValueError(f"{name} has no signature in efml.types.SIGNATURES") from None
        try:
            found = getattr(self.handle, name)
        except AttributeError:
            raise EfmlNotSupported(
                name, types.NOT_SUPPORTED, "not supported by this libefml", self.path
            ) from None
        found.argtypes = argtypes
        found.restype = None if name == "EfmlShutdown" else ctypes.c_int
        return found  # type: ignore[no-any-return]

    def has(self, name: str) -> bool:
        """Whether the library exports ``name`` (EFML.md's optional, dlsym-probed calls)."""
        return hasattr(self.handle, name)

    def call(self, name: str, *args: Any) -> None:
        """Call ``name``; a non-zero return raises EfmlError named after the code. EfmlInit and
        EfmlShutdown run alone (EfmlTimeout when the library does not empty in time)."""
        function = self.function(name)
        gate = (
            self.gate.alone(name, self.exclusive_wait) if name in EXCLUSIVE else self.gate.shared()
        )
        with gate:
            code = int(function(*args))
            if code == types.SUCCESS:
                return
            text = self._error_string(code)
        kind = EfmlNotSupported if code == types.NOT_SUPPORTED else EfmlError
        raise kind(name, code, types.code_name(code), text)

    def error_string(self, code: int) -> str:
        """The library's text for a code ("" when it has none)."""
        with self.gate.shared():
            return self._error_string(code)

    def _error_string(self, code: int) -> str:
        if not self.has("EfmlErrorString"):
            return ""
        buffer = ctypes.create_string_buffer(types.MAX_CHAR_BUFF_LEN)
        if int(self.function("EfmlErrorString")(ctypes.c_int(code), buffer)) != types.SUCCESS:
            return ""
        return buffer.value.decode(errors="replace")

    # --- node -----------------------------------------------------------------------------

    def init(self, no_driver: bool = False) -> None:
        """EfmlInit(no_driver); gcu-exporter passes False."""
        self.call("EfmlInit", ctypes.c_bool(no_driver))

    def shutdown(self) -> None:
        """EfmlShutdown (returns void), alone in the library."""
        if self.has("EfmlShutdown"):
            function = self.function("EfmlShutdown")
            with self.gate.alone("EfmlShutdown", self.exclusive_wait):
                function()

    def reinit(self, no_driver: bool = False) -> None:
        """EfmlShutdown then EfmlInit with no call between them (after a driver reload)."""
        init = self.function("EfmlInit")
        with self.gate.alone("EfmlInit", self.exclusive_wait):
            if self.has("EfmlShutdown"):
                self.function("EfmlShutdown")()
            code = int(init(ctypes.c_bool(no_driver)))
            text = "" if code == types.SUCCESS else self._error_string(code)
        if code != types.SUCCESS:
            raise EfmlError("EfmlInit", code, types.code_name(code), text)

    def _text(self, name: str, *args: Any) -> str:
        buffer = ctypes.create_string_buffer(types.MAX_CHAR_BUFF_LEN)
        self.call(name, *args, buffer)
        return buffer.value.decode(errors="replace").strip()

    def driver_version(self) -> str:
        """EfmlGetDriverVer."""
        return self._text("EfmlGetDriverVer")

    def library_version(self) -> str:
        """EfmlGetLibVer."""
        return self._text("EfmlGetLibVer")

    def device_count(self) -> int:
        """EfmlGetDevCount."""
        count = ctypes.c_uint32()
        self.call("EfmlGetDevCount", ctypes.byref(count))
        return count.value

    # --- one card -------------------------------------------------------------------------

    def text(self, function: str, index: int) -> str:
        """A string getter (EfmlGetDevName, …Uuid, …Sn, …Pn, …SKU, EfmlGetFwVersion, …)."""
        return self._text(function, ctypes.c_uint32(index))

    def _u32(self, function: str, *args: int) -> int:
        value = ctypes.c_uint32()
        self.call(function, *(ctypes.c_uint32(a) for a in args), ctypes.byref(value))
        return value.value

    def _float(self, function: str, *args: int) -> float:
        value = ctypes.c_float()
        self.call(function, *(ctypes.c_uint32(a) for a in args), ctypes.byref(value))
        return float(value.value)

    def _struct(self, function: str, struct: Any, *args: int) -> Any:
        self.call(function, *(ctypes.c_uint32(a) for a in args), ctypes.byref(struct))
        return struct

    def identity(self, index: int) -> Identity:
        """EfmlGetDevInfo."""
        info = self._struct("EfmlGetDevInfo", types.DeviceInfo(), index)
        bdf = f"{info.domain_id:04x}:{info.bus_id:02x}:{info.dev_id:02x}.{info.func_id:x}"
        return Identity(
            info.name.decode(errors="replace"), info.vendor_id, info.device_id, bdf, info.logic_id
        )

    def hw_arch(self, index: int) -> int:
        """EfmlGetHwArch (optional): 0 GCU200, 1 GCU210, 2 GCU300."""
        value = ctypes.c_int32()
        self.call("EfmlGetHwArch", ctypes.c_uint32(index), ctypes.byref(value))
        return value.value

    def memory(self, index: int) -> Memory:
        """EfmlGetDevMem: used MiB converted to bytes."""
        info = self._struct("EfmlGetDevMem", types.MemInfo(), index)
        return Memory(int(info.mem_total_size), int(info.mem_used) * MiB)

    def vgcu_memory(self, index: int, vgcu: int) -> Memory:
        """EfmlGetVdevMem: one vGCU's memory, same conversion."""
        info = self._struct("EfmlGetVdevMem", types.MemInfo(), index, vgcu)
        return Memory(int(info.mem_total_size), int(info.mem_used) * MiB)

    def usage(self, index: int) -> float:
        """EfmlGetDevDtuUsageAsync (the library's sampler, as gcu-exporter reads it)."""
        return self._float("EfmlGetDevDtuUsageAsync", index)

    def sip_usage(self, index: int) -> float:
        """EfmlGetDevSipUsage (optional)."""
        return self._float("EfmlGetDevSipUsage", index)

    def cluster_usages(self, index: int) -> tuple[float, ...]:
        """EfmlGetClusterCount, then EfmlGetDevClusterUsage per cluster."""
        count = self._u32("EfmlGetClusterCount", index)
        return tuple(self._float("EfmlGetDevClusterUsage", index, c) for c in range(count))

    def pg_usages(self, index: int) -> tuple[float, ...]:
        """EfmlGetPGCount, then EfmlGetDevPGUsageAsync per processing group."""
        count = self._u32("EfmlGetPGCount", index)
        return tuple(self._float("EfmlGetDevPGUsageAsync", index, p) for p in range(count))

    def vgcu_usage(self, index: int, vgcu: int) -> float:
        """EfmlGetVdevDtuUsage."""
        return self._float("EfmlGetVdevDtuUsage", index, vgcu)

    def vgcu_ids(self, index: int) -> tuple[int, ...]:
        """EfmlGetVdevList: the card's vGCU indexes (empty when unsupported)."""
        ids = (ctypes.c_uint32 * types.VDEV_LIST_LEN)()
        count = ctypes.c_uint32()
        self.call("EfmlGetVdevList", ctypes.c_uint32(index), ids, ctypes.byref(count))
        found = tuple(int(ids[i]) for i in range(min(count.value, types.VDEV_LIST_LEN)))
        return () if NO_VDEV in found else found

    def clocks(self, index: int) -> Clocks:
        """EfmlGetDevClk."""
        info = self._struct("EfmlGetDevClk", types.ClockInfo(), index)
        return Clocks(int(info.cur_dtu_clock), int(info.cur_hbm_clock))

    def temperatures(self, index: int, arch: int | None) -> Temperatures:
        """EfmlGetDevTempV2 on a GCU300 only (the vendor's binding calls it nowhere else),
        falling back to the legacy EfmlGetDevTemp (asic = dev, mem = hbm0) when V2 is not
        supported; every other card, and one whose architecture is unknown, reads the legacy."""
        if arch == types.GCU300:
            try:
                v2 = self._struct("EfmlGetDevTempV2", types.ThermalInfoV2(), index)
            except EfmlNotSupported:
                pass
            else:
                return Temperatures(
                    float(v2.cur_asic_temp), float(v2.cur_mem_temp), float(v2.cur_board_temp)
                )
        old = self._struct("EfmlGetDevTemp", types.ThermalInfo(), index)
        return Temperatures(float(old.cur_dev_temp), float(old.cur_hbm0_temp), None)

    def max_clock(self, index: int) -> int:
        """EfmlGetMaxFreq: the DTU's maximum clock in MHz (declared in efml.h, not in the Go
        binding; a library without it is NOT_SUPPORTED)."""
        return self._u32("EfmlGetMaxFreq", index)

    def event(self, timeout_ms: int) -> tuple[int, int, str] | None:
        """EfmlGetEvent: the next node-wide event as (card id, type, message), or None when none
        arrives within ``timeout_ms`` (the library answers TIMEOUT)."""
        event = types.Event()
        try:
            self.call("EfmlGetEvent", ctypes.c_int(timeout_ms), ctypes.byref(event))
        except EfmlError as exc:
            if exc.code == types.TIMEOUT:
                return None
            raise
        return int(event.event_id), int(event.event_type), event.event_msg.decode(errors="replace")

    def power(self, index: int) -> Power:
        """EfmlGetDevPwr."""
        info = self._struct("EfmlGetDevPwr", types.PowerInfo(), index)
        return Power(float(info.cur_pwr_consumption), float(info.pwr_capability))

    def power_mode(self, index: int) -> int:
        """EfmlGetPowerMode (optional); else EfmlGetDevIsLowPowerMode: true 7, false 1."""
        if self.has("EfmlGetPowerMode"):
            value = ctypes.c_int32()
            self.call("EfmlGetPowerMode", ctypes.c_uint32(index), ctypes.byref(value))
            return value.value
        low = ctypes.c_bool()
        self.call("EfmlGetDevIsLowPowerMode", ctypes.c_uint32(index), ctypes.byref(low))
        return 7 if low.value else 1

    def ecc(self, index: int) -> Ecc:
        """EfmlGetDevEccStatus; EfmlGetDevRmaDetails' dbe_count stands in for a zero or
        unsupported double-bit count (EFML.md §2)."""
        try:
            status = self._struct("EfmlGetDevEccStatus", types.EccStatus(), index)
            enabled, sbe, dbe = bool(status.enabled), int(status.ecnt_sb), int(status.ecnt_db)
        except EfmlNotSupported:
            enabled, sbe, dbe = False, 0, 0
        if dbe == 0:
            try:
                rma = self._struct("EfmlGetDevRmaDetails", types.RmaDetails(), index)
            except EfmlNotSupported:
                pass
            else:
                dbe = int(rma.dbe_count) if rma.is_dtu_support_rma else dbe
        return Ecc(enabled, sbe, dbe)

    def pcie_link(self, index: int) -> PcieLink:
        """EfmlGetPcieLinkInfo: current and maximum generation and width."""
        info = self._struct("EfmlGetPcieLinkInfo", types.PcieLinkInfo(), index)
        return PcieLink(
            int(info.link_speed),
            int(info.max_link_speed),
            int(info.link_width),
            int(info.max_link_width),
        )

    def pcie_throughput(self, index: int) -> PcieThroughput:
        """EfmlGetPcieThroughput."""
        info = self._struct("EfmlGetPcieThroughput", types.PcieThroughputInfo(), index)
        return PcieThroughput(
            float(info.tx_throughput), float(info.rx_throughput), int(info.tx_nak), int(info.rx_nak)
        )

    def virt_mode(self, index: int) -> int:
        """EfmlGetGcuVirtStatus: 0 host, 1 vGCU, 2 mdev, 3 SR-IOV PF, 4 SR-IOV VF."""
        value = ctypes.c_int32()
        self.call("EfmlGetGcuVirtStatus", ctypes.c_uint32(index), ctypes.byref(value))
        return value.value
