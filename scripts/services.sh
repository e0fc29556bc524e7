#!/usr/bin/env bash
# Local Kafka (KRaft, single node) and MariaDB for development, tests and CI.
#
#   scripts/services.sh up       start both (idempotent: reuses running ones)
#   scripts/services.sh down     stop both, leaving no process behind
#   scripts/services.sh status   print the state of both
#
# One service at a time (NAME is kafka, mariadb or mariadb2), for fault-injection
# tests (integration/chaos_test.go, docs/chaos.md) and manual experiments:
#
#   scripts/services.sh stop NAME     graceful stop (SIGTERM, SIGKILL after the timeout)
#   scripts/services.sh kill NAME     SIGKILL: a crash, no shutdown work at all
#   scripts/services.sh start NAME    start it (idempotent) and wait until it answers
#   scripts/services.sh restart NAME  stop, then start
#
# A crash followed by start exercises recovery: Kafka's log recovery and
# MariaDB's InnoDB crash recovery (prepared XA branches must survive it).
#
# No Docker is needed: Kafka runs from Maven Central jars, MariaDB from the
# Debian package. Everything (jars, data, logs, pid files, sockets) lives in
# the git-ignored .services/ folder at the repository root; the only change
# outside it is installing Debian packages when they are missing.
#
# Environment (defaults in brackets):
#   KAFKA_PORT [9092]             client listener on 127.0.0.1
#   KAFKA_CONTROLLER_PORT [9093]  KRaft controller listener on 127.0.0.1
#   MYSQL_PORT [3306]             MariaDB TCP port on 127.0.0.1
#   MYSQL2_PORT [3307]            the second MariaDB server's TCP port
#   KAFKA_HEAP_OPTS [-Xms256m -Xmx512m]
#   SERVICES_START_TIMEOUT [120]  seconds to wait for each service to answer
#   SERVICES_STOP_TIMEOUT [30]    seconds of graceful shutdown before SIGKILL
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SVC=$ROOT/.services

KAFKA_PORT=${KAFKA_PORT:-9092}
KAFKA_CONTROLLER_PORT=${KAFKA_CONTROLLER_PORT:-9093}
MYSQL_PORT=${MYSQL_PORT:-3306}
MYSQL2_PORT=${MYSQL2_PORT:-3307}
KAFKA_HEAP_OPTS=${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m}
START_TIMEOUT=${SERVICES_START_TIMEOUT:-120}
STOP_TIMEOUT=${SERVICES_STOP_TIMEOUT:-30}

KAFKA_POM=$ROOT/scripts/kafka/pom.xml
KAFKA_DIR=$SVC/kafka
KAFKA_LIBS=$KAFKA_DIR/libs
KAFKA_M2=$KAFKA_DIR/m2 # Maven's local repository: kept here, not in ~/.m2
KAFKA_CONF=$KAFKA_DIR/config
KAFKA_DATA=$KAFKA_DIR/data
KAFKA_LOGS=$KAFKA_DIR/logs
KAFKA_PID=$KAFKA_DIR/kafka.pid

