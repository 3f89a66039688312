{{/*
Names. fullname is the release name, or release-chart when the release name
does not already contain the chart name, cut to 63 characters (a DNS label).
The headless Service is fullname-headless; every pod's stable DNS name is
POD.fullname-headless.NAMESPACE.svc.CLUSTERDOMAIN.
*/}}
{{- define "chime.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chime.fullname" -}}
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

{{- define "chime.headless" -}}
{{- printf "%s-headless" (include "chime.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "chime.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "chime.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "chime.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chime.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The gossip address of pod 0, which every pod joins (--join). chimed skips an
entry that is its own gossip address, so pod 0 with an empty data directory
creates the cluster and every other pod joins it; a pod with data restarts
from the peers it stored.
*/}}
{{- define "chime.join" -}}
{{- printf "%s-0.%s.%s.svc.%s:%d" (include "chime.fullname" .) (include "chime.headless" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.gossip) -}}
{{- end -}}

{{/*
Whether the node is secured: TLS, an auth file and gossip keys all given.
*/}}
{{- define "chime.secured" -}}
{{- if and .Values.tls.secretName .Values.auth.secretName .Values.gossip.secretName -}}true{{- end -}}
{{- end -}}

{{/*
validate fails the render, saying what to change, when the values would make
a node chimed refuses to start, or one that anyone reaching it could use.
*/}}
{{- define "chime.validate" -}}
{{- if not (or (include "chime.secured" .) .Values.insecure) -}}
{{- $missing := list -}}
{{- if not .Values.tls.secretName }}{{ $missing = append $missing "tls.secretName" }}{{ end -}}
{{- if not .Values.auth.secretName }}{{ $missing = append $missing "auth.secretName" }}{{ end -}}
{{- if not .Values.gossip.secretName }}{{ $missing = append $missing "gossip.secretName" }}{{ end -}}
{{- fail (printf `

chime: refusing to render nodes that anyone who reaches their ports could use (missing: %s).
Pods listen on every interface, and chimed serves there only with TLS, an auth file and gossip keys:
  tls.secretName     a Secret with tls.crt, tls.key and ca.crt: the node certificate, its key, and the CA
                     that signed every node's certificate. The certificate must name node.chime
                     (a DNS subject alternative name) besides the names clients dial, and allow
                     server and client use.
  auth.secretName    a Secret with auth.json: the tokens and client certificates allowed to call, each with
                     a role (the --auth-file format in docs/operations.md).
  gossip.secretName  a Secret with gossip.keys: base64 keys, one per line (head -c 32 /dev/urandom | base64).
Or set insecure=true to run in the clear without authentication, on a network only you can reach.
` (join ", " $missing)) -}}
{{- end -}}
{{- if and .Values.auth.secretName (not .Values.tls.secretName) -}}
{{- fail "\n\nchime: auth.secretName needs tls.secretName: nodes know each other by their certificates, so an auth file in a cluster needs TLS (chimed refuses it otherwise).\n" -}}
{{- end -}}
{{- if and .Values.tls.secretName (not .Values.kafka.tls.enabled) (not .Values.kafka.insecure) -}}
{{- fail "\n\nchime: tls.secretName puts the nodes under TLS, but they would produce to Kafka in plaintext: set kafka.tls.enabled=true (with kafka.tls.secretName for a CA of your own), or kafka.insecure=true if the brokers are on a network only you can reach (chimed refuses it otherwise).\n" -}}
{{- end -}}
{{- if not (has .Values.antiAffinity (list "preferred" "required")) -}}
{{- fail (printf "\n\nchime: antiAffinity is %q: give preferred (spread the pods over nodes when the scheduler can) or required (never two on one node: with fewer nodes than replicas, some pods stay Pending).\n" (toString .Values.antiAffinity)) -}}
{{- end -}}
{{- if ge (add (int .Values.drain.timeoutSeconds) (int .Values.shutdownTimeoutSeconds)) (int .Values.terminationGracePeriodSeconds) -}}
{{- fail (printf "\n\nchime: terminationGracePeriodSeconds (%d) must exceed drain.timeoutSeconds (%d) plus shutdownTimeoutSeconds (%d): the preStop drain and chimed's own shutdown both run within it, and whatever is left is killed.\n" (int .Values.terminationGracePeriodSeconds) (int .Values.drain.timeoutSeconds) (int .Values.shutdownTimeoutSeconds)) -}}
{{- end -}}
{{- end -}}

{{/*
brokers is kafka.brokers as chimed's comma-separated list; it may be given as
a string or a list.
*/}}
{{- define "chime.brokers" -}}
{{- $b := required "\n\nchime: kafka.brokers is required: the Kafka bootstrap brokers chimed produces to, host:port, as a comma-separated string or a list (e.g. --set kafka.brokers=kafka-0.kafka:9092\\,kafka-1.kafka:9092).\n" .Values.kafka.brokers -}}
{{- if kindIs "slice" $b -}}{{- join "," $b -}}{{- else -}}{{- $b -}}{{- end -}}
{{- end -}}

{{/*
goMemLimit is GOMEMLIMIT for the container's memory limit: goMemLimitPercent
of it, in MiB. The image is built without cgo, so Pebble's block cache and
memtables are in the Go heap and the limit covers them; the rest is left for
what the Go runtime does not count (the Raft logs' mapped file pages, the
binary). Empty when there is no memory limit.
*/}}
{{- define "chime.goMemLimit" -}}
{{- with .Values.resources.limits -}}
{{- with .memory -}}
{{- $q := toString . -}}
{{- $mib := 0 -}}
{{- if regexMatch "^[0-9]+Gi$" $q -}}
{{- $mib = mul (trimSuffix "Gi" $q | atoi) 1024 -}}
{{- else if regexMatch "^[0-9]+Mi$" $q -}}
{{- $mib = trimSuffix "Mi" $q | atoi -}}
{{- else -}}
{{- fail (printf "\n\nchime: resources.limits.memory is %q: give a whole number of Mi or Gi (e.g. 1536Mi, 2Gi): the chart sets GOMEMLIMIT to goMemLimitPercent of it.\n" $q) -}}
{{- end -}}
{{- printf "%dMiB" (div (mul $mib (int $.Values.goMemLimitPercent)) 100) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
scheme of the HTTP port: with --tls-cert chimed serves /healthz, /readyz and
/metrics over HTTPS (kubelet's probes do not verify the certificate).
*/}}
{{- define "chime.httpScheme" -}}
{{- if .Values.tls.secretName -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}
