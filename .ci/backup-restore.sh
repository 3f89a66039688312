#!/usr/bin/env bash
# The backup-and-restore acceptance check: a 3-node cluster holding EVENTS pending events is
# backed up, stopped and restored into a new 3-node cluster, and every one of the events must
# reach the new cluster's Kafka topic (read back with chimectl tail), none before its due time.
#
#   .ci/backup-restore.sh                          # 1,000,000 events, due 10 minutes after the load
#   EVENTS=20000 DUE_IN=90s .ci/backup-restore.sh  # a one-minute rehearsal
#
# Not part of .ci/run (the full run takes about DUE_IN plus the drain); cmd/chimed's
# TestBackupRestoreIntoANewCluster checks the same claims on every test run, with fewer events.
# Both clusters are `chimed dev --nodes 3`, each with its own embedded broker, on ports of their
# own (OLD_PORT/NEW_PORT for gRPC; Raft, gossip and HTTP follow at +1, +2, +10, each node +100i;
# Kafka on OLD_KAFKA/NEW_KAFKA), so that a dev cluster on the default ports is left alone.
# Everything goes under WORK (default: a new temporary directory), which is kept for a look.
set -euo pipefail
cd "$(dirname "$0")/.."

EVENTS=${EVENTS:-1000000}
DUE_IN=${DUE_IN:-10m}          # after the load starts (s or m); must leave time for the backup and restore
SPREAD=${SPREAD:-60s}          # the due times are spread over this window (s or m)
OLD_PORT=${OLD_PORT:-17070} OLD_KAFKA=${OLD_KAFKA:-19092}
NEW_PORT=${NEW_PORT:-27070} NEW_KAFKA=${NEW_KAFKA:-29092}
WAIT_AFTER=${WAIT_AFTER:-600}  # seconds to wait for the records after the last is due
TOPIC=acc.restore
WORK=${WORK:-$(mktemp -d -t chime-backup-restore.XXXXXX)}
mkdir -p "$WORK/bin"
echo "work directory: $WORK"

go build -o "$WORK/bin/" ./cmd/chimed ./cmd/chimectl
chimed=$WORK/bin/chimed chimectl=$WORK/bin/chimectl

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT

# start_dev DIR PORT KAFKA LOG: a 3-node dev cluster; waits for its banner (every shard led).
start_dev() {
	"$chimed" dev --nodes 3 --data-dir "$1" --grpc-addr "127.0.0.1:$2" --kafka-addr "127.0.0.1:$3" --log-level warn >"$4" 2>&1 &
	pids+=($!)
	for _ in $(seq 1 600); do
		grep -q "ready in" "$4" && return 0
		kill -0 "${pids[-1]}" 2>/dev/null || { echo "chimed dev exited:"; cat "$4"; exit 1; }
		sleep 1
	done
	echo "chimed dev not ready after 10 minutes:"; cat "$4"; exit 1
}
# wait_converged PORT: until every shard has a leader and its 3 voters.
wait_converged() {
	for _ in $(seq 1 300); do
		"$chimectl" --addr "127.0.0.1:$1" --json status 2>/dev/null |
			jq -e '.shards | length > 0 and all(.leader != "" and (.voters | length) == 3 and (.nonvoters | length) == 0)' >/dev/null &&
			return 0
		sleep 1
	done
	echo "the cluster at 127.0.0.1:$1 did not converge in 5 minutes"; "$chimectl" --addr "127.0.0.1:$1" status; exit 1
}
stop_dev() {
	kill -TERM "${pids[-1]}"
	wait "${pids[-1]}"
	unset 'pids[-1]'
}
secs() { date +%s.%N; }
took() { printf '%.1f s' "$(echo "$(secs) - $1" | bc)"; }

echo "== the old cluster, loaded with $EVENTS events due in $DUE_IN (over $SPREAD)"
start_dev "$WORK/old" "$OLD_PORT" "$OLD_KAFKA" "$WORK/old.log"
wait_converged "$OLD_PORT"
t=$(secs)
"$chimectl" --addr "127.0.0.1:$OLD_PORT" --json bench --events "$EVENTS" --callers 16 --batch 1000 \
	--due-at "$DUE_IN" --spread "$SPREAD" --no-consume --id-prefix acc- --topic "$TOPIC" >"$WORK/load.json"
