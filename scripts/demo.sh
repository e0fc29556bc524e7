#!/usr/bin/env bash
# The main job in one command (make demo): start Kafka and MariaDB, create a
# topic with several partitions and a fresh database, run the service
# (DEMO_INSTANCES members of one consumer group), write DEMO_EVENTS events
# with duplicates, conflicting duplicates, malformed records, aborted
# transactions and overflow cases, then print a summary of the ledger and an
# exact comparison with the totals the generator expected.
#
# Environment (defaults in brackets): DEMO_EVENTS [100000], DEMO_INSTANCES
# [2], DEMO_PARTITIONS [6], DEMO_RATE [0 = as fast as possible],
# DEMO_SEED [from the clock], DEMO_FORMAT [json; avro, protobuf or
# json-schema start the schema registry, ../shared/registry/run, on
# REGISTRY_PORT [18081]], KAFKA_PORT [9092], MYSQL_PORT [3306].
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
EVENTS=${DEMO_EVENTS:-100000}
INSTANCES=${DEMO_INSTANCES:-2}
PARTITIONS=${DEMO_PARTITIONS:-6}
RATE=${DEMO_RATE:-0}
FORMAT=${DEMO_FORMAT:-json}
REGISTRY_PORT=${REGISTRY_PORT:-18081}
KAFKA_PORT=${KAFKA_PORT:-9092}
MYSQL_PORT=${MYSQL_PORT:-3306}
# The run's topic, group, database and log folder: the time, for reading,
# and random digits, so that two demos started within a second (two
# terminals, a script) never share them.
RUN=$(date +%Y%m%d%H%M%S)_$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
TOPIC=demo-$RUN
DB=demo_$RUN
OUT=$ROOT/.services/demo/$RUN
mkdir -p "$OUT"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
sql() { mariadb -h127.0.0.1 -P"$MYSQL_PORT" -uroot -proot --table "$@"; }

say "services"
scripts/services.sh up
if [[ $FORMAT != json ]]; then
	say "schema registry"
	export SCHEMA_REGISTRY_URL=http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7
	curl -fs -o /dev/null "$SCHEMA_REGISTRY_URL/subjects" || ../shared/registry/run start "$REGISTRY_PORT"
fi
# The service reads it, and so does the generator (-format).
export EVENT_FORMAT=$FORMAT
say "build"
go build -o bin/ ./cmd/billing ./cmd/billing-gen ./cmd/billing-verify

export KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT KAFKA_TOPIC=$TOPIC KAFKA_GROUP=demo-$RUN
export MYSQL_DSN="root:root@tcp(127.0.0.1:$MYSQL_PORT)/$DB"
export HTTP_ADDR="" LOG_FORMAT=json CHECKPOINT_INTERVAL=${CHECKPOINT_INTERVAL:-1s}
sql -e "CREATE DATABASE $DB"

say "topic $TOPIC ($PARTITIONS partitions), database $DB"
seed=()
[[ -n ${DEMO_SEED:-} ]] && seed=(-seed "$DEMO_SEED")
# The generator creates the topic before the service joins, so that the
# service sees every partition from the start.
bin/billing-gen -events 0 -malformed-ratio 0 -overflow-cases 0 -create-topic -partitions "$PARTITIONS" \
	-expected "$OUT/empty.json" -progress none >/dev/null

pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
say "service: $INSTANCES instance(s), logs in $OUT"
for i in $(seq 1 "$INSTANCES"); do
	bin/billing >"$OUT/billing-$i.log" 2>&1 &
	pids+=($!)
done

say "generator: $EVENTS events"
bin/billing-gen -events "$EVENTS" -rate "$RATE" -expected "$OUT/expected.json" "${seed[@]}"

say "waiting for the ledger to match exactly"
verdict=0
bin/billing-verify -expected "$OUT/expected.json" -wait 10m -interval 1s || verdict=$?

say "ledger summary"
sql "$DB" -e "
SELECT COUNT(*) AS accounts_currencies, SUM(event_count) AS events, SUM(balance_minor) AS sum_minor FROM account_balances;
SELECT currency, COUNT(*) AS accounts, SUM(event_count) AS events, SUM(balance_minor) AS balance_minor FROM account_balances GROUP BY currency;
SELECT account_id, currency, balance_minor, event_count FROM account_balances ORDER BY event_count DESC LIMIT 5;
SELECT COUNT(*) AS windows, MIN(window_start) AS first_window, MAX(window_start) AS last_window FROM billing_windows;
SELECT reason, COUNT(*) AS dead_letters FROM dead_letters GROUP BY reason ORDER BY reason;
SELECT COUNT(*) AS checkpoints_decided, SUM(outcome = 'abort') AS aborted FROM checkpoint_decisions;"

say "stopping the service"
cleanup
trap - EXIT
grep -h '"msg":"stopped"' "$OUT"/billing-*.log || true
if [[ $verdict -eq 0 ]]; then
	say "EXACT: the ledger matches the generator's expectation (database $DB kept; drop it when done)"
else
	say "MISMATCH (exit $verdict): see above and $OUT"
fi
exit "$verdict"
