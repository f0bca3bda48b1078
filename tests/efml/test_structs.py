"""The binding's ctypes structs and the simulated library's C header have EFML.md §3's layouts
(x86-64 sizes and offsets, as the vendor's efml.h compiles with gcc)."""

from __future__ import annotations

import ctypes
import os
import subprocess

import pytest

from enflame_gcu.efml import types
from enflame_gcu.simulation import efmlsim

# ../shared/EFML.md §3: struct -> size, and the offsets the table states.
SIZES = {
    "efmlDeviceInfo_t": 156,
    "efmlDevPowerInfo_t": 8,
    "efmlDevMemInfo_t": 16,
    "efmlDevClkInfo_t": 8,
    "efmlDevThermalInfoV2_t": 12,
    "efmlDevThermalInfo_t": 12,
    "efmlPcieLinkInfo_t": 16,
    "efmlPcieThroughputInfo_t": 24,
    "efmlEccStatus_t": 12,
    "efmlRmaStatus_t": 2,
    "efmlRmaDetails_t": 8,
    "efmlEvent_t": 136,
    "efmlProcessInfo_t": 24,
}
OFFSETS = {
    ("efmlDevMemInfo_t", "mem_total_size"): 0,
    ("efmlDevMemInfo_t", "mem_used"): 8,
    ("efmlPcieThroughputInfo_t", "tx_nak"): 8,
    ("efmlPcieThroughputInfo_t", "rx_nak"): 16,
    ("efmlEccStatus_t", "pending"): 1,
    ("efmlEccStatus_t", "pdblack"): 2,
    ("efmlEccStatus_t", "ecnt_sb"): 4,
    ("efmlEccStatus_t", "ecnt_db"): 8,
    ("efmlRmaDetails_t", "dbe_count"): 4,
    ("efmlEvent_t", "event_type"): 4,
    ("efmlEvent_t", "event_msg"): 8,
    ("efmlProcessInfo_t", "dev_mem_usage"): 8,
    ("efmlProcessInfo_t", "sys_mem_usage"): 16,
    ("efmlDeviceInfo_t", "logic_id"): 152,
}


def test_every_struct_of_the_table_is_bound() -> None:
    assert set(types.STRUCTS) == set(SIZES)


@pytest.mark.parametrize("name", sorted(SIZES))
def test_ctypes_struct_has_the_documented_size(name: str) -> None:
    assert ctypes.sizeof(types.STRUCTS[name]) == SIZES[name]


@pytest.mark.parametrize(("name", "field"), sorted(OFFSETS))
def test_ctypes_field_sits_at_the_documented_offset(name: str, field: str) -> None:
    assert getattr(types.STRUCTS[name], field).offset == OFFSETS[(name, field)]


def test_the_c_header_has_the_same_layouts(tmp_path: object) -> None:
    """gcc compiles a probe against the simulated library's header and prints every layout."""
    lines = [f'printf("{n} %zu\\n", sizeof({n}));' for n in SIZES]
    lines += [f'printf("{n}.{f} %zu\\n", offsetof({n}, {f}));' for n, f in OFFSETS]
    source = os.path.join(str(tmp_path), "probe.c")
    with open(source, "w", encoding="utf-8") as handle:
        handle.write(
            '#include <stddef.h>\n#include <stdio.h>\n#include "efml_types.h"\n'
            "int main(void) {\n" + "\n".join(lines) + "\nreturn 0;\n}\n"
        )
    binary = os.path.join(str(tmp_path), "probe")
    subprocess.run(
        ["gcc", "-Wall", "-Werror", "-I", efmlsim.source_dir(), "-o", binary, source],
        check=True,
        timeout=60,
    )
    printed = subprocess.run([binary], capture_output=True, text=True, check=True).stdout
    got = dict(line.split(" ") for line in printed.splitlines())
    expected = {n: str(s) for n, s in SIZES.items()}
    expected |= {f"{n}.{f}": str(o) for (n, f), o in OFFSETS.items()}
    assert got == expected


def test_every_return_code_of_efml_h_has_its_name() -> None:
    assert types.code_name(0) == "EFML_SUCCESS"
    assert types.code_name(3) == "EFML_ERROR_NOT_SUPPORTED"
    assert types.code_name(12) == "EFML_ERROR_NO_DEVICE"
    assert types.code_name(253) == "EFML_ERROR_TIMEOUT"
    assert types.code_name(254) == "EFML_ERROR_FAIL"
    assert types.code_name(77) == "EFML_UNKNOWN_77"
    assert sorted(types.RETURN_CODES) == [*range(14), 253, 254, 255]