# use_mariadb NAME: points the MARIADB_* variables and MYSQL_PORT at one of
# the two MariaDB servers: "mariadb" (the main one) or "mariadb2", a second,
# independent server for tests that need two servers (two ledgers whose
# control databases have the same name, sharing a shard). Every mariadb_*
# function works on the server last selected.
MYSQL_PORT_MAIN=$MYSQL_PORT
use_mariadb() {
	MARIADB_NAME=$1
	case $1 in
	mariadb)
		MARIADB_DIR=$SVC/mariadb
		MYSQL_PORT=$MYSQL_PORT_MAIN
		MARIADB_POOL=256M
		;;
	mariadb2)
		MARIADB_DIR=$SVC/mariadb2
		MYSQL_PORT=$MYSQL2_PORT
		MARIADB_POOL=64M
		;;
	esac
	MARIADB_CNF=$MARIADB_DIR/my.cnf
	MARIADB_DATA=$MARIADB_DIR/data
	MARIADB_RUN=$MARIADB_DIR/run
	MARIADB_SOCK=$MARIADB_RUN/mariadb.sock
	# A Unix socket path must fit in 108 bytes; a deeply nested checkout uses a
	# per-checkout socket in /tmp instead (the one thing kept outside .services).
	if ((${#MARIADB_SOCK} > 100)); then
		MARIADB_SOCK=/tmp/billing-$1-$(printf '%s' "$ROOT" | sha256sum | cut -c1-12).sock
	fi
	MARIADB_PID=$MARIADB_RUN/mariadbd.pid
	MARIADB_LOGS=$MARIADB_DIR/logs
	MARIADB_TMP=$MARIADB_DIR/tmp
}
use_mariadb mariadb
MARIADB_GRANTS=$ROOT/scripts/mariadb/grants.sql

log() { printf 'services: [%3ds] %s\n' "$SECONDS" "$*" >&2; }
die() {
	printf 'services: ERROR: %s\n' "$*" >&2
	exit 1
}

# port_open PORT: true when something accepts TCP connections on 127.0.0.1:PORT.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# pid_matches PIDFILE PATTERN: prints the pid and succeeds when the pid file
# names a live process whose command line contains PATTERN. The pattern is a
# path under .services, so a recycled pid or another instance never matches.
pid_matches() {
	local pid
	[[ -s $1 ]] || return 1
	pid=$(tr -d '[:space:]' <"$1")
	[[ $pid =~ ^[0-9]+$ ]] || return 1
	[[ -r /proc/$pid/cmdline ]] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2" || return 1
	echo "$pid"
}

# await_exec NAME PID PATTERN: after `cmd &`, $! first names a forked copy of
# this shell, which execs setsid and then the server. Wait until the server
# is what runs under that pid, so pid_matches checks see it.
await_exec() {
	local i
	for ((i = 0; i < 100; i++)); do
		[[ -r /proc/$2/cmdline ]] || die "$1: process $2 exited right after launch, see the logs in $SVC/$1/logs"
		tr '\0' ' ' <"/proc/$2/cmdline" | grep -qF -- "$3" && return 0
		sleep 0.05
	done
	die "$1: process $2 did not start the server within 5s"
}

kafka_pid() { pid_matches "$KAFKA_PID" "$KAFKA_CONF/server.properties"; }
mariadb_pid() { pid_matches "$MARIADB_PID" "$MARIADB_CNF"; }

# stop_pid NAME PID: SIGTERM, wait up to STOP_TIMEOUT seconds, then SIGKILL.
stop_pid() {
	local name=$1 pid=$2 i
	log "$name: stopping (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || return 0
	for ((i = 0; i < STOP_TIMEOUT * 5; i++)); do
		kill -0 "$pid" 2>/dev/null || {
			log "$name: stopped"
			return 0
		}
		sleep 0.2
	done
	log "$name: still running after ${STOP_TIMEOUT}s, sending SIGKILL"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.1
	done
	die "$name: pid $pid survived SIGKILL"
}

# ---------------------------------------------------------------- packages

dpkg_busy() {
	local name
	# One name per pgrep: pgrep warns on patterns over 15 characters, the
	# length of a process name.
	for name in apt-get apt dpkg unattended-upgr; do
		pgrep -x "$name" >/dev/null && return 0
	done
	return 1
}

# wait_for_dpkg: another apt/dpkg run (a provisioning step, unattended
# upgrades) holds the dpkg lock; installing now would fail or race it.
wait_for_dpkg() {
	local waited=0
	while dpkg_busy; do
		((waited == 0)) && log "waiting for a running apt-get/dpkg to finish"
		((waited >= 900)) && die "apt-get/dpkg still running after 900s"
		sleep 2
		waited=$((waited + 2))
	done
}

pkg_installed() {
	[[ $(dpkg-query -W -f='${Status}' "$1" 2>/dev/null) == 'install ok installed' ]]
}

# apt_install PKG...: installs Debian packages without starting their
# services. invoke-rc.d consults /usr/sbin/policy-rc.d; exit code 101 there
# means "do not start", so mariadb-server's postinst does not launch a distro
# mariadbd on port 3306. A policy file that already exists is left alone.
apt_install() {
	command -v apt-get >/dev/null || die "missing: $* (and no apt-get to install them)"
	local policy=/usr/sbin/policy-rc.d made_policy=''
	if [[ ! -e $policy ]]; then
		printf '#!/bin/sh\n# temporary, from scripts/services.sh\nexit 101\n' >"$policy"
		chmod 755 "$policy"
		made_policy=1
		# Removed below; the trap covers an interrupted install too.
		trap 'rm -f /usr/sbin/policy-rc.d' EXIT
	fi
	log "installing Debian packages: $* (log: $SVC/apt.log)"
	local rc=0
	{
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "$@"
	} >>"$SVC/apt.log" 2>&1 || rc=$?
	if [[ -n $made_policy ]]; then
		rm -f "$policy"
		trap - EXIT
	fi
	if ((rc != 0)); then
		tail -n 20 "$SVC/apt.log" >&2
		die "apt-get install $* failed (exit $rc), see $SVC/apt.log"
	fi
}

ensure_packages() {
	local missing=()
	wait_for_dpkg
	if ! command -v mariadbd >/dev/null || ! pkg_installed mariadb-server; then
		missing+=(mariadb-server)
	fi
	if ! command -v mariadb >/dev/null || ! command -v mariadb-admin >/dev/null; then
		missing+=(mariadb-client)
	fi
	command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
	command -v mvn >/dev/null || missing+=(maven)
	if ((${#missing[@]})); then
		apt_install "${missing[@]}"
	fi
	command -v mariadbd >/dev/null || die "missing: mariadbd (package mariadb-server)"
	command -v mariadb-install-db >/dev/null || die "missing: mariadb-install-db (package mariadb-server)"
	command -v java >/dev/null || die "missing: java (package openjdk-17-jre-headless)"
	command -v mvn >/dev/null || die "missing: mvn (package maven)"
	command -v go >/dev/null || die "missing: go (needed to run scripts/kafkaready)"
}

# ---------------------------------------------------------------- kafka

# kafka_jars: copies the broker's runtime classpath from Maven Central into
# .services/kafka/libs. Skipped when the cache was built from the current
# pom.xml (its checksum is stored with the jars), so an edited pom re-resolves.
# Resolution goes to a temporary folder first: an interrupted download never
# leaves a half-filled classpath behind, nor jars of an older pom.
kafka_jars() {
	local want have=''
	want=$(sha256sum "$KAFKA_POM" | cut -d' ' -f1)
	[[ -f $KAFKA_LIBS/.pom.sha256 ]] && have=$(<"$KAFKA_LIBS/.pom.sha256")
	if [[ $have == "$want" ]] && compgen -G "$KAFKA_LIBS/kafka_2.13-*.jar" >/dev/null; then
		return 0
	fi
	local tmp=$KAFKA_DIR/libs.tmp
	rm -rf "$tmp"
	mkdir -p "$KAFKA_LOGS"
	log "kafka: resolving jars with Maven (log: $KAFKA_LOGS/mvn.log)"
	if ! mvn -q -B -f "$KAFKA_POM" -Dmaven.repo.local="$KAFKA_M2" -Dstyle.color=never \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
		>"$KAFKA_LOGS/mvn.log" 2>&1; then
		tail -n 30 "$KAFKA_LOGS/mvn.log" >&2
		die "kafka: mvn dependency:copy-dependencies failed, see $KAFKA_LOGS/mvn.log"
	fi
	echo "$want" >"$tmp/.pom.sha256"
	rm -rf "$KAFKA_LIBS"
	mv "$tmp" "$KAFKA_LIBS"
}

kafka_config() {
	mkdir -p "$KAFKA_CONF" "$KAFKA_DATA" "$KAFKA_LOGS"
	# Static quorum (controller.quorum.voters) rather than the dynamic one of
	# `kafka-storage format --standalone`: a dynamic quorum stores the
	# controller's endpoint in the formatted log, so changing
	# KAFKA_CONTROLLER_PORT later would strand the broker. A static voter set
	# is read from this file on every start.
	cat >"$KAFKA_CONF/server.properties" <<EOF
# Generated by scripts/services.sh; edits are overwritten on every 'up'.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs=$KAFKA_DATA

# One node: every internal topic must be satisfiable by a single replica,
# otherwise transactional producers and consumer groups never become ready.
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=10
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=10
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1

# Tests create their topics explicitly (kadm) and want groups to form at once.
num.partitions=1
auto.create.topics.enable=false
group.initial.rebalance.delay.ms=0

# Upper bound for a producer's transaction.timeout.ms (broker default 15 min);
# long-running or deliberately stalled transactions in tests must fit.
transaction.max.timeout.ms=3600000
EOF
	cat >"$KAFKA_CONF/log4j2.properties" <<EOF
# Generated by scripts/services.sh. Broker log, rotated by size.
status = warn
appender.file.type = RollingFile
appender.file.name = file
appender.file.fileName = $KAFKA_LOGS/server.log
appender.file.filePattern = $KAFKA_LOGS/server.log.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 20MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 5
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
# Per-request chatter that drowns the useful lines.
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.netclient.name = org.apache.kafka.clients.NetworkClient
logger.netclient.level = warn
EOF
	# Command-line tools (storage format) only report problems, on stderr.
	cat >"$KAFKA_CONF/log4j2-tools.properties" <<EOF
status = warn
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
EOF
}

kafka_format() {
	# meta.properties marks a formatted log dir; formatting is a one-time step.
	[[ -f $KAFKA_DATA/meta.properties ]] && return 0
	log "kafka: formatting $KAFKA_DATA"
	# scripts/kafka/format-storage makes the cluster id and passes it so
	# that one starting with "-" is not taken for an option.
	"$ROOT/scripts/kafka/format-storage" "$KAFKA_LIBS" "$KAFKA_CONF/log4j2-tools.properties" "$KAFKA_CONF/server.properties" \
		>>"$KAFKA_LOGS/format.log" 2>&1 ||
		{
			tail -n 20 "$KAFKA_LOGS/format.log" >&2
			die "kafka: storage format failed, see $KAFKA_LOGS/format.log"
		}
	log "kafka: formatted, $(grep -h '^cluster.id=' "$KAFKA_DATA/meta.properties" || echo 'no cluster.id in meta.properties')"
}

# kafka_preflight: succeeds when our broker already runs with the wanted
# ports, fails when it must be started, dies on a conflict. cmd_up runs the
# preflight of both services before starting either, so a conflict on one
# port does not leave the other service half started.
kafka_preflight() {
	local pid p
	if pid=$(kafka_pid); then
		grep -qxF "listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT" \
			"$KAFKA_CONF/server.properties" ||
			die "kafka: running (pid $pid) with other ports than KAFKA_PORT=$KAFKA_PORT KAFKA_CONTROLLER_PORT=$KAFKA_CONTROLLER_PORT; run '$0 down' first"
		return 0
	fi
	for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
		if port_open "$p"; then
			die "kafka: port 127.0.0.1:$p is taken by a process that is not .services' Kafka; stop it or set KAFKA_PORT/KAFKA_CONTROLLER_PORT"
		fi
	done
	return 1
}

# kafka_start: launches the broker in the background and returns at once;
# kafka_wait checks readiness later so MariaDB starts in the meantime.
kafka_start() {
	rm -f "$KAFKA_PID"
	kafka_jars
	kafka_config
	kafka_format
	log "kafka: starting on 127.0.0.1:$KAFKA_PORT (log: $KAFKA_LOGS/server.log)"
	# setsid: own session, so a Ctrl-C in the terminal that ran 'make test'
	# does not take the broker down with the tests.
	# shellcheck disable=SC2086 # KAFKA_HEAP_OPTS is a list of JVM flags
	setsid java $KAFKA_HEAP_OPTS -server \
		-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 \
		-XX:+ExplicitGCInvokesConcurrent -XX:+ExitOnOutOfMemoryError \
		-Djava.awt.headless=true \
		-Dlog4j2.configurationFile="$KAFKA_CONF/log4j2.properties" \
		-Dkafka.logs.dir="$KAFKA_LOGS" \
		-cp "$KAFKA_LIBS/*" kafka.Kafka "$KAFKA_CONF/server.properties" \
		</dev/null >>"$KAFKA_LOGS/kafka.out" 2>&1 &
	echo $! >"$KAFKA_PID"
	await_exec kafka $! "$KAFKA_CONF/server.properties"
}

kafka_wait() {
	local pid
	pid=$(kafka_pid) || {
		tail -n 30 "$KAFKA_LOGS/kafka.out" >&2 || true
		die "kafka: broker process exited during start, see $KAFKA_LOGS/kafka.out and server.log"
	}
	# kafkaready issues Metadata requests until a broker answers; it gives up
	# early if the JVM dies so a crash is reported without the full timeout.
	if ! (cd "$ROOT" && go run ./scripts/kafkaready -brokers "127.0.0.1:$KAFKA_PORT" \
		-timeout "${START_TIMEOUT}s" -pid "$pid"); then
		tail -n 30 "$KAFKA_LOGS/server.log" >&2 || true
		die "kafka: not answering on 127.0.0.1:$KAFKA_PORT, see $KAFKA_LOGS/server.log and kafka.out"
	fi
}

# ---------------------------------------------------------------- mariadb

mariadb_config() {
	mkdir -p "$MARIADB_RUN" "$MARIADB_LOGS" "$MARIADB_TMP"
	cat >"$MARIADB_CNF" <<EOF
# Generated by scripts/services.sh; edits are overwritten on every 'up'.
# Read only through --defaults-file, so /etc/mysql is ignored entirely.
[client]
socket = $MARIADB_SOCK
port = $MYSQL_PORT

[mariadbd]
user = root
datadir = $MARIADB_DATA
socket = $MARIADB_SOCK
pid-file = $MARIADB_PID
log-error = $MARIADB_LOGS/error.log
# A tmpdir of its own: a server deletes every #sql* file in its tmpdir when
# it starts, so a shared /tmp lost another server's temporary tables in
# the middle of a query whenever a test restarted one ("Error on delete of
# '/tmp/#sql-temptable-….MAI'").
tmpdir = $MARIADB_TMP
bind-address = 127.0.0.1
port = $MYSQL_PORT
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
# Durability and isolation the ledger's exactly-once design relies on.
innodb_flush_log_at_trx_commit = 1
transaction-isolation = REPEATABLE-READ
innodb_lock_wait_timeout = 10
max_connections = 1000
innodb_buffer_pool_size = $MARIADB_POOL
# MySQL 8.4's default sql_mode (internal/testenv's mysql84SQLMode), stricter
# than MariaDB's (ONLY_FULL_GROUP_BY, NO_ZERO_DATE, ...): SQL that MySQL 8.4
# would refuse fails here too.
sql_mode = ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION
# The binary log on, as MySQL 8.4 runs by default: XA PREPARE is then
# written to it, and prepare, crash and recovery are exercised with it.
# Bounded: rotated at 64 MiB, files older than an hour are purged.
log_bin = mariadb-bin
server_id = 1
binlog_format = ROW
sync_binlog = 1
max_binlog_size = 64M
binlog_expire_logs_seconds = 3600

[mariadb-install-db]
auth-root-authentication-method = socket
skip-test-db
EOF
}

mariadb_init() {
	[[ -d $MARIADB_DATA/mysql ]] && return 0
	# Initialise into a scratch folder and rename: a failed or interrupted
	# init must not leave a half-built datadir that later runs would trust.
	local tmp=$MARIADB_DIR/data.tmp
	rm -rf "$tmp" "$MARIADB_DATA"
	log "$MARIADB_NAME: initialising $MARIADB_DATA"
	mariadb-install-db --defaults-file="$MARIADB_CNF" --datadir="$tmp" \
		>"$MARIADB_LOGS/install-db.log" 2>&1 || {
		tail -n 30 "$MARIADB_LOGS/install-db.log" >&2
		die "$MARIADB_NAME: mariadb-install-db failed, see $MARIADB_LOGS/install-db.log"
	}
	mv "$tmp" "$MARIADB_DATA"
}

# stop_distro_mariadb: the Debian package may have started its own server
# (datadir /var/lib/mysql) through the init system, which would hold our
# port. Only a server whose working directory is /var/lib/mysql is touched.
stop_distro_mariadb() {
	local pid parent stopped=''
	for pid in $(pgrep -x 'mariadbd|mysqld' || true); do
		[[ $(readlink "/proc/$pid/cwd" 2>/dev/null) == /var/lib/mysql ]] || continue
		log "$MARIADB_NAME: stopping the distribution's server (pid $pid) that holds the port"
		# mysqld_safe restarts a server that dies, so it goes first.
		parent=$(ps -o ppid= -p "$pid" | tr -d ' ')
		if [[ -n $parent && -r /proc/$parent/cmdline ]] && grep -q mysqld_safe "/proc/$parent/cmdline"; then
			kill -TERM "$parent" 2>/dev/null || true
		fi
		stop_pid "distro mariadbd" "$pid"
		stopped=1
	done
	[[ -n $stopped ]]
}

# mariadb_preflight: like kafka_preflight. A distribution-started server
# holding the port is stopped rather than reported as a conflict.
mariadb_preflight() {
	local pid
	if pid=$(mariadb_pid); then
		grep -qxF "port = $MYSQL_PORT" "$MARIADB_CNF" ||
			die "$MARIADB_NAME: running (pid $pid) on another port than MYSQL_PORT=$MYSQL_PORT; run '$0 down' first"
		return 0
	fi
	if port_open "$MYSQL_PORT"; then
		stop_distro_mariadb || true
		sleep 0.5
		if port_open "$MYSQL_PORT"; then
			die "$MARIADB_NAME: port 127.0.0.1:$MYSQL_PORT is taken by a process that is not .services' MariaDB; stop it or set MYSQL_PORT"
		fi
	fi
	return 1
}

mariadb_start() {
	rm -f "$MARIADB_PID"
	mariadb_config
	mariadb_init
	log "$MARIADB_NAME: starting on 127.0.0.1:$MYSQL_PORT (log: $MARIADB_LOGS/error.log)"
	setsid mariadbd --defaults-file="$MARIADB_CNF" </dev/null >>"$MARIADB_LOGS/mariadbd.out" 2>&1 &
	# mariadbd writes its own pid file once up; write it now too so a
	# crash during start-up is noticed by mariadb_wait.
	echo $! >"$MARIADB_PID"
	await_exec "$MARIADB_NAME" $! "$MARIADB_CNF"
}

mariadb_sql() { mariadb --defaults-file="$MARIADB_CNF" --protocol=socket -uroot; }

# mariadb_alive: the server runs. mariadbd rewrites the pid file as it
# comes up (truncated, then written): a read in between finds it empty, so
# an empty or unreadable file is read again before the server counts as
# gone (a chaos run's MariaDB restart once failed on that instant).
mariadb_alive() {
	local j
	for ((j = 0; j < 5; j++)); do
		mariadb_pid >/dev/null && return 0
		sleep 0.1
	done
	return 1
}

mariadb_wait() {
	local i
	for ((i = 0; i < START_TIMEOUT * 5; i++)); do
		mariadb_alive || {
			tail -n 30 "$MARIADB_LOGS/error.log" >&2 || true
			die "$MARIADB_NAME: server exited during start, see $MARIADB_LOGS/error.log"
		}
		if mariadb-admin --defaults-file="$MARIADB_CNF" --protocol=socket -uroot \
			--connect-timeout=2 ping >/dev/null 2>&1 && port_open "$MYSQL_PORT"; then
			break
		fi
		sleep 0.2
	done
	((i < START_TIMEOUT * 5)) || die "$MARIADB_NAME: not answering after ${START_TIMEOUT}s, see $MARIADB_LOGS/error.log"

	# Idempotent account setup. root keeps unix_socket auth (this script,
	# running as root, logs in without a password) and gains password 'root'
	# for TCP: with skip-name-resolve a TCP client from 127.0.0.1 matches
	# 'root'@'127.0.0.1', never 'root'@'localhost'.
	mariadb_sql <<'EOF' || die "$MARIADB_NAME: root account setup failed"
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('root');
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY 'root';
ALTER USER 'root'@'127.0.0.1' IDENTIFIED BY 'root';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
EOF
	mariadb_sql <"$MARIADB_GRANTS" || die "$MARIADB_NAME: $MARIADB_GRANTS failed"

	# The service account must be able to list prepared XA transactions to
	# recover after a crash; check it the way the service will connect.
	mariadb --no-defaults --protocol=tcp -h127.0.0.1 -P"$MYSQL_PORT" -ubilling -pbilling \
		-e 'XA RECOVER' billing >/dev/null ||
		die "$MARIADB_NAME: user billing cannot run XA RECOVER over TCP; check $MARIADB_GRANTS"
}

# ---------------------------------------------------------------- commands

# mariadb_up NAME: the preflight-start-wait sequence of one MariaDB server;
# the preflights ran before (cmd_up runs every preflight first).
mariadb_up() {
	use_mariadb "$1"
	if [[ -n $2 ]]; then
		log "$1: already running (pid $(mariadb_pid))"
	else
		mariadb_start
	fi
}

cmd_up() {
	local t0=$SECONDS
	mkdir -p "$SVC"
	ensure_packages
	local kafka_up='' mariadb_up='' mariadb2_up=''
	kafka_preflight && kafka_up=1
	use_mariadb mariadb
	mariadb_preflight && mariadb_up=1
	use_mariadb mariadb2
	mariadb_preflight && mariadb2_up=1
	# Kafka's JVM boots while MariaDB starts: the start-ups overlap.
	if [[ -n $kafka_up ]]; then
		log "kafka: already running (pid $(kafka_pid))"
	else
		kafka_start
	fi
	mariadb_up mariadb "$mariadb_up"
	mariadb_up mariadb2 "$mariadb2_up"
	for name in mariadb mariadb2; do
		use_mariadb $name
		mariadb_wait
		log "$name: ready on 127.0.0.1:$MYSQL_PORT (admin root:root, service user billing:billing)"
	done
	kafka_wait
	log "kafka: ready on 127.0.0.1:$KAFKA_PORT"
	log "up in $((SECONDS - t0))s: KAFKA_BROKERS=127.0.0.1:$KAFKA_PORT MYSQL_DSN='root:root@tcp(127.0.0.1:$MYSQL_PORT_MAIN)/' MYSQL2_DSN='root:root@tcp(127.0.0.1:$MYSQL2_PORT)/'"
}

# stop_service NAME: graceful stop of one service; a no-op when it is not
# running. The pid file goes either way: a stale one must not name a
# recycled pid later (pid_matches guards against that too).
stop_service() {
	local pid
	case $1 in
	kafka)
		if pid=$(kafka_pid); then
			stop_pid kafka "$pid"
		else
			log "kafka: not running"
		fi
		rm -f "$KAFKA_PID"
		;;
	mariadb | mariadb2)
		use_mariadb "$1"
		if pid=$(mariadb_pid); then
			stop_pid "$1" "$pid"
		else
			log "$1: not running"
		fi
		rm -f "$MARIADB_PID"
		;;
	esac
}

cmd_down() {
	stop_service kafka
	stop_service mariadb
	stop_service mariadb2
}

# service_name NAME: dies unless NAME is a service this script manages.
service_name() {
	case ${1:-} in
	kafka | mariadb | mariadb2) ;;
	*)
		echo "usage: $0 start|stop|kill|restart kafka|mariadb|mariadb2" >&2
		exit 2
		;;
	esac
}

# service_pid NAME: the pid of a running service.
service_pid() {
	case $1 in
	kafka) kafka_pid ;;
	*)
		use_mariadb "$1"
		mariadb_pid
		;;
	esac
}

