{{- define "preflight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "preflight.fullname" -}}
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

{{- define "preflight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "preflight.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "preflight.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "preflight.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "preflight.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "preflight.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "preflight.image" -}}
{{- $target := ternary "nccl" "node" .Values.bandwidthTest.enabled -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-%s" $target .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}

{{/* The nodeSelector as a label selector ("k=v,k2=v2"), sorted. */}}
{{- define "preflight.selectorString" -}}
{{- $parts := list -}}
{{- range $k, $v := .Values.nodeSelector -}}
{{- $parts = append $parts (printf "%s=%s" $k $v) -}}
{{- end -}}
{{- join "," $parts -}}
{{- end -}}

{{/* The fleet guard is on: it lists nodes and counts them by the label it sets. */}}
{{- define "preflight.guard" -}}
{{- if and .Values.nodeStatus.enabled (lt (float64 .Values.nodeStatus.maxMarkedFraction) 1.0) -}}true{{- end -}}
{{- end -}}

{{/* preflight's config: .Values.config plus the kube_* keys of nodeStatus. */}}
{{- define "preflight.config" -}}
{{- range $k, $v := .Values.config -}}
{{- if hasPrefix "kube_" $k -}}
{{- fail (printf "config.%s: set nodeStatus.* instead (the chart derives the kube_* keys and the RBAC from it)" $k) -}}
{{- end -}}
{{- end -}}
{{- $config := deepCopy .Values.config -}}
{{- if .Values.nodeStatus.enabled -}}
{{- $ns := .Values.nodeStatus -}}
{{- $_ := set $config "kube_node_status" true -}}
{{- $_ := set $config "kube_fail_runs" (int $ns.failRuns) -}}
{{- $_ := set $config "kube_pass_runs" (int $ns.passRuns) -}}
{{- $_ := set $config "kube_node_taint" $ns.taint -}}
{{- $_ := set $config "kube_max_marked_fraction" (float64 $ns.maxMarkedFraction) -}}
{{- $_ := set $config "kube_guard_selector" (default (include "preflight.selectorString" .) $ns.guardSelector) -}}
{{- $_ := set $config "kube_heartbeat_s" (int $ns.heartbeatSeconds) -}}
{{- end -}}
{{- toYaml $config -}}
{{- end -}}

{{/* /dev/shm of the bandwidth workers, MiB: what the shm check asks of a node with that many
     GPUs, max(1 GiB, 9.2 MiB x 16 channels x (GPUs - 1)). */}}
{{- define "preflight.shmMi" -}}
{{- max 1024 (mul 148 (sub (int .Values.bandwidthTest.gpusPerNode) 1)) -}}
{{- end -}}

{{- define "preflight.memoryLimit" -}}
{{- $b := .Values.bandwidthTest -}}
{{- printf "%dMi" (add (int $b.memoryBaseMi) (mul (int $b.gpusPerNode) (int $b.memoryPerGpuMi)) (int (include "preflight.shmMi" .))) -}}
{{- end -}}
