#!/usr/bin/env bash
# Times `billing shards add` on a ledger of N events (docs/performance.md,
# "Growing from 1 to N servers"): billing-gen writes N events to a new
# topic, one instance counts them on a new database of the first MariaDB
# (127.0.0.1:3306) until billing-verify says EXACT, then, the instance
# restarted with it, a new database of the second one (127.0.0.1:3307) is
# added and the ledger verified over both. ADD_FLAGS are the command's
# (default --rest 0 --rest-checkpoints 0: the move's own rate). Needs `make services` and the binaries in bin/ (go build -o bin/
# ./cmd/...). Writes OUT (default /tmp/measure-add-server); the databases
# and the topic are left for a look (names in OUT/names).
#
#   N=300000 scripts/measure-add-server.sh
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-300000}
OUT=${OUT:-/tmp/measure-add-server}
mkdir -p "$OUT"
ts=$(date +%s)
A="grow_a_$ts" B="grow_b_$ts" TOPIC="grow-$ts"
echo "databases $A (3306) $B (3307), topic $TOPIC" | tee "$OUT/names"
mysql -h127.0.0.1 -P3306 -uroot -proot -e "CREATE DATABASE $A"
mysql -h127.0.0.1 -P3307 -uroot -proot -e "CREATE DATABASE $B"
export KAFKA_BROKERS=127.0.0.1:9092 KAFKA_TOPIC=$TOPIC KAFKA_GROUP=g-$TOPIC HTTP_ADDR= LOG_FORMAT=text
export MYSQL_DSN="root:root@tcp(127.0.0.1:3306)/$A"
bin/billing-gen -topic "$TOPIC" -create-topic -partitions 4 -events "$N" -accounts 20000 -expected "$OUT/expected.json" >"$OUT/gen.txt" 2>"$OUT/gen.log"
bin/billing >"$OUT/instance.log" 2>&1 &
instance=$!
bin/billing-verify -expected "$OUT/expected.json" -wait 30m >"$OUT/verify-before.txt" 2>&1
# The instance is restarted with the server to add (last), as an operator
# does before a move: it counts on while the rows move.
kill -TERM "$instance"; wait "$instance" || true
export MYSQL_SHARD_DSNS="root:root@tcp(127.0.0.1:3307)/$B"
bin/billing >"$OUT/instance2.log" 2>&1 &
instance=$!
sleep 3
t0=$(date +%s.%N)
# ADD_FLAGS: the move's own rate by default (no rest between steps).
MYSQL_SHARD_DSNS= bin/billing shards add --dsn "$MYSQL_SHARD_DSNS" ${ADD_FLAGS:---rest 0 --rest-checkpoints 0} >"$OUT/add.txt" 2>"$OUT/add.log"
t1=$(date +%s.%N)
echo "billing shards add took $(echo "$t1 - $t0" | bc) s" | tee "$OUT/result.txt"
cat "$OUT/add.txt" | tee -a "$OUT/result.txt"
kill -TERM "$instance"; wait "$instance" || echo "the instance ended with $?" | tee -a "$OUT/result.txt"
bin/billing shards status | tee -a "$OUT/result.txt"
bin/billing-verify -expected "$OUT/expected.json" | tee -a "$OUT/result.txt"
