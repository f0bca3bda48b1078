"""libefml's return codes, enums and struct layouts (efml.h 1.2.3.5, x86-64; EFML.md §1, §3)."""

from __future__ import annotations

import ctypes

# efmlReturn_t; 5 and 7 had other names in an older efml.h (EFML.md §1).
RETURN_CODES = {
    0: "EFML_SUCCESS",
    1: "EFML_ERROR_UNINITIALIZED",
    2: "EFML_ERROR_INVALID_ARGUMENT",
    3: "EFML_ERROR_NOT_SUPPORTED",
    4: "EFML_ERROR_LIBRARY_NOT_FOUND",
    5: "EFML_ERROR_INVALID_ERROR_CODE",
    6: "EFML_ERROR_DRIVER_NOT_LOADED",
    7: "EFML_ERROR_GCU_LARE_PORT_NUMBER_ERR",
    8: "EFML_ERROR_INVALID_INPUT",
    9: "EFML_ERROR_FUNCTION_NOT_FOUND",
    10: "EFML_ERROR_OPEN_DRIVER_VERSION",
    11: "EFML_ERROR_DRIVER_NOT_COMPATIBLE",
    12: "EFML_ERROR_NO_DEVICE",
    13: "EFML_ERROR_DEPRECATION",
    253: "EFML_ERROR_TIMEOUT",
    254: "EFML_ERROR_FAIL",
    255: "EFML_ERROR_MAX",
}
SUCCESS = 0
NOT_SUPPORTED = 3
TIMEOUT = 253
MAX_CHAR_BUFF_LEN = 128
# EfmlGetVdevList takes no capacity: the list must hold the vendor's maximum (GCU_VDEV_MAX 128,
# EFML.md section 1), not the Go wrapper's 32, or a card with more vGCUs writes past it.
VDEV_LIST_LEN = 128
HW_ARCH = {0: "GCU200", 1: "GCU210", 2: "GCU300"}
GCU300 = 2
VIRT_MODES = {0: "host", 1: "vgcu", 2: "mdev", 3: "sriov_pf", 4: "sriov_vf"}
POWER_MODES = {1: "active", 5: "suspend", 7: "sleep"}
EVENT_TYPES = {0: "unknown", 3: "dtu_suspend", 10: "reset_start", 11: "reset_finish", 20: "dtu_eid"}


def code_name(code: int) -> str:
    """``EFML_ERROR_…`` for a return code; ``EFML_UNKNOWN_<n>`` for one efml.h does not list."""
    return RETURN_CODES.get(code, f"EFML_UNKNOWN_{code}")


class DeviceInfo(ctypes.Structure):
    """efmlDeviceInfo_t (156 B)."""

    _fields_ = [
        ("name", ctypes.c_char * 128),
        ("vendor_id", ctypes.c_uint32),
        ("device_id", ctypes.c_uint32),
        ("domain_id", ctypes.c_uint32),
        ("bus_id", ctypes.c_uint32),
        ("dev_id", ctypes.c_uint32),
        ("func_id", ctypes.c_uint32),
        ("logic_id", ctypes.c_uint32),
    ]


class PowerInfo(ctypes.Structure):
    """efmlDevPowerInfo_t (8 B)."""

    _fields_ = [("pwr_capability", ctypes.c_float), ("cur_pwr_consumption", ctypes.c_float)]


class MemInfo(ctypes.Structure):
    """efmlDevMemInfo_t and efmlClusterHbmMemInfo_t (16 B): total in bytes, used in MiB."""

    _fields_ = [("mem_total_size", ctypes.c_uint64), ("mem_used", ctypes.c_uint32)]


class ClockInfo(ctypes.Structure):
    """efmlDevClkInfo_t (8 B)."""

    _fields_ = [("cur_hbm_clock", ctypes.c_uint32), ("cur_dtu_clock", ctypes.c_uint32)]


class ThermalInfoV2(ctypes.Structure):
    """efmlDevThermalInfoV2_t (12 B)."""

    _fields_ = [
        ("cur_asic_temp", ctypes.c_float),
        ("cur_mem_temp", ctypes.c_float),
        ("cur_board_temp", ctypes.c_float),
    ]


class ThermalInfo(ctypes.Structure):
    """efmlDevThermalInfo_t (12 B), the legacy call's."""

    _fields_ = [
        ("cur_dev_temp", ctypes.c_float),
        ("cur_hbm0_temp", ctypes.c_float),
        ("cur_hbm1_temp", ctypes.c_float),
    ]


class PcieLinkInfo(ctypes.Structure):
    """efmlPcieLinkInfo_t (16 B): four 4-byte enums."""

    _fields_ = [
        ("link_speed", ctypes.c_int32),
        ("max_link_speed", ctypes.c_int32),
        ("link_width", ctypes.c_int32),
        ("max_link_width", ctypes.c_int32),
    ]


class PcieThroughputInfo(ctypes.Structure):
    """efmlPcieThroughputInfo_t (24 B)."""

    _fields_ = [
        ("tx_throughput", ctypes.c_float),
        ("rx_throughput", ctypes.c_float),
        ("tx_nak", ctypes.c_uint64),
        ("rx_nak", ctypes.c_uint64),
    ]


class EccStatus(ctypes.Structure):
    """efmlEccStatus_t (12 B)."""

    _fields_ = [
        ("enabled", ctypes.c_bool),
        ("pending", ctypes.c_bool),
        ("pdblack", ctypes.c_bool),
        ("ecnt_sb", ctypes.c_uint32),
        ("ecnt_db", ctypes.c_uint32),
    ]


