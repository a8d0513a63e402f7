{{- /* Relabelings shared by the ServiceMonitor and the PodMonitor: the Kubernetes node name as
       `node` (every alert and the dashboard name nodes by it) and, with pool.nodeLabel, that
       node label's value as `pool` (version skew is judged per pool). Prometheus writes a node
       label `a.b/c` as __meta_kubernetes_node_label_a_b_c. */ -}}
{{- define "preflight.relabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  targetLabel: node
  action: replace
{{- if .Values.pool.nodeLabel }}
- sourceLabels: [{{ printf "__meta_kubernetes_node_label_%s" (regexReplaceAll "[^a-zA-Z0-9_]" .Values.pool.nodeLabel "_") }}]
  targetLabel: pool
  action: replace
{{- end }}
{{- end -}}

{{- define "preflight.attachMetadata" -}}
{{- if .Values.pool.nodeLabel }}
attachMetadata:
  node: true
{{- end }}
{{- end -}}
