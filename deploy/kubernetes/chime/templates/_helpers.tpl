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
tls is "true" when the nodes serve TLS: each pod is issued a certificate of
its own by cert-manager's csi-driver (tls.certManagerCSI).
*/}}
{{- define "chime.tls" -}}
{{- if .Values.tls.certManagerCSI.issuerName -}}true{{- end -}}
{{- end -}}

{{/*
Whether the node is secured: TLS, an auth file and gossip keys all given.
*/}}
{{- define "chime.secured" -}}
{{- if and (include "chime.tls" .) .Values.auth.secretName .Values.gossip.secretName -}}true{{- end -}}
{{- end -}}

{{/*
gid is the group chimed runs as (distroless's nonroot), which the pod's
securityContext sets and which must be able to read the certificate files
the csi-driver writes (0440, root-owned, group set by its fs-group).
*/}}
{{- define "chime.gid" -}}65532{{- end -}}

{{/*
dnsNames are the DNS names of a pod's certificate, as the csi-driver's
csi.cert-manager.io/dns-names attribute: it expands ${POD_NAME} and
${POD_NAMESPACE} for each pod. POD.node.chime and node.chime are what chimed
demands (CheckNode: node.chime, and <node-id>.node.chime for its own
--node-id, which is the pod's name, and no other); the pod's stable name under
the headless Service is its advertised address; the client Service's names are
what clients dial.
*/}}
{{- define "chime.dnsNames" -}}
{{- $fullname := include "chime.fullname" . -}}
{{- $names := list "${POD_NAME}.node.chime" "node.chime" -}}
{{- $names = append $names (printf "${POD_NAME}.%s.${POD_NAMESPACE}.svc.%s" (include "chime.headless" .) .Values.clusterDomain) -}}
{{- $names = append $names (printf "%s.${POD_NAMESPACE}.svc.%s" $fullname .Values.clusterDomain) -}}
{{- $names = append $names (printf "%s.${POD_NAMESPACE}.svc" $fullname) -}}
{{- range .Values.tls.certManagerCSI.extraDNSNames -}}
{{- $names = append $names (toString .) -}}
{{- end -}}
{{- join "," $names -}}
{{- end -}}

{{/*
validate fails the render, saying what to change, when the values would make
a node chimed refuses to start, or one that anyone reaching it could use.
*/}}
{{- define "chime.validate" -}}
{{- /* get, not .Values.tls.secretName: the key is no longer in values.yaml, and helm lint --strict refuses a reference to a missing one. */ -}}
{{- if get .Values.tls "secretName" -}}
{{- fail (printf `

chime: refusing to render tls.secretName=%s: one Secret shared by every pod cannot work, and is no longer accepted.
Each node's certificate must name node.chime and <node-id>.node.chime for its own --node-id (the pod's name,
e.g. %s-0.node.chime) and no other node's: chimed refuses to start with a certificate that names another node,
or none, so that one node's key cannot speak as another. A StatefulSet cannot mount a different Secret in each pod.
Let cert-manager's csi-driver (csi.cert-manager.io) issue each pod its own certificate instead:
  tls.certManagerCSI.issuerName    an Issuer (or ClusterIssuer) that signs the node certificates and returns its
                                   CA (a cert-manager CA issuer, or Vault); its CA is what every node trusts as a
                                   node, so give Chime a CA of its own, not one other workloads can get certificates from.
  tls.certManagerCSI.issuerKind    Issuer (default) or ClusterIssuer
  tls.certManagerCSI.issuerGroup   cert-manager.io (default), or an external issuer's group
e.g. --set tls.certManagerCSI.issuerName=chime-nodes (install the csi-driver first:
helm upgrade -i -n cert-manager cert-manager-csi-driver jetstack/cert-manager-csi-driver).
` (get .Values.tls "secretName") (include "chime.fullname" .)) -}}
{{- end -}}
{{- range $k, $v := .Values.tls -}}
{{- if and (ne $k "certManagerCSI") (ne $k "secretName") -}}
{{- fail (printf "\n\nchime: tls.%s is not a value of this chart: nodes get their certificates from cert-manager's csi-driver (tls.certManagerCSI), one per pod; a StatefulSet cannot mount a Secret of its own in each pod.\n" $k) -}}
{{- end -}}
{{- end -}}
{{- if not (or (include "chime.secured" .) .Values.insecure) -}}
{{- $missing := list -}}
{{- if not (include "chime.tls" .) }}{{ $missing = append $missing "tls.certManagerCSI.issuerName" }}{{ end -}}
{{- if not .Values.auth.secretName }}{{ $missing = append $missing "auth.secretName" }}{{ end -}}
{{- if not .Values.gossip.secretName }}{{ $missing = append $missing "gossip.secretName" }}{{ end -}}
{{- fail (printf `

chime: refusing to render nodes that anyone who reaches their ports could use (missing: %s).
Pods listen on every interface, and chimed serves there only with TLS, an auth file and gossip keys:
  tls.certManagerCSI.issuerName  the cert-manager Issuer that signs each pod's own certificate, which cert-manager's
                                 csi-driver requests when the pod starts: it names node.chime and POD.node.chime
                                 (POD: the pod's name, its --node-id) besides the names clients dial, and allows
                                 server and client use. The issuer must return its CA (a CA or Vault issuer).
  auth.secretName                a Secret with auth.json: the tokens and client certificates allowed to call, each
                                 with a role (the --auth-file format in docs/operations.md).
  gossip.secretName              a Secret with gossip.keys: base64 keys, one per line (head -c 32 /dev/urandom | base64).
  drain.credential.secretName    (with auth.secretName) a Secret with the admin token the preStop drain sends.
Or set insecure=true to run in the clear without authentication, on a network only you can reach.
` (join ", " $missing)) -}}
{{- end -}}
{{- if and .Values.auth.secretName (not (include "chime.tls" .)) -}}
{{- fail "\n\nchime: auth.secretName needs TLS (tls.certManagerCSI.issuerName): nodes know each other by their certificates, so an auth file in a cluster needs TLS (chimed refuses it otherwise).\n" -}}
{{- end -}}
{{- if and (include "chime.tls" .) (not .Values.kafka.tls.enabled) (not .Values.kafka.insecure) -}}
{{- fail "\n\nchime: tls.certManagerCSI puts the nodes under TLS, but they would produce to Kafka in plaintext: set kafka.tls.enabled=true (with kafka.tls.secretName for a CA of your own), or kafka.insecure=true if the brokers are on a network only you can reach (chimed refuses it otherwise).\n" -}}
{{- end -}}
{{- if and .Values.auth.secretName (not .Values.drain.credential.secretName) -}}
{{- fail (printf `

chime: refusing to render a preStop drain without a credential of its own (drain.credential.secretName is empty).
With an auth file, chimectl drain must authenticate as an admin, and it does not use the node's key: that
certificate is the node's identity to its peers, not an operator's credential. Give the drain an admin token:
  drain.credential.secretName  a Secret holding the token (kubectl create secret generic chime-drain
                               --from-literal=token="$(head -c 32 /dev/urandom | base64)")
  drain.credential.key         its key in the Secret (default: token)
and grant it role admin in the auth file (Secret %s): {"name": "drain", "sha256": "<sha256 of the token, hex>", "role": "admin"}.
` .Values.auth.secretName) -}}
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
{{- if include "chime.tls" . -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}