# cmd_kill NAME: SIGKILL, as a crash or an OOM kill would; the server gets
# no chance to flush or to shut down cleanly. Returns once the process is
# gone, so a following start never races the dying one for its port.
cmd_kill() {
	local pid i
	if ! pid=$(service_pid "$1"); then
		log "$1: not running"
		return 0
	fi
	log "$1: killing (SIGKILL, pid $pid)"
	kill -KILL "$pid" 2>/dev/null || true
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || {
			log "$1: killed"
			return 0
		}
		sleep 0.1
	done
	die "$1: pid $pid survived SIGKILL"
}

# cmd_start NAME: like up, for one service. The others are left alone
# whatever their state.
cmd_start() {
	local t0=$SECONDS
	mkdir -p "$SVC"
	ensure_packages
	case $1 in
	kafka)
		if kafka_preflight; then
			log "kafka: already running (pid $(kafka_pid))"
		else
			kafka_start
		fi
		kafka_wait
		log "kafka: ready on 127.0.0.1:$KAFKA_PORT (started in $((SECONDS - t0))s)"
		;;
	mariadb | mariadb2)
		use_mariadb "$1"
		if mariadb_preflight; then
			log "$1: already running (pid $(mariadb_pid))"
		else
			mariadb_start
		fi
		mariadb_wait
		log "$1: ready on 127.0.0.1:$MYSQL_PORT (started in $((SECONDS - t0))s)"
		;;
	esac
}

