{{/*
Names, labels and the image reference, defined once. Every object is named after
the release: "hairpin" for a release named hairpin (as the kustomize install names
them), RELEASE-hairpin otherwise, or fullnameOverride. The base is cut to 40
characters so that the longest suffix ("-uninstall") still fits a 63-character
label value.
*/}}
{{- define "hairpin.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The labels every object carries (app.kubernetes.io/* and helm.sh/chart). */}}
{{- define "hairpin.labels" -}}
{{ include "hairpin.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The labels selectors use: stable across upgrades (a selector is immutable). */}}
{{- define "hairpin.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The agent image: repository:tag, and @digest when image.digest is set (a release's
packaged chart sets it, so every node runs exactly the image the release built).
*/}}
{{- define "hairpin.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* imagePullSecrets of a pod spec, when any are set (indent with nindent). */}}
{{- define "hairpin.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
kernelPath.mode as the agent spells it. A values file that writes `mode: on` or
`mode: off` unquoted gives YAML 1.1 booleans: true is "on", false is "off".
*/}}
{{- define "hairpin.kernelPathMode" -}}
{{- $m := .Values.kernelPath.mode -}}
{{- if kindIs "bool" $m -}}{{ ternary "on" "off" $m }}{{- else -}}{{ $m }}{{- end -}}
{{- end -}}

{{/* coredns.mode as the agent spells it: an unquoted `off` (false) is "off". */}}
{{- define "hairpin.corednsMode" -}}
{{- $m := .Values.coredns.mode -}}
{{- if kindIs "bool" $m -}}off{{- else -}}{{ $m }}{{- end -}}
{{- end -}}

{{/* The Service CoreDNS points names at, as a fully qualified name. */}}
{{- define "hairpin.corednsTarget" -}}
{{- printf "%s.%s.svc.%s" (include "hairpin.fullname" .) .Release.Namespace .Values.names.clusterDomain -}}
{{- end -}}

{{/* The ConfigMap the CoreDNS writer edits, namespace/name. */}}
{{- define "hairpin.corednsWritten" -}}
{{- if eq (include "hairpin.corednsMode" .) "import" -}}
kube-system/{{ .Values.coredns.customConfigMap }}
{{- else -}}
kube-system/{{ .Values.coredns.configMap }}
{{- end -}}
{{- end -}}

{{/* The securityContext of a container that only calls the API: no host access, no capability, not root. */}}
{{- define "hairpin.apiOnlySecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
runAsUser: 65534
runAsGroup: 65534
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