class RmaStatus(ctypes.Structure):
    """efmlRmaStatus_t (2 B)."""

    _fields_ = [("is_dtu_support_rma", ctypes.c_bool), ("flags", ctypes.c_bool)]


class RmaDetails(ctypes.Structure):
    """efmlRmaDetails_t (8 B)."""

    _fields_ = [
        ("is_dtu_support_rma", ctypes.c_bool),
        ("flags", ctypes.c_bool),
        ("dbe_count", ctypes.c_uint32),
    ]


class Event(ctypes.Structure):
    """efmlEvent_t (136 B)."""

    _fields_ = [
        ("event_id", ctypes.c_uint32),
        ("event_type", ctypes.c_int32),
        ("event_msg", ctypes.c_char * 128),
    ]


class ProcessInfo(ctypes.Structure):
    """efmlProcessInfo_t (24 B)."""

    _fields_ = [
        ("pid", ctypes.c_uint32),
        ("dev_mem_usage", ctypes.c_uint64),
        ("sys_mem_usage", ctypes.c_uint64),
    ]


STRUCTS: dict[str, type[ctypes.Structure]] = {
    "efmlDeviceInfo_t": DeviceInfo,
    "efmlDevPowerInfo_t": PowerInfo,
    "efmlDevMemInfo_t": MemInfo,
    "efmlDevClkInfo_t": ClockInfo,
    "efmlDevThermalInfoV2_t": ThermalInfoV2,
    "efmlDevThermalInfo_t": ThermalInfo,
    "efmlPcieLinkInfo_t": PcieLinkInfo,
    "efmlPcieThroughputInfo_t": PcieThroughputInfo,
    "efmlEccStatus_t": EccStatus,
    "efmlRmaStatus_t": RmaStatus,
    "efmlRmaDetails_t": RmaDetails,
    "efmlEvent_t": Event,
    "efmlProcessInfo_t": ProcessInfo,
}


# Every function the binding calls, with its argument types (efml.h; EFML.md section 2): one table,
# applied as ``argtypes`` whenever a function is looked up, so a wrong argument is a Python error
# and never a C call with a mis-sized value.
_U32 = ctypes.c_uint32
_P = ctypes.POINTER
_TEXT = (_U32, ctypes.c_char_p)  # (dev_idx, char[128] out)
SIGNATURES: dict[str, tuple[type, ...]] = {
    "EfmlInit": (ctypes.c_bool,),
    "EfmlShutdown": (),
    "EfmlErrorString": (ctypes.c_int, ctypes.c_char_p),
    "EfmlGetDriverVer": (ctypes.c_char_p,),
    "EfmlGetLibVer": (ctypes.c_char_p,),
    "EfmlGetDevCount": (_P(_U32),),
    "EfmlGetDevName": _TEXT,
    "EfmlGetDevUuid": _TEXT,
    "EfmlGetDevSn": _TEXT,
    "EfmlGetDevPn": _TEXT,
    "EfmlGetDevSKU": _TEXT,
    "EfmlGetFwVersion": _TEXT,
    "EfmlGetDevSlotOamName": _TEXT,
    "EfmlGetDevInfo": (_U32, _P(DeviceInfo)),
    "EfmlGetHwArch": (_U32, _P(ctypes.c_int32)),
    "EfmlGetDevMem": (_U32, _P(MemInfo)),
    "EfmlGetVdevMem": (_U32, _U32, _P(MemInfo)),
    "EfmlGetDevDtuUsageAsync": (_U32, _P(ctypes.c_float)),
    "EfmlGetDevSipUsage": (_U32, _P(ctypes.c_float)),
    "EfmlGetClusterCount": (_U32, _P(_U32)),
    "EfmlGetDevClusterUsage": (_U32, _U32, _P(ctypes.c_float)),
    "EfmlGetPGCount": (_U32, _P(_U32)),
    "EfmlGetDevPGUsageAsync": (_U32, _U32, _P(ctypes.c_float)),
    "EfmlGetVdevDtuUsage": (_U32, _U32, _P(ctypes.c_float)),
    "EfmlGetVdevList": (_U32, _P(_U32), _P(_U32)),
    "EfmlGetDevClk": (_U32, _P(ClockInfo)),
    "EfmlGetMaxFreq": (_U32, _P(_U32)),
    "EfmlGetMemClk": (_U32, _P(_U32)),
    "EfmlGetDevTempV2": (_U32, _P(ThermalInfoV2)),
    "EfmlGetDevTemp": (_U32, _P(ThermalInfo)),
    "EfmlGetDevPwr": (_U32, _P(PowerInfo)),
    "EfmlGetPowerMode": (_U32, _P(ctypes.c_int32)),
    "EfmlGetDevIsLowPowerMode": (_U32, _P(ctypes.c_bool)),
    "EfmlGetDevEccStatus": (_U32, _P(EccStatus)),
    "EfmlGetDevRmaDetails": (_U32, _P(RmaDetails)),
    "EfmlGetPcieLinkInfo": (_U32, _P(PcieLinkInfo)),
    "EfmlGetPcieThroughput": (_U32, _P(PcieThroughputInfo)),
    "EfmlGetGcuVirtStatus": (_U32, _P(ctypes.c_int32)),
    "EfmlGetEvent": (ctypes.c_int, _P(Event)),
    "EfmlGetEventV2": (_U32, _P(Event)),
}
