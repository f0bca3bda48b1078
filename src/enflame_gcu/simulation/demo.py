"""``make demo``: the device plugin's whole job on a simulated 8-card node, told step by step."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from enflame_gcu import devices
from enflame_gcu.presentation import report
from enflame_gcu.simulation import efmlsim, simulate
from enflame_gcu.simulation.testing import containers, kubelet_stub, plugin_process

RESOURCE = "enflame.com/gcu"
WIDTH = 78


@dataclass(slots=True)
class DemoContext:
    """What later steps (and the runtime hook) can use."""

    root: str
    plugin_dir: str
    kubelet: kubelet_stub.KubeletStub
    plugin: plugin_process.PluginProcess
    pods: dict[str, dict[str, kubelet_stub.ContainerAllocation]]


def say(text: str = "") -> None:
    """Print and flush, so the story appears as it happens even through a pipe."""
    print(text, flush=True)


def step(number: int, title: str) -> None:
    """A step heading."""
    say()
    say(f"── {number}. {title} ".ljust(WIDTH, "─"))


def indent(text: str, prefix: str = "   ") -> str:
    """Indent every line of a block."""
    return "\n".join(prefix + line if line else line for line in text.splitlines())


def device_table(kubelet: kubelet_stub.KubeletStub) -> str:
    """The plugin's devices as the kubelet sees them, with who holds each."""
    holders = {
        device: f"{pod}/{container}"
        for pod, containers in kubelet.pods.items()
        for container, got in containers.items()
        for device in got.device_ids
    }
    plugin = kubelet.plugins.get(RESOURCE)
    numa = plugin.numa if plugin else {}
    rows = [("DEVICE", "HEALTH", "NUMA", "HELD BY")]
    for device, health in kubelet.devices().items():
        nodes = ",".join(str(n) for n in numa.get(device, ())) or "-"
        rows.append((device, health, nodes, holders.get(device, "-")))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.append(
        f"capacity {kubelet.capacity()}, allocatable {len(kubelet.allocatable())}, "
        f"free {len(kubelet.free())}"
    )
    return "\n".join(line.rstrip() for line in lines)


def allocate_response(response: Any) -> str:
    """An Allocate answer in a few readable lines."""
    lines = [f"env     {key}={value}" for key, value in sorted(response.envs.items())]
    lines += [
        f"device  {d.host_path} -> {d.container_path} ({d.permissions})" for d in response.devices
    ]
    lines += [f"mount   {m.host_path} -> {m.container_path}" for m in response.mounts]
    lines += [f"cdi     {d.name}" for d in response.cdi_devices]
    lines += [f"note    {key}={value}" for key, value in sorted(response.annotations.items())]
    return "\n".join(lines)


async def timed(
    kubelet: kubelet_stub.KubeletStub,
    action: Callable[[], Awaitable[None] | None],
    condition: Callable[[kubelet_stub.KubeletStub], bool],
    what: str,
) -> float:
    """Do something, wait until the kubelet sees its effect; milliseconds it took."""
    started = time.monotonic()
    result = action()
    if result is not None:
        await result
    await kubelet.wait_for(condition, 10, what)
    return (time.monotonic() - started) * 1000


async def admit(ctx: DemoContext, pod: str, count: int) -> None:
    """Admit a one-container pod and show what the plugin answered."""
    got = await ctx.kubelet.allocate_pod(pod, {"main": count})
    ctx.pods[pod] = got
    main = got["main"]
    asked = "asked GetPreferredAllocation, then " if main.asked_preference else ""
    chosen = ", ".join(main.device_ids)
    say(f"   {pod} asks for {count} GCUs: kubelet {asked}called Allocate({chosen})")
    say(indent(allocate_response(main.response), "      "))