acked=$(jq .acked "$WORK/load.json")
echo "acknowledged $acked in $(took "$t")"
[ "$acked" = "$EVENTS" ] || { echo "FAIL: $acked of $EVENTS acknowledged"; exit 1; }
"$chimectl" --addr "127.0.0.1:$OLD_PORT" status | tail -n 2

echo "== backup"
# The backup key: chimectl backup signs the manifest with it, chimed restore checks it.
(umask 077; head -c 32 /dev/urandom | base64 >"$WORK/backup.key")
t=$(secs)
"$chimectl" --addr "127.0.0.1:$OLD_PORT" backup --out "$WORK/backup" --backup-key-file "$WORK/backup.key"
echo "backup took $(took "$t"): $(du -sh "$WORK/backup" | cut -f1)"
stop_dev
echo "old cluster stopped"

echo "== restore into node-0 of a new cluster"
t=$(secs)
"$chimed" restore --from "$WORK/backup" --backup-key-file "$WORK/backup.key" --data-dir "$WORK/new/node-0" \
	--node-id node-0 --raft-addr "127.0.0.1:$((NEW_PORT + 1))" | tail -n 4
echo "restore took $(took "$t")"
t=$(secs)
start_dev "$WORK/new" "$NEW_PORT" "$NEW_KAFKA" "$WORK/new.log"
echo "the new cluster's shards all had a leader after $(took "$t")"
wait_converged "$NEW_PORT"
echo "and their 3 voters after $(took "$t")"
"$chimectl" --addr "127.0.0.1:$NEW_PORT" status | tail -n 2

echo "== reading $TOPIC back from the new cluster's Kafka"
# One line per record: its chime-id and how late it fired (chime-fired minus chime-due, ms).
"$chimectl" tail --brokers "127.0.0.1:$NEW_KAFKA" --topic "$TOPIC" --from-beginning --json \
	> >(jq -r --unbuffered '[.chime_id, .late_ms] | @tsv' >"$WORK/records.tsv") &
tail_pid=$!
pids+=("$tail_pid")
# DUE_IN and SPREAD in s or m, as bench takes them.
seconds() { echo "$1" | sed 's/m$/*60/; s/s$//' | bc; }
deadline=$(( $(date +%s) + $(seconds "$DUE_IN") + $(seconds "$SPREAD") + WAIT_AFTER ))
# Counting the distinct ids sorts the whole file: only once there are enough records, so that
# the check takes little of the CPU the drain it measures needs.
while [ "$(date +%s)" -lt "$deadline" ]; do
	sleep 10
	records=$(wc -l <"$WORK/records.tsv")
	echo "$(date +%T) $records records"
	[ "$records" -ge "$EVENTS" ] || continue
	distinct=$(cut -f1 "$WORK/records.tsv" | sort -u | wc -l)
	echo "$(date +%T) $distinct distinct ids"
	[ "$distinct" -ge "$EVENTS" ] && break
done
sleep 5 # duplicates produced right behind the last ones
kill -TERM "$tail_pid" 2>/dev/null || true
wait "$tail_pid" 2>/dev/null || true
sleep 1 # jq writes what it has once tail's output ends

echo "== result"
awk -F'\t' -v n="$EVENTS" '
	{ records++ }
	$1 !~ /^acc-[0-9]+$/ || substr($1, 5) + 0 >= n { foreign++; next }
	seen[$1]++ { dups++; next }
	{ distinct++; if ($2 == "" ) nolate++; else if ($2 + 0 < 0) early++ }
	END {
		printf "%d records: %d of %d events, %d duplicates, %d early, %d without chime headers, %d not from the load\n",
			records, distinct, n, dups, early, nolate, foreign
		exit !(distinct == n && early == 0 && foreign == 0 && nolate == 0)
	}' "$WORK/records.tsv" && echo PASS || { echo FAIL; exit 1; }
