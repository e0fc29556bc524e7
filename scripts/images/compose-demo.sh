#!/usr/bin/env bash
# `make compose-demo`: docker-compose.yml for real.
#
#   1. images: the billing image (images.sh image) and, where no registry
#      answers, the local Kafka and MariaDB images, passed as KAFKA_IMAGE
#      and MYSQL_IMAGE (MariaDB 10.11 stands in for MySQL 8.4);
#   2. `up -d`: kafka, kafka-init, mysql, billing; waits until kafka and
#      mysql are healthy and billing is ready;
#   3. the generator (profile demo), then `up -d --scale billing=3` while
#      the service catches up, then the verifier (profile demo), which must
#      print EXACT; all three instances must turn healthy (ready);
#   4. `down -v`, after which no container, volume or network of the run is
#      left.
#
# Compose: `docker compose` with Docker; with Podman, podman-compose from
# PyPI in a virtual environment under .services/images. Podman without
# systemd runs no periodic health checks and podman-compose ignores health
# conditions before Podman 4.6, so the waits here run the checks themselves.
#
# Environment: GEN_EVENTS [100000] and the other variables of
# docker-compose.yml; COMPOSE_DEMO_PROJECT [billing-ledger-demo];
# PODMAN_COMPOSE_VERSION [1.6.0].
set -euo pipefail
# shellcheck source=scripts/images/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

cd "$ROOT"
IMAGE=${IMAGE:-billing-ledger:local}
PROJECT=${COMPOSE_DEMO_PROJECT:-billing-ledger-demo}
PODMAN_COMPOSE_VERSION=${PODMAN_COMPOSE_VERSION:-1.6.0}
export GEN_EVENTS=${GEN_EVENTS:-100000}

t_phase=$SECONDS
phase() {
	((SECONDS > t_phase)) && log "$current: done in $((SECONDS - t_phase))s"
	t_phase=$SECONDS
	current=$1
	printf '\n==== compose-demo: %s\n' "$1" >&2
}
current=start

pick_engine

phase "images"
"$ROOT/scripts/images/images.sh" image
export BILLING_IMAGE=$IMAGE
images=$("$ROOT/scripts/images/images.sh" services)
KAFKA_IMAGE=$(sed -n 's/^KAFKA_IMAGE=//p' <<<"$images")
MYSQL_IMAGE=$(sed -n 's/^MYSQL_IMAGE=//p' <<<"$images")
[[ -n $KAFKA_IMAGE ]] && export KAFKA_IMAGE MYSQL_IMAGE

phase "compose"
if [[ $ENGINE == docker ]]; then
	docker compose version >/dev/null 2>&1 || die "docker compose (Compose v2) is not installed"
	compose=(docker compose)
else
	venv=$IMG_CACHE/compose-venv
	if [[ ! -x $venv/bin/podman-compose ]] || [[ $("$venv/bin/podman-compose" version 2>/dev/null | head -n1) != *"$PODMAN_COMPOSE_VERSION"* ]]; then
		log "installing podman-compose $PODMAN_COMPOSE_VERSION from PyPI into $venv"
		rm -rf "$venv"
		python3 -m venv "$venv" 2>/dev/null || {
			apt_install python3-venv
			python3 -m venv "$venv"
		}
		"$venv/bin/pip" install -q "podman-compose==$PODMAN_COMPOSE_VERSION"
	fi
	compose=("$venv/bin/podman-compose")
fi
compose+=(-p "$PROJECT" -f "$ROOT/docker-compose.yml")
log "compose: ${compose[*]}; images: billing $BILLING_IMAGE, kafka ${KAFKA_IMAGE:-<public>}, mysql ${MYSQL_IMAGE:-<public>}"

inventory=$IMG_CACHE/inventory.compose-demo
"$ROOT/scripts/images/images.sh" snapshot "$inventory"
down() {
	local rc=$?
	trap - EXIT
	phase "down -v"
	# --remove-orphans: podman-compose's down otherwise removes one
	# container per service (the file's count), not the scaled instances.
	"${compose[@]}" --profile demo down -v --remove-orphans >"$IMG_CACHE/compose-down.log" 2>&1 || {
		tail -n 20 "$IMG_CACHE/compose-down.log" >&2
		rc=1
	}
	"$ROOT/scripts/images/images.sh" leftovers "$inventory" || rc=1
	phase "end"
	log "compose-demo: exit $rc after ${SECONDS}s"
	exit "$rc"
}
trap down EXIT

# ids SERVICE: the running containers of a service of this project.
ids() {
	"$ENGINE" ps -q --filter "label=com.docker.compose.project=$PROJECT" \
		--filter "label=com.docker.compose.service=$1"
}

# ids_all SERVICE: its containers in any state.
ids_all() {
	"$ENGINE" ps -a -q --filter "label=com.docker.compose.project=$PROJECT" \
		--filter "label=com.docker.compose.service=$1"
}

# healthy SERVICE COUNT TIMEOUT: COUNT containers of SERVICE pass their
# health check. With Podman the check is run here (no systemd timers).
healthy() {
	local service=$1 want=$2 timeout=$3 deadline=$((SECONDS + $3)) ok id
	while :; do
		ok=0
		for id in $(ids "$service"); do
			if [[ $ENGINE == podman ]]; then
				podman healthcheck run "$id" >/dev/null 2>&1 && ok=$((ok + 1))
			else
				[[ $(docker inspect --format '{{.State.Health.Status}}' "$id") == healthy ]] && ok=$((ok + 1))
			fi
		done
		((ok >= want)) && {
			log "$service: $ok healthy"
			return 0
		}
		((SECONDS < deadline)) || die "$service: $ok of $want healthy after ${timeout}s"
		sleep 2
	done
}

# Every step names its services with --no-deps and waits here for what
# depends_on asks: podman-compose before Podman 4.6 ignores the health
# conditions, and its --requires links make Podman 4.3 restart finished
# one-shot containers (kafka-init) or fail to start dependents. The order is
# the file's: kafka and mysql healthy, kafka-init done, then billing.
phase "up -d kafka mysql"
up() {
	local rc=0
	"${compose[@]}" up -d --no-deps "$@" >"$IMG_CACHE/compose-up.log" 2>&1 || rc=$?
	grep -vE '^(Getting|Copying|Writing|Storing)|systemd connection' "$IMG_CACHE/compose-up.log" >&2 || true
	return $rc
}
up kafka mysql
healthy kafka 1 180
healthy mysql 1 180

phase "up -d kafka-init"
up kafka-init
init=$(ids_all kafka-init)
[[ -n $init ]] || die "kafka-init: no container"
rc=$("$ENGINE" wait "$init" | tail -n1)
[[ $rc == 0 ]] || {
	"$ENGINE" logs "$init" >&2
	die "kafka-init exited $rc"
}

phase "up -d billing"
up billing
healthy billing 1 180

phase "generator"
"${compose[@]}" --profile demo run --rm --no-deps -T generator

phase "scale billing=3"
up --scale billing=3 billing
healthy billing 3 180

phase "verify"
out=$("${compose[@]}" --profile demo run --rm --no-deps -T verify 2>&1) || {
	echo "$out" >&2
	die "verify failed"
}
echo "$out" >&2
grep -q '^EXACT' <<<"$out" || die "verify did not print EXACT"
n=$(ids billing | wc -l)
((n == 3)) || die "billing: $n instances running after the demo, want 3"
log "EXACT with $n billing instances"