def run_container_step(ctx: DemoContext) -> list[str] | None:
    """Start pod 1's container for real (our runtime in front of runc) and list its GCUs.

    The container gets exactly what the kubelet and containerd would give it from pod 1's
    Allocate answer: its env, mounts and annotations. ``enflame-container-runtime`` then turns
    ``ENFLAME_VISIBLE_DEVICES`` into device nodes and cgroup rules. None when runc or
    busybox-static is missing here.
    """
    if containers.missing_tools():
        return None
    response = ctx.pods["pod1"]["main"].response
    run = containers.run(
        ctx.root,
        os.path.join(os.path.dirname(ctx.plugin_dir), "container"),
        ["ls", "/dev"],
        env=dict(response.envs),
        mounts=[
            containers.Mount(m.host_path, m.container_path, m.read_only) for m in response.mounts
        ],
        annotations=dict(response.annotations),
    )
    shown = " ".join(os.path.basename(part) for part in run.argv[:4]) + " ..."
    lines = [f"$ {shown} ls /dev     (env from pod1's Allocate)"]
    if run.returncode != 0:
        return [*lines, f"FAILED (exit {run.returncode}): {run.stderr.strip()}"]
    gcus = [name for name in run.stdout.split() if "gcu" in name]
    cards = [name for name in gcus if name != "gcuctl"]
    others = len(devices.discover(ctx.root).cards) - len(cards)
    lines.append(f"inside the container: {' '.join(gcus)}")
    lines.append(f"(no other GCU: the node's other {others} cards stay out of this container)")
    return lines


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def telemetry(port: int, card: str) -> dict[str, Any]:
    """The card's telemetry samples from /metrics: ``{metric: (value, labels)}``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {
        sample.name: (sample.value, sample.labels)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels.get("card") == card and sample.name.startswith("enflame_gcu_")
    }


async def show_telemetry(ctx: DemoContext, port: int) -> None:
    """Set readings in the simulated libefml and read them back from /metrics."""
    efmlsim.set_values(
        ctx.root, "card0", {"usage": "87.5", "asic_temp": "71", "mem_used_mib": "30720"}
    )
    deadline = time.monotonic() + 10
    while True:
        found = await asyncio.to_thread(telemetry, port, "gcu0")
        usage = found.get("enflame_gcu_usage", (None, {}))
        # The holder is a label of allocation_info only; the telemetry joins it on the card.
        holder = found.get("enflame_gcu_allocation_info", (None, {}))[1]
        if usage[0] == 87.5 and holder.get("pod_name") == "pod1":
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"gcu0's telemetry never showed up: {found}")
        await asyncio.sleep(0.2)
    used = found["enflame_gcu_memory_used_bytes"][0] / (1 << 30)
    say("   card telemetry on /metrics, read through the (simulated) libefml:")
    say(
        f"   gcu0 held by {holder['pod_namespace']}/{holder['pod_name']}: usage "
        f"{usage[0]:g}, {found['enflame_gcu_temperatures'][0]:g} °C, {used:g} GiB used, "
        f"PCIe x{found['enflame_gcu_pcie_link_width'][0]:g}"
    )


async def story(work: str, root: str, plugins: str) -> int:
    """The demo itself; returns the exit status."""
    step(1, "A simulated node: the vendor manual's 8-card machine")
    say(indent(report.render_text(devices.discover(root))))

    port = free_port()
    pod_resources = os.path.join(work, "pr", "kubelet.sock")
    telemetry_args = [f"--http-address=127.0.0.1:{port}",
                      "--pod-resources-socket", pod_resources,
                      "--pod-resources-interval=0.2", "--telemetry-interval=0.2"]  # fmt: skip
    async with kubelet_stub.KubeletStub(plugins, pod_resources_socket=pod_resources) as kubelet:
        plugin = plugin_process.PluginProcess(
            plugins, root, ["--pass-device-specs", *telemetry_args]
        )
        ctx = DemoContext(root, plugins, kubelet, plugin, {})
        step(2, "Start enflame-device-plugin as its own process; the stub kubelet waits")
        say(f"   $ enflame-device-plugin --pass-device-specs --plugin-dir {plugins} \\")
        say(
            f"       --host-root {root} --http-address 127.0.0.1:{port} (and a fast telemetry "
            "interval)"
        )
        try:
            ms = await timed(kubelet, plugin.start, lambda k: k.capacity() == 8, "registration")
            [registration] = kubelet.registrations
            say(
                f"   registered {registration.resource_name} on {registration.endpoint} "
                f"{ms:.0f} ms after start; options: preferred allocation "
                f"{kubelet.plugins[RESOURCE].options.get_preferred_allocation_available}"
            )

            step(3, "The devices as the kubelet sees them (ListAndWatch)")
            say(indent(device_table(kubelet)))

            step(4, "The manual's scenario: two pods, two GCUs each")
            await admit(ctx, "pod1", 2)
            await admit(ctx, "pod2", 2)
            say("   pod1 got the pair under one PCIe switch; pod2 the next such pair,")
            say("   decided from each request alone (no remembered state to go stale).")
            say(indent(device_table(kubelet)))
            await show_telemetry(ctx, port)

            step(5, "Restart the kubelet: every socket in the plugin dir is deleted")
            ms = await timed(
                kubelet,
                kubelet.restart,
                lambda k: len(k.registrations) == 2 and len(k.allocatable()) == 8,
                "re-registration",
            )
            say(f"   the plugin noticed, served again and re-registered in {ms:.0f} ms")

            step(6, "Unplug gcu3, then plug it back")
            ms = await timed(
                kubelet,
                lambda: simulate.unplug(root, 3),
                lambda k: k.devices().get("gcu3") == "Unhealthy",
                "gcu3 unhealthy",
            )
            say(f"   unplugged: gcu3 reported Unhealthy after {ms:.0f} ms")
            say(indent(device_table(kubelet)))
            ms = await timed(
                kubelet,
                lambda: simulate.replug(root, 3),
                lambda k: k.devices().get("gcu3") == "Healthy",
                "gcu3 healthy",
            )
            say(f"   replugged: gcu3 Healthy again after {ms:.0f} ms, no restart needed")

            step(7, "pod1's container for real: our runtime in front of runc")
            lines = run_container_step(ctx)
            if lines is None:
                problems = "; ".join(containers.missing_tools())
                say(f"   (skipped: {problems}; `make demo` as root installs runc and busybox)")
            else:
                say(indent("\n".join(lines)))
                if not any(
                    line.startswith("inside the container: gcu0 gcu1 gcuctl") for line in lines
                ):
                    return 1

            step(8, "Stop the plugin (SIGTERM)")
            started = time.monotonic()
            plugin.send(signal.SIGTERM)
            status = await plugin.wait(5)
            gone = not os.path.exists(os.path.join(plugins, "enflame.sock"))
            say(
                f"   exit status {status} after {(time.monotonic() - started) * 1000:.0f} ms; "
                f"socket removed: {'yes' if gone else 'NO'}"
            )
            return 0 if status == 0 and gone else 1
        except BaseException:
            say("--- plugin log ---")
            say(plugin.log_text())
            raise
        finally:
            await plugin.stop()


def main() -> int:
    """Run the demo in a temporary directory and clean up after it."""
    say("Enflame GCU device plugin: the whole job on a simulated node")
    work, root, plugins = plugin_process.make_node("vendor-8card")
    try:
        efmlsim.install(root)
        status = asyncio.run(story(work, root, plugins))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say()
    if status == 0:
        for line in NEXT_STEPS:
            say(line)
        say()
    say("Demo finished." if status == 0 else "Demo FAILED.")
    return status


# What the demo leaves the reader with: each a command of this checkout (README, "Set up").
NEXT_STEPS = (
    "What to try next:",
    "  make test               the whole suite (installs the test tools first: README)",
    "  make demo-cluster       the same story on a real control plane, through the operator",
    "  enflame-ctk sim create /tmp/node && enflame-ctk info --host-root /tmp/node",
    "                          a simulated node of your own, and what the toolkit sees there",
    "  docs/user-guide.md      from a bare GCU node to `ls /dev/gcu*` in a pod",
)


if __name__ == "__main__":
    sys.exit(main())
