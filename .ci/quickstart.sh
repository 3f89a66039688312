#!/usr/bin/env bash
# Runs the README's quickstart against a fresh `chimed dev`, with chimectl and
# with independent clients (grpcurl over server reflection, kcat/librdkafka),
# and fails if any step does not do what the README says.
set -euo pipefail
cd "$(dirname "$0")/.."

work=$(mktemp -d)
bin=$work/bin
mkdir -p "$bin"
go build -o "$bin/chimed" ./cmd/chimed
go build -o "$bin/chimectl" ./cmd/chimectl
# grpcurl is a Go tool: built here at a pinned version rather than expected on
# the PATH.
GOBIN=$bin go install github.com/fullstorydev/grpcurl/cmd/grpcurl@v1.9.4
grpcurl() { "$bin/grpcurl" "$@"; }

# Ports of our own, so a developer's running dev node does not interfere.
grpc=127.0.0.1:17070 http=127.0.0.1:17080 raft=127.0.0.1:17071 kafka=127.0.0.1:19092
"$bin/chimed" dev --data-dir "$work/data" --grpc-addr $grpc --http-addr $http \
  --raft-addr $raft --kafka-addr $kafka >"$work/chimed.out" 2>"$work/chimed.err" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "quickstart: $*" >&2; echo "--- chimed stderr:" >&2; tail -30 "$work/chimed.err" >&2; exit 1; }

for _ in $(seq 1 150); do
  curl -fsS "http://$http/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "http://$http/readyz" >/dev/null || fail "chimed dev not ready"
grep -q "chimed dev: node" "$work/chimed.out" || fail "no startup banner"

ctl() { "$bin/chimectl" --addr $grpc "$@"; }

echo "== chimectl"
out=$(ctl schedule --topic qs.demo --in 1s --payload hello --id qs-1 --json)
echo "$out"
echo "$out" | grep '"id":"qs-1"' >/dev/null || fail "schedule --json did not print the id"
ctl schedule --topic qs.demo --at 2035-01-01T09:00:00Z --id qs-later --payload reminder
ctl get qs-later --json | grep '"state":"scheduled"' >/dev/null || fail "get --json: not scheduled"
ctl update qs-later --in 1h --payload 'second reminder' | grep "updated qs-later to version 2" >/dev/null || fail "update did not make version 2"
ctl get qs-later --json | grep '"version":2' >/dev/null || fail "get --json: not version 2 after the update"
ctl list --prefix qs- | grep "qs-later  scheduled" >/dev/null || fail "list --prefix qs- did not show qs-later scheduled"
[ "$(ctl count --state scheduled)" -ge 1 ] || fail "count --state scheduled"
ctl cancel qs-later
ctl cancel --prefix qs- --dry-run --json | grep '"dry_run":true' >/dev/null || fail "cancel --prefix --dry-run --json"
ctl get qs-later --json | grep '"state":"cancelled"' >/dev/null || fail "get --json: not cancelled"
tailout=$(timeout 20 "$bin/chimectl" tail --topic qs.demo --brokers $kafka --from-beginning --count 1)
echo "$tailout"
echo "$tailout" | grep "qs-1" >/dev/null || fail "tail did not show qs-1"
for _ in $(seq 1 50); do
  ctl get qs-1 --json | grep '"state":"fired"' >/dev/null && break
  sleep 0.1
done
ctl get qs-1 --json | grep '"state":"fired"' >/dev/null || fail "qs-1 not marked fired"
ctl recurring create --id qs-beat --topic qs.demo --every 1s --max 3 | grep "created recurring schedule qs-beat" >/dev/null || fail "recurring create"
ctl recurring get qs-beat | grep "event qs-beat@" >/dev/null || fail "recurring get did not show the next occurrence"
for _ in $(seq 1 100); do
  ctl recurring get qs-beat | grep "completed" >/dev/null && break
  sleep 0.1
done
ctl recurring get qs-beat | grep "3 settled" >/dev/null || fail "qs-beat did not occur three times and complete"
[ "$(ctl count --prefix qs-beat@ --state fired)" -eq 3 ] || fail "count of qs-beat's fired occurrences"
ctl status || fail "chimectl status against chimed dev"

echo "== grpcurl and kcat"
# (grep reads all of its input here: with grep -q, a command still writing
# after the first match dies of SIGPIPE and pipefail fails the step.)
grpcurl -plaintext $grpc list | grep chime.v1.Scheduler >/dev/null || fail "reflection does not list chime.v1.Scheduler"
grpcurl -plaintext -d '{"event":{"id":"hello-1","topic":"qs.grpcurl","delay":"1s","payload":"aGVsbG8="}}' \
  $grpc chime.v1.Scheduler/Schedule | tee "$work/sched.json"
grep -q '"id": "hello-1"' "$work/sched.json" || fail "grpcurl Schedule"
for _ in $(seq 1 50); do # kcat refuses a topic that does not exist yet: wait for the fire
  grpcurl -plaintext -d '{"id":"hello-1"}' $grpc chime.v1.Scheduler/Get | grep EVENT_STATE_FIRED >/dev/null && break
  sleep 0.1
done
grpcurl -plaintext -d '{"id":"hello-1"}' $grpc chime.v1.Scheduler/Get | grep EVENT_STATE_FIRED >/dev/null || fail "hello-1 did not fire"
rec=$(timeout 20 kcat -C -b $kafka -t qs.grpcurl -o beginning -c 1 -f 'key=%k value=%s headers=%h\n')
echo "$rec"
case "$rec" in
  *"key=hello-1 value=hello"*"chime-id=hello-1"*"chime-due-unix-ms="*"chime-fired-unix-ms="*"chime-attempt=1"*"chime-version=1"*) ;;
  *) fail "kcat did not read the record as the README shows" ;;
esac

echo "== graceful shutdown"
kill -TERM "$pid"
wait "$pid" || fail "chimed dev exited non-zero after SIGTERM"
echo "quickstart: ok"
