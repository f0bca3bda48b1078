"""The binding against the simulated libefml: loading, init, every wrapper in base units, named
errors, a function the library lacks, and calls bounded so a hung card stalls nothing else."""

from __future__ import annotations

import pathlib
import threading
import time

import pytest

from enflame_gcu.efml import bounded, library, reading
from enflame_gcu.errors import EfmlError, EfmlNotSupported, EfmlTimeout
from enflame_gcu.simulation import efmlsim
from tests.conftest import MakeNode

MiB = 1 << 20


def test_search_order_is_explicit_then_host_root_then_the_vendors() -> None:
    found = library.candidates("/host", "/opt/x/libefml.so")
    assert found[0] == "/opt/x/libefml.so"
    assert found[1:3] == ["/host/usr/lib/libefml.so", "/host/usr/lib/libefml.so.1"]
    vendor = found[found.index("libefml.so") :]
    assert vendor[:6] == list(library.NAMES)  # bare names first, through the loader
    assert vendor[6] == "/usr/lib/libefml.so"
    assert vendor[-1] == "/usr/lib/x86_64-linux-gnu/libefml.so.1.0.0"
    assert library.candidates("/")[0] == "libefml.so"


def test_the_library_under_the_host_root_loads_and_counts_the_cards(node: str) -> None:
    lib = library.Library.load(node)
    assert lib.path == f"{node}/usr/lib/libefml.so"
    with pytest.raises(EfmlError, match="EFML_ERROR_UNINITIALIZED"):
        lib.device_count()
    lib.init()
    assert lib.device_count() == 2
    assert lib.driver_version() == "1.0.20230110"
    assert lib.library_version() == "1.2.3.5"


def test_no_library_is_library_not_found_naming_what_was_tried(tmp_path: object) -> None:
    with pytest.raises(EfmlError) as caught:
        library.Library.load(str(tmp_path))
    assert caught.value.name == "EFML_ERROR_LIBRARY_NOT_FOUND"
    assert caught.value.code == 4
    assert f"{tmp_path}/usr/lib/libefml.so" in str(caught.value)


def test_a_file_that_is_not_a_library_is_skipped_and_reported(tmp_path: object) -> None:
    bad = f"{tmp_path}/libefml.so"
    with open(bad, "w", encoding="utf-8") as handle:
        handle.write("not an ELF file\n")
    with pytest.raises(EfmlError, match="failed to load"):
        library.Library.load(str(tmp_path), explicit=bad)


def test_init_failure_is_named(node: str) -> None:
    efmlsim.set_values(node, "node", {"init_fail": "6"})
    lib = library.Library.load(node)
    with pytest.raises(EfmlError) as caught:
        lib.init()
    assert (caught.value.code, caught.value.name) == (6, "EFML_ERROR_DRIVER_NOT_LOADED")
    assert "Driver not loaded" in str(caught.value)  # the library's own text


def test_wrappers_return_values_in_base_units(node: str, lib: library.Library) -> None:
    efmlsim.set_values(
        node,
        "card1",
        {"mem_used_mib": "1536", "asic_temp": "71.5", "board_temp": "40", "power": "212.5",
         "ecc_sbe": "3", "ecc_dbe": "1", "link_width": "8", "usage": "42.5", "power_mode": "7"},
    )  # fmt: skip
    ident = lib.identity(1)
    assert (ident.bdf, ident.vendor_id, ident.logic_id) == ("0000:83:00.0", 0x1E36, 1)
    assert lib.memory(1) == library.Memory(48 << 30, 1536 * MiB)
    assert lib.temperatures(1, 2) == library.Temperatures(71.5, 36.0, 40.0)
    assert lib.power(1) == library.Power(212.5, 400.0)
    assert lib.ecc(1) == library.Ecc(True, 3, 1)
    assert lib.pcie_link(1) == library.PcieLink(4, 4, 8, 16)
    assert lib.usage(1) == 42.5
    assert lib.power_mode(1) == 7
    assert lib.clocks(1) == library.Clocks(1400, 1600)
    assert lib.vgcu_ids(1) == (4, 5, 6, 7)
    assert lib.vgcu_memory(1, 5).total_bytes == 12 << 30
    assert lib.cluster_usages(1) == (0.0, 0.0)
    assert lib.virt_mode(1) == 1
    assert lib.text("EfmlGetDevSn", 1) == "SIMSN000001"
    assert lib.hw_arch(0) == 2


