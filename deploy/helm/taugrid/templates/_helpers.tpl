{{/* Names ------------------------------------------------------------------------------ */}}

{{- define "taugrid.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "taugrid.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "taugrid.fullname" .) -}}
{{- end -}}

{{- define "taugrid.claimName" -}}
{{- .Values.storage.existingClaim | default (printf "%s-data" (include "taugrid.fullname" .)) -}}
{{- end -}}

{{/* The Service's in-cluster name: what run pods call, and what the probes send as Host. */}}
{{- define "taugrid.serviceHost" -}}
{{- printf "%s.%s.svc.cluster.local" (include "taugrid.fullname" .) .Release.Namespace -}}
{{- end -}}

{{- define "taugrid.apiUrl" -}}
{{- .Values.portal.apiUrl | default (printf "http://%s:%v" (include "taugrid.serviceHost" .) .Values.service.port) -}}
{{- end -}}

{{/* Labels ----------------------------------------------------------------------------- */}}

{{- define "taugrid.selectorLabels" -}}
app.kubernetes.io/name: taugrid
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "taugrid.labels" -}}
{{ include "taugrid.selectorLabels" . }}
app.kubernetes.io/part-of: taugrid
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{/* The image: by digest when one is given, else by tag (the appVersion by default). */}}
{{- define "taugrid.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Security: the same for every pod and container of the chart. */}}
{{- define "taugrid.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
fsGroupChangePolicy: OnRootMismatch
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "taugrid.securityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Secrets, mounted as files: name → (value key, environment variable). */}}
{{- define "taugrid.secretFiles" -}}
secretKey: TAU_SECRET_KEY
databaseUrl: DATABASE_URL
brokerUrl: CELERY_BROKER_URL
tokenPeppers: TAU_TOKEN_PEPPERS
evidenceSigningKey: TAU_EVIDENCE_SIGNING_KEY
oidcClientSecret: TAU_OIDC_CLIENT_SECRET
cacheUrl: TAU_CACHE_URL
metricsToken: TAU_METRICS_TOKEN
prometheusToken: TAU_PROMETHEUS_TOKEN
emailPassword: TAU_EMAIL_PASSWORD
storageAccessKeyId: TAU_STORAGE_ACCESS_KEY_ID
storageSecretAccessKey: TAU_STORAGE_SECRET_ACCESS_KEY
{{- end -}}

{{/* The settings every process of the portal reads (docs/configuration.md). */}}
{{- define "taugrid.env" -}}
{{- $p := .Values.portal -}}
{{- $hosts := list (include "taugrid.serviceHost" .) -}}
{{- range .Values.ingress.hosts }}{{ $hosts = append $hosts . }}{{ end -}}
{{- range $p.allowedHosts }}{{ $hosts = append $hosts . }}{{ end -}}
- name: TAU_ENV
  value: production
- name: TAU_BACKEND
  value: kubernetes
- name: TAU_VAR_DIR
  value: /var/lib/taugrid
- name: TAU_ALLOWED_HOSTS
  value: {{ $hosts | uniq | join "," | quote }}
{{- with $p.csrfTrustedOrigins }}
- name: TAU_CSRF_TRUSTED_ORIGINS
  value: {{ join "," . | quote }}
{{- end }}
- name: TAU_BEHIND_TLS_PROXY
  value: {{ $p.behindTlsProxy | quote }}
{{- with $p.trustedProxies }}
- name: TAU_TRUSTED_PROXIES
  value: {{ join "," . | quote }}
{{- end }}
- name: TAU_SECURE_SSL_REDIRECT
  value: {{ $p.secureSslRedirect | quote }}
- name: TAU_HSTS_SECONDS
  value: {{ $p.hstsSeconds | int64 | quote }}
- name: TAU_API_URL
  value: {{ include "taugrid.apiUrl" . | quote }}
- name: TAU_KUBE_WATCHER_LEASE_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: TAU_LOG_LEVEL
  value: {{ $p.logLevel | quote }}
{{- with $p.defaultImage }}
- name: TAU_DEFAULT_IMAGE
  value: {{ . | quote }}
{{- end }}
{{- with $p.imageRegistries }}
- name: TAU_IMAGE_REGISTRIES
  value: {{ join "," . | quote }}
{{- end }}
{{- with $p.prometheusUrl }}
- name: TAU_PROMETHEUS_URL
  value: {{ . | quote }}
{{- end }}
{{- if $p.oidc.issuer }}
- name: TAU_OIDC_ISSUER
  value: {{ $p.oidc.issuer | quote }}
- name: TAU_OIDC_CLIENT_ID
  value: {{ $p.oidc.clientId | quote }}
- name: TAU_OIDC_SCOPES
  value: {{ $p.oidc.scopes | quote }}
{{- with $p.oidc.providerName }}
- name: TAU_OIDC_PROVIDER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- with $p.dataStorage.url }}
- name: TAU_STORAGE_URL
  value: {{ . | quote }}
{{- end }}
{{- with $p.dataStorage.endpointUrl }}
- name: TAU_STORAGE_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
{{- with $p.dataStorage.region }}
- name: TAU_STORAGE_REGION
  value: {{ . | quote }}
{{- end }}
{{- if $p.dataPrefixes.claims }}
{{- if hasKey $p.extraEnv "TAU_DATA_PREFIX_DIR" }}
{{- fail "portal.extraEnv.TAU_DATA_PREFIX_DIR: set by portal.dataPrefixes.dir where claims are mounted; leave it out of extraEnv" }}
{{- end }}
- name: TAU_DATA_PREFIX_DIR
  value: {{ $p.dataPrefixes.dir | quote }}
{{- end }}
{{- include "taugrid.endpointRouteEnv" . }}
{{- $secrets := .Values.secrets -}}
{{- range $key, $variable := include "taugrid.secretFiles" . | fromYaml }}
{{- $ref := get $secrets $key }}
{{- if $ref.name }}
- name: {{ $variable }}_FILE
  value: /run/secrets/taugrid/{{ $variable }}
{{- end }}
{{- end }}
{{- if $p.evidenceKeyring.configMap }}
- name: TAU_EVIDENCE_PUBLIC_KEYS_FILE
  value: /etc/taugrid/evidence-keyring.json
{{- end }}
{{- range $name, $value := $p.extraEnv }}
- name: {{ $name }}
  value: {{ $value | quote }}
{{- end }}
{{- end -}}

{{/* endpoints.route as the portal's TAU_ENDPOINT_* settings (portal/endpoint_routes.py checks
them again at start-up); values of the other kind of route, or the same settings in extraEnv,
fail the install. */}}
{{- define "taugrid.endpointRouteEnv" -}}
{{- $route := .Values.endpoints.route -}}
{{- if ne $route.kind "none" }}
{{- range $name := list "TAU_ENDPOINT_ROUTE" "TAU_ENDPOINT_HOST" "TAU_ENDPOINT_INGRESS_CLASS" "TAU_ENDPOINT_TLS_SECRET" "TAU_ENDPOINT_INGRESS_ANNOTATIONS" "TAU_ENDPOINT_GATEWAY" }}
{{- if hasKey $.Values.portal.extraEnv $name }}
{{- fail (printf "portal.extraEnv.%s: set by endpoints.route; leave it out of extraEnv" $name) }}
{{- end }}
{{- end }}
- name: TAU_ENDPOINT_ROUTE
  value: {{ $route.kind | quote }}
- name: TAU_ENDPOINT_HOST
  value: {{ $route.host | quote }}
{{- if eq $route.kind "ingress" }}
{{- if or $route.gateway.namespace $route.gateway.name }}
{{- fail "endpoints.route.gateway: for kind gateway only (kind is ingress)" }}
{{- end }}
{{- with $route.ingressClassName }}
- name: TAU_ENDPOINT_INGRESS_CLASS
  value: {{ . | quote }}
{{- end }}
{{- with $route.tls.secretName }}
- name: TAU_ENDPOINT_TLS_SECRET
  value: {{ . | quote }}
{{- end }}
{{- with $route.annotations }}
- name: TAU_ENDPOINT_INGRESS_ANNOTATIONS
  value: {{ toJson . | quote }}
{{- end }}
{{- else }}
{{- if or $route.ingressClassName $route.tls.secretName $route.annotations }}
{{- fail "endpoints.route.ingressClassName, tls and annotations: for kind ingress only (behind a Gateway, TLS and the controller's options are the Gateway's)" }}
{{- end }}
- name: TAU_ENDPOINT_GATEWAY
  value: {{ printf "%s/%s" $route.gateway.namespace $route.gateway.name | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Workspaces' claims of portal.dataPrefixes, each with its volume's name and whether it
is read-only (the default); a workspace named twice fails the install. */}}
{{- define "taugrid.dataPrefixes" -}}
{{- $seen := dict -}}
{{- range .Values.portal.dataPrefixes.claims }}
{{- if hasKey $seen .workspace }}
{{- fail (printf "portal.dataPrefixes.claims: the workspace %s is named twice (its folder is one claim)" .workspace) }}
{{- end }}
{{- $_ := set $seen .workspace true }}
- volume: prefix-{{ .workspace }}
  workspace: {{ .workspace }}
  claim: {{ .claim }}
  readOnly: {{ hasKey . "readOnly" | ternary .readOnly true }}
{{- end }}
{{- end -}}

{{/* Volumes: the secrets as files, /tmp, with data=true the shared storage, and with
prefixes=true the workspaces' claims of portal.dataPrefixes. */}}
{{- define "taugrid.volumes" -}}
- name: secrets
  projected:
    defaultMode: 288  # 0440: the user and the group (fsGroup) read, nobody writes
    sources:
{{- $secrets := .root.Values.secrets }}
{{- range $key, $variable := include "taugrid.secretFiles" .root | fromYaml }}
{{- $ref := get $secrets $key }}
{{- if $ref.name }}
      - secret:
          name: {{ $ref.name }}
          items:
            - key: {{ $ref.key }}
              path: {{ $variable }}
{{- end }}
{{- end }}
- name: tmp
  emptyDir:
    sizeLimit: 1Gi
{{- with .root.Values.portal.evidenceKeyring }}
{{- if .configMap }}
- name: evidence-keyring
  configMap:
    name: {{ .configMap }}
    items:
      - key: {{ .key }}
        path: evidence-keyring.json
{{- end }}
{{- end }}
{{- if .data }}
- name: data
  persistentVolumeClaim:
    claimName: {{ include "taugrid.claimName" .root }}
{{- end }}
{{- if .prefixes }}
{{- range include "taugrid.dataPrefixes" .root | fromYamlArray }}
- name: {{ .volume }}
  persistentVolumeClaim:
    claimName: {{ .claim }}
    readOnly: {{ .readOnly }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "taugrid.volumeMounts" -}}
- name: secrets
  mountPath: /run/secrets/taugrid
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .root.Values.portal.evidenceKeyring.configMap }}
- name: evidence-keyring
  mountPath: /etc/taugrid
  readOnly: true
{{- end }}
{{- if .data }}
- name: data
  mountPath: /var/lib/taugrid
{{- end }}
{{- if .prefixes }}
{{- $dir := .root.Values.portal.dataPrefixes.dir }}
{{- range include "taugrid.dataPrefixes" .root | fromYamlArray }}
- name: {{ .volume }}
  mountPath: {{ printf "%s/%s" $dir .workspace }}
  readOnly: {{ .readOnly }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The pod-level fields every workload of the chart shares. */}}
{{- define "taugrid.podCommon" -}}
{{- $values := index .root.Values .part -}}
securityContext:
  {{- include "taugrid.podSecurityContext" .root | nindent 2 }}
{{- with .root.Values.image.pullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
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
{{- end -}}
