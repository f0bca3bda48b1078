"""``make demo`` tells the whole story and exits 0 without leaving anything behind."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_demo_runs_the_manual_scenario_and_heals() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "enflame_gcu.simulation.demo"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "called Allocate(gcu0, gcu1)" in out
    assert "called Allocate(gcu4, gcu5)" in out
    assert "env     ENFLAME_VISIBLE_DEVICES=0,1" in out
    assert "gcu0 held by default/pod1: usage 87.5, 71 °C, 30 GiB used, PCIe x16" in out
    assert "re-registered in" in out
    assert "gcu3    Unhealthy" in out
    assert "gcu3 Healthy again" in out
    # The last step starts a real runc container through our runtime with pod1's answer.
    assert "inside the container: gcu0 gcu1 gcuctl\n" in out
    assert "the node's other 6 cards stay out of this container" in out
    assert "exit status 0" in out and "socket removed: yes" in out
    assert out.rstrip().endswith("Demo finished.")
    # It ends by saying what to try next (issue 50 point 5), each a real target or command.
    after = out.split("What to try next:", 1)[1]
    for target in (
        "make test",
        "make demo-cluster",
        "enflame-ctk sim create",
        "docs/user-guide.md",
    ):
        assert target in after, after
    with open(os.path.join(ROOT, "Makefile"), encoding="utf-8") as handle:
        makefile = handle.read()
    assert "\ntest:" in makefile and "\ndemo-cluster:" in makefile
    assert os.path.exists(os.path.join(ROOT, "docs", "user-guide.md"))
    # Nothing of the demo's plugin survives it, and its temp dir is gone.
    plugin_dir = out.split("--plugin-dir ", 1)[1].split()[0]
    running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert plugin_dir.startswith("/tmp/gcu-")
    assert plugin_dir not in running
    assert not os.path.exists(plugin_dir)
