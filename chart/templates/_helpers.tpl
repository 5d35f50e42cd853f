{{/* The chart name, shortened to the 63 characters a label allows. */}}
{{- define "copyrator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's resources. */}}
{{- define "copyrator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "copyrator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "copyrator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "copyrator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "copyrator.labels" -}}
helm.sh/chart: {{ include "copyrator.chart" . }}
{{ include "copyrator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "copyrator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "copyrator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "copyrator.markKeySecret" -}}
{{- default (printf "%s-mark-key" (include "copyrator.fullname" .)) ((.Values.markKey | default dict).secretName) }}
{{- end }}

{{- define "copyrator.leaseName" -}}
{{- default (include "copyrator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
The kinds the operator copies, comma-separated: `kinds`, then each of
`extraKinds` as `Kind.group` (a bare `Kind` for the core group). A release
upgraded with --reuse-values from a chart without the `kinds` value keeps
both kinds.
*/}}
{{- define "copyrator.kinds" -}}
{{- $kinds := .Values.kinds | default (list "configmap" "secret") }}
{{- range .Values.extraKinds }}
{{- if .apiGroup }}
{{- $kinds = append $kinds (printf "%s.%s" .kind .apiGroup) }}
{{- else }}
{{- $kinds = append $kinds .kind }}
{{- end }}
{{- end }}
{{- $kinds | join "," }}
{{- end }}

{{/*
The verbs `rbacCopy` grants on roles and clusterroles, as a JSON list; empty
when it grants none (also for a release upgraded with --reuse-values from a
chart without the value).
*/}}
{{- define "copyrator.rbacCopyVerbs" -}}
{{- $verbs := list }}
{{- with .Values.rbacCopy }}
{{- if .bind }}{{ $verbs = append $verbs "bind" }}{{ end }}
{{- if .escalate }}{{ $verbs = append $verbs "escalate" }}{{ end }}
{{- end }}
{{- if $verbs }}{{ toJson $verbs }}{{ end }}
{{- end }}

{{/*
"true" when the release is the member side (`memberSide.enabled`): only the
objects a member cluster holds for the operator of another cluster, none of
the operator's own. Empty otherwise, also for a release upgraded with
--reuse-values from a chart without the value.
*/}}
{{- define "copyrator.memberSide" -}}
{{- with .Values.memberSide }}{{ if .enabled }}true{{ end }}{{ end }}
{{- end }}

{{/* The name of the member side's token Secret. */}}
{{- define "copyrator.memberTokenSecret" -}}
{{- printf "%s-token" (include "copyrator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
"true" when the chart protects copies at admission (`copyProtection.mode`
not Off; Deny also for a release upgraded with --reuse-values from a chart
without the value), on either side: the operator's, or a member's.
*/}}
{{- define "copyrator.copyProtection" -}}
{{- $mode := (.Values.copyProtection | default dict).mode | default "Deny" }}
{{- if ne $mode "Off" }}true{{ end }}
{{- end }}

{{/*
The name of the copy protection's policy and binding.
*/}}
{{- define "copyrator.copyProtectionName" -}}
{{- printf "%s-copies-read-only" (include "copyrator.fullname" .) }}
{{- end }}

{{/*
"true" when some rules write as ServiceAccounts: tenant rules by default,
and rules that name one (the operator writing no copy itself, or accounts
listed).
*/}}
{{- define "copyrator.asTenants" -}}
{{- $tenantsAsAccounts := and .Values.operator.allNamespaces (eq (.Values.operator.tenantIdentity | default "serviceAccount") "serviceAccount") }}
{{- if or $tenantsAsAccounts (not .Values.rbac.writeCopies) (gt (len (.Values.impersonation.serviceAccountNames | default list)) 0) }}true{{ end }}
{{- end }}

{{/*
"true" when writes as ServiceAccounts carry the acting-for extra
(--acting-for-extra): copies are protected and some rules write as
ServiceAccounts.
*/}}
{{- define "copyrator.actingForExtra" -}}
{{- if and (include "copyrator.copyProtection" .) (include "copyrator.asTenants" .) (not (include "copyrator.memberSide" .)) }}true{{ end }}
{{- end }}

{{/*
"true" when members may be reached with credentials from plugins
(`memberClusters.credentialPlugins.providers`).
*/}}
{{- define "copyrator.credentialPlugins" -}}
{{- $plugins := (.Values.memberClusters | default dict).credentialPlugins | default dict }}
{{- if and .Values.memberClusters.enabled $plugins.providers }}true{{ end }}
{{- end }}
