#!/usr/bin/env bash
# The JVM harness (integration/jvm): consumers of the ledger's changelog that
# are not the project's own code, from Maven Central.
#
#   scripts/jvm.sh build             resolve and compile (skipped when nothing changed)
#   scripts/jvm.sh run TOOL ARGS...  build if needed, then run TOOL (exec: the
#                                    JVM takes this process's pid and signals)
#   scripts/jvm.sh clean             remove the build output (not the jars)
#
# TOOL is flink-read or debezium-capture; `scripts/jvm.sh run TOOL` without
# arguments prints its usage. Go tests run it through internal/testenv.JVM.
#
# Like scripts/services.sh for Kafka's jars, Maven's local repository is
# .services/jvm/m2 of this checkout (git-ignored), never ~/.m2; the build
# output is integration/jvm/*/target (git-ignored). The classpath is a list
# of paths into that repository (target/classpath.txt): no jar is copied.
#
# Environment (defaults in brackets):
#   JVM_HEAP [768m]      -Xmx of the tool's JVM
#   SLF4J_LEVEL [warn]   log level of the tool (logs go to stderr)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SRC=$ROOT/integration/jvm
SVC=$ROOT/.services/jvm
M2=$SVC/m2
STAMP=$SRC/target/.sources.sha256
TOOLS=(flink-read debezium-capture)

log() { printf 'jvm: [%3ds] %s\n' "$SECONDS" "$*" >&2; }
die() {
	printf 'jvm: ERROR: %s\n' "$*" >&2
	exit 1
}

need() {
	command -v java >/dev/null || die "missing: java, Java 17 (Debian package openjdk-17-jdk-headless)"
	command -v javac >/dev/null || die "missing: javac, a JDK (Debian package openjdk-17-jdk-headless)"
	command -v mvn >/dev/null || die "missing: mvn (Debian package maven)"
}

# sources_sum: one checksum over every file of the harness's sources (poms,
# Java, resources), so an edit anywhere rebuilds.
sources_sum() {
	(cd "$SRC" && find . -path '*/target' -prune -o -type f -print | LC_ALL=C sort |
		xargs sha256sum | sha256sum | cut -d' ' -f1)
}

built() {
	local tool
	[[ -f $STAMP && $(<"$STAMP") == "$(sources_sum)" ]] || return 1
	for tool in "${TOOLS[@]}"; do
		[[ -s $SRC/$tool/target/classpath.txt && -d $SRC/$tool/target/classes ]] || return 1
	done
}

cmd_build() {
	need
	mkdir -p "$SVC"
	# One build at a time per checkout: test binaries of several packages
	# may ask at once.
	exec 9>"$SVC/build.lock"
	flock 9
	if built; then
		return 0
	fi
	local t0=$SECONDS
	log "building integration/jvm with Maven (local repository $M2, log: $SVC/mvn.log)"
	rm -f "$STAMP"
	if ! mvn -B -q -f "$SRC/pom.xml" -Dmaven.repo.local="$M2" -Dstyle.color=never package \
		>"$SVC/mvn.log" 2>&1; then
		tail -n 40 "$SVC/mvn.log" >&2
		die "mvn package failed, see $SVC/mvn.log"
	fi
	sources_sum >"$STAMP"
	log "built in $((SECONDS - t0))s"
}

cmd_run() {
	local tool=${1:-} main
	case $tool in
	flink-read) main=billing.jvm.flinkread.FlinkRead ;;
	debezium-capture) main=billing.jvm.debeziumcapture.DebeziumCapture ;;
	*) die "usage: $0 run flink-read|debezium-capture ARGS..." ;;
	esac
	shift
	cmd_build
	exec 9>&-
	local cp
	cp=$SRC/$tool/target/classes:$(<"$SRC/$tool/target/classpath.txt")
	# --add-opens: what Flink's own launch scripts give Java 17 (its
	# serializers reflect into java.base).
	exec java -Xmx"${JVM_HEAP:-768m}" -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError \
		-Dorg.slf4j.simpleLogger.defaultLogLevel="${SLF4J_LEVEL:-warn}" \
		--add-opens=java.base/java.lang=ALL-UNNAMED \
		--add-opens=java.base/java.util=ALL-UNNAMED \
		--add-opens=java.base/java.time=ALL-UNNAMED \
		--add-opens=java.base/java.nio=ALL-UNNAMED \
		--add-opens=java.base/java.io=ALL-UNNAMED \
		--add-opens=java.base/java.net=ALL-UNNAMED \
		--add-opens=java.base/sun.nio.ch=ALL-UNNAMED \
		--add-opens=java.base/java.lang.reflect=ALL-UNNAMED \
		--add-opens=java.base/java.util.concurrent=ALL-UNNAMED \
		--add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED \
		-cp "$cp" "$main" "$@"
}

case ${1:-} in
build) cmd_build ;;
run)
	shift
	cmd_run "$@"
	;;
clean)
	for tool in "${TOOLS[@]}"; do rm -rf "${SRC:?}/$tool/target"; done
	rm -rf "$SRC/target"
	;;
*)
	echo "usage: $0 build | run flink-read|debezium-capture ARGS... | clean" >&2
	exit 2
	;;
esac
