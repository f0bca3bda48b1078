"""The ``kubectl`` (and ``helm``) lines of docs/user-guide.md, and what the cluster tier does
with each: runs it (:data:`RUN`, the test that does) or says why it cannot run here
(:data:`NOT_RUN`). ``tests/deploy/test_guide_cluster_lines.py`` (in ``make test``) fails when a
line of the guide is in neither, or when one of these names a line the guide no longer has; the
scenarios take their lines through :func:`line`, which fails the same way, so the guide and the
tier cannot drift apart."""

from __future__ import annotations

import os
import re

GUIDE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "docs",
    "user-guide.md",
)


def lines(path: str = GUIDE) -> list[str]:
    """Every command of a fenced ``bash`` block that starts with ``kubectl`` or ``helm``, with
    continuation lines joined and trailing ``# comments`` dropped."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    found: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", "", block)
        for raw in joined.splitlines():
            command = re.sub(r"\s+#.*$", "", raw).strip()
            if command.startswith(("kubectl ", "helm ")):
                found.append(command)
    return found


def line(command: str) -> str:
    """``command`` if the guide has it verbatim; AssertionError otherwise (the guide changed)."""
    if command not in lines():
        raise AssertionError(f"docs/user-guide.md no longer has the line the tier runs: {command}")
    return command


# Each line the tier runs -> the test that runs it.
RUN = {
    "kubectl label node gcu-node-1 enflame.com/gcu.present=true":
        "test_device_plugin.py::test_scenario_1_nodes_labelled_as_the_guide_says",
    "kubectl apply -f deploy/yaml/enflame-device-plugin.yaml":
        "test_device_plugin.py::test_scenario_3_plugin_pods_ready_and_nodes_show_their_cards",
    "kubectl -n kube-system get pods -l app.kubernetes.io/name=enflame-device-plugin -o wide":
        "test_device_plugin.py::test_scenario_3_plugin_pods_ready_and_nodes_show_their_cards",
    "kubectl describe node gcu-node-1 | grep enflame.com/gcu":
        "test_device_plugin.py::test_scenario_3_plugin_pods_ready_and_nodes_show_their_cards",
    "kubectl apply -f deploy/yaml/examples/namespace.yaml":
        "conftest.py::clean_namespace",
    "kubectl apply -f deploy/yaml/examples/pod-gcu-example.yaml":
        "test_device_plugin.py::test_scenario_4_example_pod_runs_and_logs_show_its_card",
    "kubectl -n enflame logs pod-gcu-example":
        "test_device_plugin.py::test_scenario_4_example_pod_runs_and_logs_show_its_card",
    "kubectl apply -f deploy/yaml/enflame-vdevice-plugin.yaml":
        "test_vgcu.py::test_scenario_8_vgcu_example_runs_on_the_vgcu_node",
    "kubectl apply -f deploy/yaml/examples/pod-vgcu-example.yaml":
        "test_vgcu.py::test_scenario_8_vgcu_example_runs_on_the_vgcu_node",
    "kubectl -n enflame logs pod-vgcu-example":
        "test_vgcu.py::test_scenario_8_vgcu_example_runs_on_the_vgcu_node",
    "kubectl apply -f deploy/yaml/enflame-container-toolkit.yaml":
        "test_toolkit.py::test_scenario_2_toolkit_installs_records_passes_doctor_and_undoes",
    "kubectl -n kube-system logs ds/enflame-container-toolkit-daemonset":
        "test_toolkit.py::test_scenario_2_toolkit_installs_records_passes_doctor_and_undoes",
    "kubectl delete -f deploy/yaml/enflame-container-toolkit.yaml":
        "test_toolkit.py::test_scenario_2_toolkit_installs_records_passes_doctor_and_undoes",
    "kubectl delete -f deploy/yaml/enflame-device-plugin.yaml":
        "test_helm.py::test_scenario_5_helm_install_upgrade_uninstall",
    "helm install enflame-gcu deploy/helm/enflame-gcu -n kube-system":
        "test_helm.py::test_scenario_5_helm_install_upgrade_uninstall",
    "helm uninstall enflame-gcu -n kube-system":
        "test_helm.py::test_scenario_5_helm_install_upgrade_uninstall",
    "kubectl -n kube-system exec ds/enflame-container-toolkit-daemonset -- "
    "enflame-ctk doctor --host-root /host":
        "test_toolkit.py::test_scenario_2_toolkit_installs_records_passes_doctor_and_undoes",
    "kubectl -n kube-system exec ds/enflame-container-toolkit-daemonset -- "
    "enflame-ctk system create-dev-char-symlinks --host-root /host":
        "test_toolkit.py::test_scenario_2_toolkit_installs_records_passes_doctor_and_undoes",
    "kubectl apply -f deploy/yaml/examples/pod-shared-gcu-example.yaml":
        "test_helm.py::test_scenario_5_helm_install_upgrade_uninstall",
    "kubectl -n enflame logs pod-shared-gcu-example":
        "test_helm.py::test_scenario_5_helm_install_upgrade_uninstall",
    "helm upgrade enflame-gcu deploy/helm/enflame-gcu -n kube-system "
    "--set sharing.enabled=true --set sharing.slicesPerCard=6 --set sharing.policy=packed":
        "test_helm.py::test_scenario_5_helm_install_upgrade_uninstall",
}  # fmt: skip

# Each line the tier does not run -> why.
NOT_RUN = {
    "kubectl taint node gcu-node-1 enflame.com/gcu=present:NoSchedule":
        "tainting is optional; the tolerations are checked by the manifest tests",
    "kubectl -n enflame exec pod-gcu-example -- ls /dev/gcu0 /dev/gcuctl":
        "the example pod's card is the scheduler's and plugin's choice, not always gcu0: the "
        "tier runs the same exec with the card its log names",
    "kubectl apply -f deploy/yaml/enflame-device-plugin-compat-with-cpumanager.yaml":
        "needs kubelets with cpuManagerPolicy static; the kubelet tier covers it",
    "kubectl debug node/gcu-node-1 -it --profile=sysadmin "
    "--image=ghcr.io/enflame-gcu/enflame-gcu-container-toolkit:0.1.0 -- enflame-ctk doctor --host-root /host":  # noqa: E501
    "kubectl debug node and --profile need Kubernetes >= 1.23; the tier's cluster is 1.20",
    "kubectl delete -f deploy/yaml/examples/pod-gcu-example.yaml":
        "the tier deletes the namespace the example lives in",
    "helm install enflame-gcu deploy/helm/enflame-gcu -n kube-system "
    "--set toolkit.enabled=true --set devicePlugin.passDeviceSpecs=true":
        "no helm binary here; scenario 5 runs Helm's install/upgrade/uninstall through "
        "helm-python-sdk with the chart's defaults and one changed value "
        "(devicePlugin.healthInterval)",
    "kubectl label node gcu-node-7 enflame.com/device-plugin.config=shared-6 --overwrite":
        "the tier's chart install has no config.map; the plugin process reads a Node's label "
        "from an API server stand-in in tests/device_plugin/test_named_configs.py",
    "kubectl label node gcu-node-7 enflame.com/device-plugin.config-":
        "as above: the label's removal (back to config.default) is tested there",
    "helm install enflame-gcu deploy/helm/enflame-gcu -n kube-system "
    "--set toolkit.enabled=true --set toolkit.preset=k3s":
        "no k3s here (nothing renders its template); the preset itself runs on a node whose "
        "containerd has k3s's paths through the static manifest's env block "
        "(test_toolkit.py::test_scenario_2_on_a_k3s_node_the_preset_finds_its_containerd); "
        "tests/deploy/test_chart_toolkit_preset.py renders toolkit.preset with Helm's code and "
        "tests/container_toolkit/test_k3s_rke2.py installs onto a simulated k3s/RKE2 layout",
}  # fmt: skip