def test_rma_dbe_count_stands_in_for_a_zero_double_bit_count(
    node: str, lib: library.Library
) -> None:
    efmlsim.set_values(node, "card0", {"ecc_dbe": "0", "rma_dbe": "5"})
    assert lib.ecc(0).double_bit == 5
    efmlsim.set_values(node, "card0", {"unsupported": "EfmlGetDevEccStatus"})
    assert lib.ecc(0) == library.Ecc(False, 0, 5)


def test_error_codes_are_named_and_not_supported_is_its_own_kind(
    node: str, lib: library.Library
) -> None:
    efmlsim.set_values(node, "card0", {"unsupported": "EfmlGetDevPwr"})
    with pytest.raises(EfmlNotSupported):
        lib.power(0)
    assert reading.read_card(lib, 0).power is None  # unsupported: that reading only
    efmlsim.set_values(node, "card0", {"fail": "254"})
    with pytest.raises(EfmlError) as caught:
        lib.memory(0)
    assert (caught.value.function, caught.value.name) == ("EfmlGetDevMem", "EFML_ERROR_FAIL")
    with pytest.raises(EfmlError, match="EFML_ERROR_FAIL"):
        reading.read_card(lib, 0)  # any other error ends the card's pass
    with pytest.raises(EfmlError, match="EFML_ERROR_INVALID_ARGUMENT"):
        lib.memory(9)


def test_a_function_the_library_lacks_is_not_supported_by_this_libefml(make_node: MakeNode) -> None:
    root = make_node("vgcu-2card")
    efmlsim.install(root, legacy=True)
    lib = library.Library.load(root)
    lib.init()
    assert not lib.has("EfmlGetDevSipUsage")
    with pytest.raises(EfmlNotSupported, match="not supported by this libefml"):
        lib.sip_usage(0)
    # The fallbacks gcu-exporter uses when the optional calls are missing.
    efmlsim.set_values(root, "card0", {"asic_temp": "55", "power_mode": "7"})
    assert lib.temperatures(0, None) == library.Temperatures(55.0, 36.0, None)
    assert lib.power_mode(0) == 7
    card = reading.read_card(lib, 0)
    assert (card.sip_usage, card.arch, card.virt_mode) == (None, None, None)
    assert card.temperatures is not None and card.temperatures.asic == 55.0


def test_a_hung_card_times_out_and_the_other_card_is_read(node: str, lib: library.Library) -> None:
    calls = bounded.BoundedCalls(timeout=0.3)
    efmlsim.set_values(node, "card1", {"hang": "1"})
    # The hung call never returns while "hang" is set: getting an answer at all is the bound.
    with pytest.raises(EfmlTimeout, match=r"did not answer within 0\.3 s"):
        calls.run("1", lambda: reading.read_card(lib, 1))
    # Still stuck: fails at once instead of queueing another call behind the hung one.
    with pytest.raises(EfmlTimeout, match="still blocked"):
        calls.run("1", lambda: reading.read_card(lib, 1))
    assert calls.run("0", lambda: reading.read_card(lib, 0)).identity.bdf == "0000:03:00.0"
    efmlsim.set_values(node, "card1", {"hang": None})
    deadline = time.monotonic() + 5
    while calls.stuck("1") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert calls.run("1", lambda: reading.read_card(lib, 1)).index == 1  # recovered
    assert calls.threads() == 2  # one worker per card, never more


