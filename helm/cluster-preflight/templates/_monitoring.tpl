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


{{- /* With kube-rbac-proxy in front of the daemon, a monitor's endpoint scrapes over HTTPS with
       a ServiceAccount's bearer token (from a Secret: the operator's `authorization`, which a
       PodMonitor supports too, unlike a token file) and checks the proxy's certificate as
       kubeRbacProxy.scrape says. */ -}}
{{- define "preflight.scraperCreated" -}}
{{- $p := .Values.kubeRbacProxy -}}
{{- if and $p.enabled (or .Values.serviceMonitor.enabled .Values.podMonitor.enabled) (not $p.scrape.tokenSecret.name) -}}true{{- end -}}
{{- end -}}

{{- define "preflight.scrapeAuth" -}}
{{- if .Values.kubeRbacProxy.enabled }}
{{- $p := .Values.kubeRbacProxy }}
{{- $s := $p.scrape }}
{{- if and $s.insecureSkipVerify $s.ca }}
{{- fail "kubeRbacProxy.scrape: a ca with insecureSkipVerify: true verifies nothing; set insecureSkipVerify: false to use the ca" }}
{{- end }}
{{- if and (not $s.insecureSkipVerify) (not $s.ca) }}
{{- fail "kubeRbacProxy.scrape.insecureSkipVerify: false needs kubeRbacProxy.scrape.ca (the CA of the tlsSecret's certificate)" }}
{{- end }}
{{- if and (not $s.insecureSkipVerify) (not $p.tlsSecret) }}
{{- fail "kubeRbacProxy.scrape.insecureSkipVerify: false needs kubeRbacProxy.tlsSecret: the proxy's own self-signed certificate cannot be verified" }}
{{- end }}
scheme: https
authorization:
  type: Bearer
  credentials:
    name: {{ $s.tokenSecret.name | default (printf "%s-scraper-token" (include "preflight.fullname" .)) }}
    key: {{ $s.tokenSecret.key }}
tlsConfig:
  insecureSkipVerify: {{ $s.insecureSkipVerify }}
  {{- with $s.ca }}
  ca:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $s.serverName }}
  serverName: {{ . | quote }}
  {{- end }}
{{- end }}
{{- end -}}
