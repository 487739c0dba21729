{{/* Names. */}}
{{- define "fleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleet.fullname" -}}
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

{{/* Object names of the components. */}}
{{- define "fleet.dispatcher.fullname" -}}
{{- printf "%s-dispatcher" (include "fleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "fleet.worker.fullname" -}}
{{- printf "%s-worker" (include "fleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- define "fleet.dockerWorker.fullname" -}}
{{- printf "%s-docker-worker" (include "fleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleet.worker.serviceAccountName" -}}
{{- if .Values.worker.serviceAccount.create }}
{{- default (include "fleet.worker.fullname" .) .Values.worker.serviceAccount.name }}
{{- else }}
{{- required "worker.serviceAccount.name is required when worker.serviceAccount.create is false" .Values.worker.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fleet.worker.jobNamespace" -}}
{{- default .Release.Namespace .Values.worker.jobNamespace }}
{{- end }}

{{- define "fleet.apiTokenSecret" -}}
{{- default (printf "%s-api-tokens" (include "fleet.fullname" .)) .Values.dispatcher.api.tokens.existingSecret }}
{{- end }}

{{- define "fleet.sharedClaim" -}}
{{- default (printf "%s-shared" (include "fleet.worker.fullname" .)) .Values.worker.sharedPVC.existingClaim }}
{{- end }}

{{/* The stream of the worker's pool (contract v2), as internal/queue names it. */}}
{{- define "fleet.jobsStream" -}}
{{- printf "%s_POOL_%s" (.Values.subjectPrefix | replace "-" "_" | upper) .Values.worker.pool }}
{{- end }}

{{/* Labels. Call with (dict "ctx" $ "component" "worker"). */}}
{{- define "fleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "fleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: fleet
{{- end }}

{{- define "fleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleet.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fleet.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/*
The Redis URL of the sentinel and cluster modes, built from their values.
*/}}
{{- define "fleet.redisURL" -}}
{{- $r := .Values.redis -}}
{{- $scheme := ternary "rediss" "redis" (eq $r.tls.enabled true) -}}
{{- if eq $r.mode "sentinel" -}}
{{- if not $r.sentinel.addresses }}{{ fail "redis.mode=sentinel needs redis.sentinel.addresses (host:port of each Sentinel)" }}{{ end -}}
{{- $master := required "redis.mode=sentinel needs redis.sentinel.masterName" $r.sentinel.masterName -}}
{{- printf "%s+sentinel://%s/%s/%d" $scheme (join "," $r.sentinel.addresses) $master (int $r.sentinel.db) -}}
{{- else if eq $r.mode "cluster" -}}
{{- if not $r.cluster.addresses }}{{ fail "redis.mode=cluster needs redis.cluster.addresses (host:port of seed nodes)" }}{{ end -}}
{{- printf "%s+cluster://%s" $scheme (join "," $r.cluster.addresses) -}}
{{- end -}}
{{- end -}}

{{/*
Environment common to every fleet container: NATS, Redis, the prefix, logs.
Call with (dict "ctx" $ "auth" .Values.<component>.natsAuth "logLevel" ... "logFormat" ...).
*/}}
{{- define "fleet.commonEnv" -}}
{{- $v := .ctx.Values -}}
- name: FLEET_NATS_URL
  value: {{ $v.nats.url | quote }}
- name: FLEET_SUBJECT_PREFIX
  value: {{ $v.subjectPrefix | quote }}
{{- $r := $v.redis }}
{{- if ne $r.mode "url" }}
- name: FLEET_REDIS_URL
  value: {{ include "fleet.redisURL" .ctx | quote }}
{{- else if $r.existingSecret }}
- name: FLEET_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $r.existingSecret | quote }}
      key: {{ $r.urlKey }}
{{- else }}
- name: FLEET_REDIS_URL
  value: {{ $r.url | quote }}
{{- end }}
{{- if $r.auth.existingSecret }}
{{- if $r.auth.passwordKey }}
- name: FLEET_REDIS_PASSWORD_FILE
  value: /etc/fleet/redis-auth/{{ $r.auth.passwordKey }}
{{- end }}
{{- if $r.auth.sentinelPasswordKey }}
- name: FLEET_REDIS_SENTINEL_PASSWORD_FILE
  value: /etc/fleet/redis-auth/{{ $r.auth.sentinelPasswordKey }}
{{- end }}
{{- end }}
{{- if $r.tls.existingSecret }}
{{- if $r.tls.caKey }}
- name: FLEET_REDIS_CA
  value: /etc/fleet/redis-tls/{{ $r.tls.caKey }}
{{- end }}
{{- if $r.tls.certKey }}
- name: FLEET_REDIS_CERT
  value: /etc/fleet/redis-tls/{{ $r.tls.certKey }}
- name: FLEET_REDIS_KEY
  value: /etc/fleet/redis-tls/{{ required "redis.tls.keyKey is required with redis.tls.certKey" $r.tls.keyKey }}
{{- end }}
{{- end }}
- name: FLEET_LOG_LEVEL
  value: {{ .logLevel | quote }}
- name: FLEET_LOG_FORMAT
  value: {{ .logFormat | quote }}
{{- if $v.nats.tls.existingSecret }}
{{- if $v.nats.tls.caKey }}
- name: FLEET_NATS_CA
  value: /etc/fleet/nats-tls/{{ $v.nats.tls.caKey }}
{{- end }}
{{- if $v.nats.tls.certKey }}
- name: FLEET_NATS_CERT
  value: /etc/fleet/nats-tls/{{ $v.nats.tls.certKey }}
- name: FLEET_NATS_KEY
  value: /etc/fleet/nats-tls/{{ required "nats.tls.keyKey is required with nats.tls.certKey" $v.nats.tls.keyKey }}
{{- end }}
{{- end }}
{{- with .auth }}
{{- with .inboxPrefix }}
- name: FLEET_NATS_INBOX_PREFIX
  value: {{ . | quote }}
{{- end }}
{{- if .existingSecret }}
{{- if .user }}
- name: FLEET_NATS_USER
  value: {{ .user | quote }}
{{- end }}
{{- if .passwordKey }}
- name: FLEET_NATS_PASSWORD_FILE
  value: /etc/fleet/nats-auth/{{ .passwordKey }}
{{- end }}
{{- if .tokenKey }}
- name: FLEET_NATS_TOKEN_FILE
  value: /etc/fleet/nats-auth/{{ .tokenKey }}
{{- end }}
{{- if .credsKey }}
- name: FLEET_NATS_CREDS
  value: /etc/fleet/nats-auth/{{ .credsKey }}
{{- end }}
{{- if .nkeyKey }}
- name: FLEET_NATS_NKEY
  value: /etc/fleet/nats-auth/{{ .nkeyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* Volume mounts and volumes for NATS and Redis TLS and credentials. Same arguments. */}}
{{- define "fleet.secretVolumeMounts" -}}
{{- if .ctx.Values.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/fleet/nats-tls
  readOnly: true
{{- end }}
{{- if (.auth | default dict).existingSecret }}
- name: nats-auth
  mountPath: /etc/fleet/nats-auth
  readOnly: true
{{- end }}
{{- if .ctx.Values.redis.tls.existingSecret }}
- name: redis-tls
  mountPath: /etc/fleet/redis-tls
  readOnly: true
{{- end }}
{{- if .ctx.Values.redis.auth.existingSecret }}
- name: redis-auth
  mountPath: /etc/fleet/redis-auth
  readOnly: true
{{- end }}
{{- end }}

{{- define "fleet.secretVolumes" -}}
{{- if .ctx.Values.nats.tls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .ctx.Values.nats.tls.existingSecret | quote }}
    defaultMode: 0440
{{- end }}
{{- with (.auth | default dict).existingSecret }}
- name: nats-auth
  secret:
    secretName: {{ . | quote }}
    defaultMode: 0440
{{- end }}
{{- with .ctx.Values.redis.tls.existingSecret }}
- name: redis-tls
  secret:
    secretName: {{ . | quote }}
    defaultMode: 0440
{{- end }}
{{- with .ctx.Values.redis.auth.existingSecret }}
- name: redis-auth
  secret:
    secretName: {{ . | quote }}
    defaultMode: 0440
{{- end }}
{{- end }}

{{/* The pod-level fields shared by every fleet pod. Call with the component's values. */}}
{{- define "fleet.podScheduling" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* A map as k=v,k2=v2, by key. */}}
{{- define "fleet.kvList" -}}
{{- $out := list }}
{{- range $k, $v := . }}{{ $out = append $out (printf "%s=%s" $k $v) }}{{ end }}
{{- join "," $out }}
{{- end }}

{{/*
The flags that every worker takes, whatever its executor, as FLEET_*
variables. Call with the component's values (.Values.worker or
.Values.dockerWorker). Empty strings and zeros leave the worker's default.
*/}}
{{- define "fleet.workerFlagsEnv" -}}
- name: FLEET_HANDOFF
  value: {{ .handoff | quote }}
- name: FLEET_ARTIFACTS
  value: {{ .artifacts | quote }}
- name: FLEET_ARCHIVE_LOGS
  value: {{ .archiveLogs | quote }}
{{- range $key, $env := dict "adoptWait" "FLEET_ADOPT_WAIT" "heartbeatInterval" "FLEET_HEARTBEAT_INTERVAL" "ackWait" "FLEET_ACK_WAIT" "dataRetention" "FLEET_DATA_RETENTION" }}
{{- with index $ $key }}
- name: {{ $env }}
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- range $key, $env := dict "maxOutputBytes" "FLEET_MAX_OUTPUT_BYTES" "maxArtifactBytes" "FLEET_MAX_ARTIFACT_BYTES" "maxJobArtifactBytes" "FLEET_MAX_JOB_ARTIFACT_BYTES" "maxLogBytes" "FLEET_MAX_LOG_BYTES" "maxInputRefBytes" "FLEET_MAX_INPUT_REF_BYTES" }}
{{- with index $ $key }}
- name: {{ $env }}
  value: {{ . | int64 | toString | quote }}
{{- end }}
{{- end }}
{{- with .labels }}
- name: FLEET_LABELS
  value: {{ include "fleet.kvList" . | quote }}
{{- end }}
{{- with .placementKeys }}
- name: FLEET_PLACEMENT_KEYS
  value: {{ join "," . | quote }}
{{- end }}
{{- end }}
