{{/* The chart's name. */}}
{{- define "sluice.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's objects' base name. */}}
{{- define "sluice.fullname" -}}
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

{{- define "sluice.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sluice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controlplane
{{- end }}

{{- define "sluice.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "sluice.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sluice
{{- end }}

{{- define "sluice.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sluice.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sluice.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
{{- end }}

{{/* sluice.bytes: a Kubernetes memory quantity (512Mi, 1Gi, 500M, 1048576) in bytes. */}}
{{- define "sluice.bytes" -}}
{{- $q := toString . -}}
{{- if not (regexMatch "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$" $q) -}}
{{- fail (printf "resources.limits.memory %q: use a whole number with an optional suffix Ki, Mi, Gi, Ti, k, M, G or T" $q) -}}
{{- end -}}
{{- $n := regexFind "^[0-9]+" $q | atoi -}}
{{- $unit := trimPrefix (toString $n) $q -}}
{{- $mult := get (dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000) $unit -}}
{{- mul $n $mult -}}
{{- end }}

{{/* sluice.memoryMaxBytes: -memory-max-bytes, 60% of the memory limit less 64 MiB. */}}
{{- define "sluice.memoryMaxBytes" -}}
{{- if .Values.memoryMaxBytes -}}
{{- int64 .Values.memoryMaxBytes -}}
{{- else -}}
{{- $limit := include "sluice.bytes" .Values.resources.limits.memory | int64 -}}
{{- if lt $limit 134217728 -}}
{{- fail (printf "resources.limits.memory %s is below 128Mi: the control plane needs 64 MiB besides its memory store" .Values.resources.limits.memory) -}}
{{- end -}}
{{- div (mul (sub $limit 67108864) 3) 5 -}}
{{- end -}}
{{- end }}

{{/* sluice.validate fails on combinations the schema cannot express clearly. */}}
{{- define "sluice.validate" -}}
{{- $r := .Values.redis -}}
{{- if and $r.tryout (ne $r.mode "standalone") (ne $r.mode "memory") -}}
{{- fail (printf "redis.tryout runs a standalone Redis: set redis.mode standalone or leave it memory (got %q)" $r.mode) -}}
{{- end -}}
{{- if and $r.tryout $r.addrs -}}
{{- fail "redis.tryout runs its own Redis: remove redis.addrs, or turn tryout off" -}}
{{- end -}}
{{- if and (ne $r.mode "memory") (not $r.tryout) (not $r.addrs) -}}
{{- fail (printf "redis.mode %s needs redis.addrs (host:port of the server, the Sentinels or the Cluster seeds), or redis.tryout: true" $r.mode) -}}
{{- end -}}
{{- if and (eq $r.mode "memory") (not $r.tryout) (or $r.addrs $r.tls.enabled $r.passwordSecret.name) -}}
{{- fail "redis.mode memory uses no Redis: remove redis.addrs, redis.tls and redis.passwordSecret, or set redis.mode" -}}
{{- end -}}
{{- if and (eq $r.mode "sentinel") (not $r.master) -}}
{{- fail "redis.mode sentinel needs redis.master, the name of the monitored master" -}}
{{- end -}}
{{- if and $r.tls.enabled (not $r.tls.secretName) -}}
{{- fail "redis.tls.enabled needs redis.tls.secretName: a Secret holding ca.crt (and tls.crt, tls.key with clientCertificate)" -}}
{{- end -}}
{{- if and .Values.grpc.tls.enabled (not .Values.grpc.tls.secretName) -}}
{{- fail "grpc.tls.enabled needs grpc.tls.secretName: a Secret holding tls.crt and tls.key (and ca.crt with requireClientCert)" -}}
{{- end -}}
{{- if and .Values.grpc.tls.requireClientCert (not .Values.grpc.tls.enabled) -}}
{{- fail "grpc.tls.requireClientCert needs grpc.tls.enabled" -}}
{{- end -}}
{{- if and .Values.grpc.tls.clientSAN (not .Values.grpc.tls.requireClientCert) -}}
{{- fail "grpc.tls.clientSAN needs grpc.tls.requireClientCert" -}}
{{- end -}}
{{- if and $r.tryout $r.tls.enabled -}}
{{- fail "redis.tryout runs Redis without TLS: turn redis.tls off, or use your own Redis" -}}
{{- end -}}
{{- end }}

{{/* sluice.redisAddrs: the Redis addresses, the tryout Redis's when tryout. */}}
{{- define "sluice.redisAddrs" -}}
{{- if .Values.redis.tryout -}}
{{ include "sluice.fullname" . }}-redis:6379
{{- else -}}
{{ join "," .Values.redis.addrs }}
{{- end -}}
{{- end }}

{{/* sluice.redisMode: the -redis-mode the control plane runs with. */}}
{{- define "sluice.redisMode" -}}
{{- if .Values.redis.tryout -}}standalone{{- else -}}{{ .Values.redis.mode }}{{- end -}}
{{- end }}
