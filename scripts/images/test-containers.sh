#!/usr/bin/env bash
# `make test-containers`: the container path of the project, tested.
#
#   1. the image (scripts/images/images.sh image: Docker, else Podman; local
#      base images where no registry answers);
#   2. the Kafka and MySQL-compatible images of the testcontainers path: the
#      public defaults where a registry answers, else the local ones;
#   3. the image against the local services (KAFKA_BROKERS, MYSQL_DSN:
#      `make test-containers` starts them with scripts/services.sh):
#      integration/container_test.go;
#   4. the testcontainers path: KAFKA_BROKERS and MYSQL_DSN unset, the
#      engine's Docker API reachable (Podman's socket through DOCKER_HOST),
#      the Kafka and XA tests, TestCrashAtEveryCommitStep and the harness's
#      own tests, each of which must report PASS (not SKIP);
#   5. no container, volume or network left behind.
#
# CI=true is set for the tests: a test that cannot reach what it needs fails
# instead of skipping. Each phase's duration is printed.
set -euo pipefail
# shellcheck source=scripts/images/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

: "${KAFKA_BROKERS:?set KAFKA_BROKERS (make test-containers sets it)}"
: "${MYSQL_DSN:?set MYSQL_DSN (make test-containers sets it)}"
IMAGE=${IMAGE:-billing-ledger:local}
GO=${GO:-go}
TIMEOUT=${GO_TEST_TIMEOUT:-20m}
export IMAGE

# The tests that must run (not skip) through testcontainers.
TC_TESTS=(TestKafkaTransactions TestMySQLXA TestCrashAtEveryCommitStep)
CONTAINER_TESTS=(TestContainerImage TestContainerExactlyOnce)

durations=()
t_phase=0
phase() {
	t_phase=$SECONDS
	printf '\n==== test-containers: %s\n' "$1" >&2
	current=$1
}
done_phase() {
	durations+=("$(printf '%-40s %4ds' "$current" $((SECONDS - t_phase)))")
	log "$current: done in $((SECONDS - t_phase))s"
}
summary() {
	local rc=$?
	printf '\n==== test-containers: phase durations\n' >&2
	printf '  %s\n' "${durations[@]}" >&2
	printf '  %-40s %4ds (exit %d)\n' total "$SECONDS" "$rc" >&2
}
trap summary EXIT

# must_pass LOG NAME...: every NAME reported "--- PASS: NAME" in LOG.
must_pass() {
	local log=$1 name missing=()
	shift
	for name in "$@"; do
		grep -qE "^--- PASS: $name \(" "$log" || missing+=("$name")
	done
	((${#missing[@]} == 0)) || die "did not pass (skipped, failed or not run): ${missing[*]}; see $log"
}

cd "$ROOT"
mkdir -p "$IMG_CACHE"
phase "engine"
pick_engine
done_phase

phase "image $IMAGE"
"$ROOT/scripts/images/images.sh" image
done_phase

phase "service images"
images=$("$ROOT/scripts/images/images.sh" services)
KAFKA_IMAGE=$(sed -n 's/^KAFKA_IMAGE=//p' <<<"$images")
MYSQL_IMAGE=$(sed -n 's/^MYSQL_IMAGE=//p' <<<"$images")
log "testcontainers images: Kafka ${KAFKA_IMAGE:-<public default>}, MySQL ${MYSQL_IMAGE:-<public default>}"
done_phase

inventory=$IMG_CACHE/inventory.before
"$ROOT/scripts/images/images.sh" snapshot "$inventory"

phase "image against local services"
log=$IMG_CACHE/test-container-image.log
# The commit images.sh stamped into the image, when make passed it.
CI=true BILLING_IMAGE=$IMAGE BILLING_IMAGE_COMMIT=${COMMIT:-} CONTAINER_ENGINE=$ENGINE \
	KAFKA_BROKERS=$KAFKA_BROKERS MYSQL_DSN=$MYSQL_DSN \
	"$GO" test -count=1 -v -timeout "$TIMEOUT" -run "^($(
		IFS='|'
		echo "${CONTAINER_TESTS[*]}"
	))\$" ./integration/ 2>&1 | tee "$log"
must_pass "$log" "${CONTAINER_TESTS[@]}"
done_phase

phase "testcontainers path"
started_api=''
if [[ $ENGINE == podman ]]; then
	# Stopped at the end only if started here.
	[[ -s $IMG_CACHE/podman-api.pid ]] && had_api=1 || had_api=''
	podman_api_up
	[[ -z $had_api && -s $IMG_CACHE/podman-api.pid ]] && started_api=1
	export DOCKER_HOST=unix://$PODMAN_SOCK
fi
tc_env=(CI=true)
if [[ -n $KAFKA_IMAGE ]]; then
	# Local images: no registry, hence no reaper image; harness.Main removes
	# the containers.
	tc_env+=(TESTCONTAINERS_RYUK_DISABLED=true TESTCONTAINERS_KAFKA_IMAGE="$KAFKA_IMAGE" TESTCONTAINERS_MYSQL_IMAGE="$MYSQL_IMAGE")
fi
log=$IMG_CACHE/test-testcontainers.log
(
	env -u KAFKA_BROKERS -u MYSQL_DSN -u MYSQL2_DSN "${tc_env[@]}" \
		"$GO" test -count=1 -v -p 1 -timeout "$TIMEOUT" -run "^($(
			IFS='|'
			echo "${TC_TESTS[*]}|TestMySQLServerSettings|TestKafkaBrokerSettings|TestContainerImages|TestDatabaseDSN"
		))\$" ./integration/ ./internal/testenv/
) 2>&1 | tee "$log"
must_pass "$log" "${TC_TESTS[@]}" TestMySQLServerSettings TestKafkaBrokerSettings
grep -q 'Creating container for image' "$log" || die "no container was started: the tests did not take the testcontainers path; see $log"
if [[ -n $started_api ]]; then
	podman_api_down
fi
done_phase

phase "leftovers"
"$ROOT/scripts/images/images.sh" leftovers "$inventory"
done_phase