# status_line NAME PORT: running, starting (process up, port closed), or
# stopped (with a warning when the port is held by something else).
status_line() {
	local name=$1 pid
	if pid=$(service_pid "$name"); then
		if port_open "$2"; then
			printf '%-8s running   pid %-8s 127.0.0.1:%s\n' "$name" "$pid" "$2"
		else
			printf '%-8s starting  pid %-8s 127.0.0.1:%s not open yet\n' "$name" "$pid" "$2"
		fi
		return 0
	fi
	if port_open "$2"; then
		printf '%-8s stopped   (port 127.0.0.1:%s is held by another process)\n' "$name" "$2"
	else
		printf '%-8s stopped\n' "$name"
	fi
	return 1
}

cmd_status() {
	local rc=0
	status_line kafka "$KAFKA_PORT" || rc=1
	status_line mariadb "$MYSQL_PORT_MAIN" || rc=1
	status_line mariadb2 "$MYSQL2_PORT" || rc=1
	return $rc
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
start | stop | kill | restart)
	service_name "${2:-}"
	case $1 in
	start) cmd_start "$2" ;;
	stop) stop_service "$2" ;;
	kill) cmd_kill "$2" ;;
	restart)
		stop_service "$2"
		cmd_start "$2"
		;;
	esac
	;;
*)
	echo "usage: $0 up|down|status, or start|stop|kill|restart kafka|mariadb|mariadb2" >&2
	exit 2
	;;
esac
