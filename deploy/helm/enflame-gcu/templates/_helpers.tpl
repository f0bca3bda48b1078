{{/* Chart name, overridable. */}}
{{- define "enflame-gcu.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name; the release name alone when it already holds the chart name. */}}
{{- define "enflame-gcu.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* --- operator knobs (namespaceOverride, image.digest, pod metadata) --- */}}

{{/* The namespace of every namespaced object: namespaceOverride, else the release's. */}}
{{- define "enflame-gcu.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* DaemonSet names: the static manifests' names, so a chart install and the manifests can never
     run side by side (one object, one name); fullnameOverride prefixes them instead. Call with
     (dict "context" $ "component" "device-plugin"). */}}
{{- define "enflame-gcu.daemonSetName" -}}
{{- $names := dict "device-plugin" "enflame-device-plugin-daemonset" "container-toolkit" "enflame-container-toolkit-daemonset" "dra-plugin" "enflame-dra-plugin" -}}
{{- if .context.Values.fullnameOverride -}}
{{- printf "%s-%s" .context.Values.fullnameOverride .component | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- get $names .component -}}
{{- end -}}
{{- end -}}

{{/* podLabels and podAnnotations for a pod template's metadata; call with (dict "context" $
     "annotations" <extra annotations dict>), indented by the caller. */}}
{{- define "enflame-gcu.podAnnotations" -}}
{{- $all := merge (deepCopy (.annotations | default dict)) (.context.Values.podAnnotations | default dict) -}}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Where the plugin's --config-file comes from: "existing" (config.name), "chart" (the chart's
     ConfigMap: config.inline, else generated from sharing.*) or "" (no file). */}}
{{- define "enflame-gcu.pluginConfigSource" -}}
{{- if .Values.config.name -}}existing
{{- else if or .Values.config.inline .Values.config.map .Values.sharing.enabled -}}chart
{{- end -}}
{{- end -}}

{{/* "true" when the plugin runs named configs chosen by a node label (config.map, or
config.name with config.default); "" for one config file. */}}
{{- define "enflame-gcu.pluginConfigNamed" -}}
{{- if or .Values.config.map (and .Values.config.name .Values.config.default) -}}true{{- end -}}
{{- end -}}

{{/* The named config of a node without the label: config.default, else the only entry of
config.map, else none; a default config.map lacks fails the render. */}}
{{- define "enflame-gcu.pluginConfigDefault" -}}
{{- $map := .Values.config.map | default dict }}
{{- if .Values.config.default }}
{{- if and $map (not (hasKey $map .Values.config.default)) }}
{{- fail (printf "config.default %q is not a key of config.map (%s)" .Values.config.default (keys $map | sortAlpha | join ", ")) }}
{{- end }}
{{- .Values.config.default }}
{{- else if eq (len $map) 1 }}
{{- keys $map | first }}
{{- end }}
{{- end -}}

{{/* Labels common to every object. */}}
{{- define "enflame-gcu.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/part-of: enflame-gcu
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}

{{/* Selector labels; call with (dict "context" $ "name" "enflame-device-plugin"). */}}
{{- define "enflame-gcu.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
{{- end -}}

{{/* image reference; call with (dict "image" .Values.image "context" $) (add "name" for an image
     other than the device plugin's). An empty repository is <global.image.registry>/<name>, an
     empty tag global.image.tag, then the chart's appVersion; a digest wins over the tag. */}}
{{- define "enflame-gcu.image" -}}
{{- $global := dig "image" dict (.context.Values.global | default dict) -}}
{{- $registry := trimSuffix "/" (dig "registry" "ghcr.io/enflame-gcu" $global) -}}
{{- $repository := .image.repository | default (printf "%s/%s" $registry (.name | default "enflame-gcu-device-plugin")) -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (.image.tag | default (dig "tag" "" $global) | default .context.Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{/* The one reference's registry and tag as the operator takes them (--image-registry,
     --image-tag): what its GcuResource components default to. */}}
{{- define "enflame-gcu.imageRegistry" -}}
{{- trimSuffix "/" (dig "image" "registry" "ghcr.io/enflame-gcu" (.Values.global | default dict)) -}}
{{- end -}}
{{- define "enflame-gcu.imageTag" -}}
{{- dig "image" "tag" "" (.Values.global | default dict) | default .Chart.AppVersion -}}
{{- end -}}

{{/* The plugin's --resources list: gcu, plus vgcu, shared-gcu and drs-gcu when turned on. */}}
{{- define "enflame-gcu.pluginResources" -}}
{{- $kinds := list "gcu" -}}
{{- if .Values.vgcu.enabled -}}{{- $kinds = append $kinds "vgcu" -}}{{- end -}}
{{- if .Values.sharing.enabled -}}{{- $kinds = append $kinds "shared-gcu" -}}{{- end -}}
{{- if .Values.devicePlugin.drs -}}{{- $kinds = append $kinds "drs-gcu" -}}{{- end -}}
{{- join "," $kinds -}}
{{- end -}}

{{/* Pod scheduling shared by every DaemonSet: priority, node affinity, tolerations. */}}
{{- define "enflame-gcu.scheduling" -}}
{{- include "enflame-gcu.schedulingFor" (dict "context" . "mode" "any") -}}
{{- end -}}

{{/* Scheduling for one way of serving GCUs; call with (dict "context" $ "mode" M).
     M = "any" (the toolkit), "device-plugin" (skips nodes labelled for DRA, also when the
     DRA driver is deployed without this chart, as deploy/yaml does) or "dra" (only nodes
     labelled for DRA): a node never serves GCUs both ways. */}}
{{- define "enflame-gcu.schedulingFor" -}}
{{- $values := .context.Values -}}
{{- /* Per-component overrides (devicePlugin, dra, toolkit: nodeSelector, affinity,
     tolerations; null = the chart-wide value), passed as "component" or found by mode. */}}
{{- $comp := .component | default (get (dict "device-plugin" $values.devicePlugin "dra" $values.dra) .mode) | default dict -}}
{{- $values = dict "priorityClassName" $values.priorityClassName "imagePullSecrets" $values.imagePullSecrets "nodeSelector" $values.nodeSelector "affinity" $values.affinity "tolerations" $values.tolerations "nodeSelection" $values.nodeSelection "dra" $values.dra -}}
{{- range $key := list "nodeSelector" "affinity" "tolerations" }}
{{- if and (hasKey $comp $key) (not (kindIs "invalid" (get $comp $key))) }}
{{- $_ := set $values $key (get $comp $key) }}
{{- end }}
{{- end }}
{{- if $comp.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- $mode := "" -}}
{{- if eq .mode "device-plugin" -}}
{{- $mode = dict "key" $values.dra.modeLabel "operator" "NotIn" "values" (list "dra") -}}
{{- else if eq .mode "dra" -}}
{{- $mode = dict "key" $values.dra.modeLabel "operator" "In" "values" (list "dra") -}}
{{- end -}}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /* affinity: a nodeAffinity given in values replaces the one nodeSelection builds; its
     other keys (podAntiAffinity, ...) are kept next to ours. */}}
{{- $own := $values.affinity | default dict }}
{{- $computed := or $values.nodeSelection.anyOfLabels $mode }}
{{- if or $own.nodeAffinity (and $own (not $computed)) }}
affinity:
  {{- toYaml $own | nindent 2 }}
{{- else if $computed }}
affinity:
  {{- with $own }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      # Terms are ORed: any one label marks a GCU node.
      nodeSelectorTerms:
        {{- range ($values.nodeSelection.anyOfLabels | default (list dict)) }}
        - matchExpressions:
            {{- if .key }}
            - key: {{ .key | quote }}
              operator: In
              values: [{{ .value | quote }}]
            {{- end }}
            {{- with $mode }}
            - key: {{ .key | quote }}
              operator: {{ .operator }}
              values: [{{ first .values | quote }}]
            {{- end }}
        {{- end }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* --- per-component knobs and API guards (issue 23) --- */}}

{{/* Extra volume mounts of a component's container, indented by the caller; call with the
     component's values (devicePlugin, dra, toolkit). */}}
{{- define "enflame-gcu.extraVolumeMounts" -}}
{{- with .extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Extra volumes of a component's pod, indented by the caller. */}}
{{- define "enflame-gcu.extraVolumes" -}}
{{- with .extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Fails the install, naming the value, when the cluster lacks an API group/version the
     chart is asked to use (helm template: list it in apiVersions, as --api-versions would);
     call with (dict "context" $ "api" "monitoring.coreos.com/v1" "for" "metrics.serviceMonitor.enabled" "needs" "the Prometheus Operator's CRDs"). */}}
{{- define "enflame-gcu.requireAPI" -}}
{{- if not (or (.context.Capabilities.APIVersions.Has .api) (has .api (.context.Values.apiVersions | default list))) -}}
{{- fail (printf "%s needs the API %s, which this cluster does not serve (%s); with helm template, list it in apiVersions" .for .api .needs) -}}
{{- end -}}
{{- end -}}

{{/* How many of .nodes (Node objects, as lookup lists them) carry any of .anyOfLabels
     (nodeSelection's list): the NOTES say so when it is none. */}}
{{- define "enflame-gcu.matchingNodeCount" -}}
{{- $count := 0 -}}
{{- range $node := .nodes -}}
{{- $labels := (($node.metadata | default dict).labels | default dict) -}}
{{- $hit := false -}}
{{- range $.anyOfLabels -}}
{{- if and (hasKey $labels .key) (eq (toString (get $labels .key)) (toString .value)) -}}
{{- $hit = true -}}
{{- end -}}
{{- end -}}
{{- if $hit -}}
{{- $count = add1 $count -}}
{{- end -}}
{{- end -}}
{{- $count -}}
{{- end -}}

{{/* The kube-scheduler image and KubeSchedulerConfiguration apiVersion of extender mode
     scheduler, as JSON {"image", "api"}: .image and .api when set, else chosen from the
     cluster's version .version (e.g. v1.30.4+k3s1): that version's registry.k8s.io
     kube-scheduler, and kubescheduler.config.k8s.io v1 from 1.25, v1beta3 for 1.23-1.24,
     v1beta2 for 1.22, v1beta1 for 1.19-1.21 (each the newest that Kubernetes version reads;
     KEP-785). Older clusters must set both. */}}
{{- define "enflame-gcu.schedulerChoice" -}}
{{- $v := semver .version -}}
{{- $minor := int $v.Minor -}}
{{- $api := .api -}}
{{- if not $api -}}
{{- if or (ne (int $v.Major) 1) (lt $minor 19) -}}
{{- fail (printf "Kubernetes %s: the extender's scheduler needs 1.19 or later (KubeSchedulerConfiguration beta or v1); set extender.schedulerImage and extender.configApiVersion yourself" .version) -}}
{{- else if ge $minor 25 -}}
{{- $api = "kubescheduler.config.k8s.io/v1" -}}
{{- else if ge $minor 23 -}}
{{- $api = "kubescheduler.config.k8s.io/v1beta3" -}}
{{- else if eq $minor 22 -}}
{{- $api = "kubescheduler.config.k8s.io/v1beta2" -}}
{{- else -}}
{{- $api = "kubescheduler.config.k8s.io/v1beta1" -}}
{{- end -}}
{{- end -}}
{{- $image := .image | default (printf "registry.k8s.io/kube-scheduler:v%d.%d.%d" (int $v.Major) $minor (int $v.Patch)) -}}
{{- dict "image" $image "api" $api | toJson -}}
{{- end -}}