def test_errors_inside_a_bounded_call_reach_the_caller() -> None:
    calls = bounded.BoundedCalls(timeout=1)

    def boom() -> int:
        raise EfmlError("EfmlGetDevMem", 254, "EFML_ERROR_FAIL")

    with pytest.raises(EfmlError, match="EFML_ERROR_FAIL"):
        calls.run("0", boom)
    assert calls.run("0", lambda: 7) == 7


def test_user_signals_are_ignored_before_the_library_loads() -> None:
    import signal

    before = signal.getsignal(signal.SIGUSR1), signal.getsignal(signal.SIGUSR2)
    try:
        library.ignore_user_signals()
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGUSR1, before[0])
        signal.signal(signal.SIGUSR2, before[1])


def test_init_passes_no_driver_as_a_c_bool(node: str) -> None:
    lib = library.Library.load(node)
    lib.init(no_driver=True)
    assert lib.device_count() == 2


def test_several_hung_cards_cost_one_timeout_not_one_each(make_node: MakeNode) -> None:
    root = make_node("vendor-8card")
    efmlsim.install(root)
    lib = library.Library.load(root)
    lib.init()
    for index in (1, 3, 5, 7):
        efmlsim.set_values(root, f"card{index}", {"hang": "1"})
    calls = bounded.BoundedCalls(timeout=2.0)
    work = [(str(i), lambda i=i: reading.read_card(lib, i), f"card {i}") for i in range(8)]
    started = time.monotonic()
    outcomes = calls.run_many(work)
    assert time.monotonic() - started < 6.0  # one deadline; one each would be 8 s or more
    hung = [i for i, o in enumerate(outcomes) if isinstance(o, EfmlTimeout)]
    read = [o.index for o in outcomes if isinstance(o, reading.CardReading)]
    assert (hung, read) == ([1, 3, 5, 7], [0, 2, 4, 6])
    for index in (1, 3, 5, 7):
        efmlsim.set_values(root, f"card{index}", {"hang": None})


def _overlaps(root: str) -> str:
    """What the simulated libefml wrote when init or shutdown found a call inside it."""
    path = pathlib.Path(root, efmlsim.EFML_DIR, "overlaps")
    return path.read_text(encoding="utf-8") if path.exists() else ""


def test_init_and_shutdown_wait_for_a_call_inside_the_library(
    node: str, lib: library.Library
) -> None:
    """The events thread sits in EfmlGetEvent (up to a second by design) when the collector
    re-initialises after a driver reload; before, shutdown and init ran under it."""
    answered: list[object] = []
    waiting = threading.Thread(target=lambda: answered.append(lib.event(600)))
    waiting.start()
    time.sleep(0.2)  # inside EfmlGetEvent, waiting for an event that does not come
    lib.shutdown()
    lib.init()
    waiting.join(10)
    assert answered == [None]  # its call ended normally (TIMEOUT: no event)
    assert _overlaps(node) == ""  # was "EfmlShutdown with 1 call(s) inside"
    assert lib.device_count() == 2


def test_a_call_that_never_returns_keeps_init_out_with_a_timeout(
    node: str, lib: library.Library
) -> None:
    """Init does not run under a hung card's call: it gives up, named, and works once the
    call has returned; calls made meanwhile are not lost."""
    lib.exclusive_wait = 0.5
    efmlsim.set_values(node, "card1", {"hang": "1"})
    stuck = threading.Thread(target=lambda: lib.memory(1))
    stuck.start()
    time.sleep(0.2)
    with pytest.raises(EfmlTimeout, match=r"1 libefml call\(s\) still inside"):
        lib.reinit()
    assert lib.memory(0).total_bytes > 0  # other calls go on after init gave up
    efmlsim.set_values(node, "card1", {"hang": None})
    stuck.join(10)
    lib.reinit()
    assert _overlaps(node) == ""
    assert lib.device_count() == 2
