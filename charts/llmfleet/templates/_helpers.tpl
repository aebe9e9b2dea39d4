{{/*
Names and labels. Every object carries app.kubernetes.io/name: llmfleet, instance (the release),
version and helm.sh/chart; each component's objects add app.kubernetes.io/component
(operator, autoscaler or gateway). Pods are selected by name + instance + component, and the
operator's NetworkPolicies admit the gateway pods by those labels.
*/}}

{{- define "llmfleet.name" -}}
{{- default "llmfleet" .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-llmfleet, or the release name when it already contains the chart's name. Kept
to 40 characters so that "<fullname>-autoscaler-metrics" stays a valid Service name. */}}
{{- define "llmfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := include "llmfleet.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "llmfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object; `llmfleet.componentLabels` adds the component. */}}
{{- define "llmfleet.labels" -}}
helm.sh/chart: {{ include "llmfleet.chart" . }}
app.kubernetes.io/name: {{ include "llmfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmfleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Call with (dict "root" $ "component" "operator"). */}}
{{- define "llmfleet.componentLabels" -}}
{{ include "llmfleet.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "llmfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmfleet.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The ServiceAccount of a component: (dict "root" $ "component" "gateway"). */}}
{{- define "llmfleet.serviceAccountName" -}}
{{- $values := index .root.Values .component }}
{{- if $values.serviceAccount.create }}
{{- default (printf "%s-%s" (include "llmfleet.fullname" .root) .component) $values.serviceAccount.name }}
{{- else }}
{{- required (printf "%s.serviceAccount.name is required when %s.serviceAccount.create is false" .component .component) $values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "llmfleet.image" -}}
{{- $image := .Values.image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/* The API keys Secret's name, empty when the gateway has no API keys. */}}
{{- define "llmfleet.apiKeysSecret" -}}
{{- $keys := .Values.gateway.apiKeys }}
{{- if and $keys.existingSecret $keys.tenants }}
{{- fail "gateway.apiKeys: give either existingSecret or tenants, not both" }}
{{- end }}
{{- if $keys.existingSecret }}
{{- $keys.existingSecret }}
{{- else if $keys.tenants }}
{{- printf "%s-gateway-keys" (include "llmfleet.fullname" .) }}
{{- end }}
{{- end }}

{{/* The gateway's URL published as status.endpoint: operator.gatewayUrl, else the first
Ingress host (https when a TLS entry names it), else the gateway Service in the cluster. */}}
{{- define "llmfleet.gatewayUrl" -}}
{{- $gateway := .Values.gateway }}
{{- if .Values.operator.gatewayUrl }}
{{- .Values.operator.gatewayUrl }}
{{- else if and $gateway.enabled $gateway.ingress.enabled $gateway.ingress.hosts }}
{{- $host := (first $gateway.ingress.hosts).host }}
{{- $tls := false }}
{{- range $gateway.ingress.tls }}{{ if has $host .hosts }}{{ $tls = true }}{{ end }}{{ end }}
{{- printf "%s://%s" (ternary "https" "http" $tls) $host }}
{{- else if $gateway.enabled }}
{{- $port := ternary "" (printf ":%v" $gateway.service.port) (eq (int $gateway.service.port) 80) }}
{{- printf "http://%s-gateway.%s.svc%s" (include "llmfleet.fullname" .) .Release.Namespace $port }}
{{- end }}
{{- end }}

{{/*
A component's environment: the typed values first, then its `settings:` map.

Call with (dict "root" $ "component" "operator" "prefix" "LLMFLEET_OPERATOR_" "typed" $typed
"owned" $owned): `typed` maps env names to the values the chart computed (strings); `owned` maps
the settings keys those variables stand for to the value a user sets instead. A settings key is
its field's name in camelCase; strings go as they are, everything else as JSON; null is left out.
*/}}
{{- define "llmfleet.env" -}}
{{- $settings := (index .root.Values .component).settings | default dict }}
{{- range $key, $value := $settings }}
{{- if hasKey $.owned $key }}
{{- fail (printf "%s.settings.%s: the chart sets this one; use %s" $.component $key (get $.owned $key)) }}
{{- end }}
{{- end }}
{{- if .root.Values.loopbackOnly }}
- name: LLMFLEET_LOOPBACK_ONLY
  value: "true"
{{- end }}
{{- range $name, $value := .typed }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- range $key, $value := $settings }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ printf "%s%s" $.prefix ($key | snakecase | upper) }}
  value: {{ ternary $value (toJson $value) (kindIs "string" $value) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/* Pod-level fields every component shares: (dict "root" $ "component" "operator"). */}}
{{- define "llmfleet.podSpecCommon" -}}
{{- $values := index .root.Values .component }}
serviceAccountName: {{ include "llmfleet.serviceAccountName" . }}
automountServiceAccountToken: true
enableServiceLinks: false
securityContext:
  {{- toYaml .root.Values.podSecurityContext | nindent 2 }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The read-only root filesystem's writable /tmp, plus the component's extra volumes. */}}
{{- define "llmfleet.volumes" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- with (index .root.Values .component).extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "llmfleet.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- with (index .root.Values .component).extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
A component's RBAC: (dict "root" $ "component" "operator" "namespaces" $list "rules" $yaml
"clusterRules" $yaml). `rules` are what it does with namespaced resources; `clusterRules` are
cluster-scoped reads (each commented where it is defined). With no namespaces both go into one
ClusterRole bound cluster-wide; with namespaces, `rules` become a Role bound in each of them and
only `clusterRules` stay in a ClusterRole.
*/}}
{{- define "llmfleet.rbac" -}}
{{- $fullname := include "llmfleet.fullname" .root }}
{{- $name := printf "%s-%s" $fullname .component }}
{{- $subject := dict "name" (include "llmfleet.serviceAccountName" .) "namespace" .root.Release.Namespace }}
{{- $labels := include "llmfleet.componentLabels" . }}
{{- $clusterRules := trim (default "" .clusterRules) }}
{{- if not .namespaces }}
{{- $clusterRules = trim (printf "%s\n%s" .rules $clusterRules) }}
{{- else }}
{{- range .namespaces }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}
  namespace: {{ . }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  {{- trim $.rules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}
  namespace: {{ . }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: {{ $name }}
subjects:
  - kind: ServiceAccount
    name: {{ $subject.name }}
    namespace: {{ $subject.namespace }}
{{- end }}
{{- end }}
{{- if $clusterRules }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $name }}
  labels:
    {{- $labels | nindent 4 }}
rules:
  {{- $clusterRules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels:
    {{- $labels | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ $name }}
subjects:
  - kind: ServiceAccount
    name: {{ $subject.name }}
    namespace: {{ $subject.namespace }}
{{- end }}
{{- end }}
