#!/usr/bin/env bash
# Container images of the billing ledger, with Docker or Podman, with or
# without an image registry (docs/docker.md).
#
#   scripts/images/images.sh image        build IMAGE from the Dockerfile (make image)
#   scripts/images/images.sh services     print KAFKA_IMAGE=... and MYSQL_IMAGE=...:
#                                         empty (the public defaults) when a registry
#                                         answers, else the local images, built here
#   scripts/images/images.sh engine       print the engine (docker or podman), set up
#   scripts/images/images.sh api-up       Podman only: start the Docker API socket for
#                                         testcontainers-go; prints DOCKER_HOST=...
#   scripts/images/images.sh api-down     stop the API service if api-up started it
#   scripts/images/images.sh snapshot F   record the engine's containers, volumes and
#                                         networks in F
#   scripts/images/images.sh leftovers F  fail listing what exists now and not in F
#
# Environment (defaults in brackets): IMAGE [billing-ledger:local],
# VERSION [git describe], COMMIT [git rev-parse HEAD], GOPROXY [go env
# GOPROXY, when Go is installed] for the Go build, plus those of lib.sh (CONTAINER_ENGINE,
# IMAGE_BASES, DEBIAN_MIRROR).
set -euo pipefail
# shellcheck source=scripts/images/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

IMAGE=${IMAGE:-billing-ledger:local}

cmd_image() {
	local t0=$SECONDS args=() version commit
	pick_engine
	version=${VERSION:-$(git -C "$ROOT" describe --tags --always --dirty 2>/dev/null || echo dev)}
	commit=${COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}
	args+=(--build-arg "VERSION=$version" --build-arg "COMMIT=$commit")
	# The module proxy the host uses (a mirror, say), when Go is installed.
	local goproxy=${GOPROXY:-$(go env GOPROXY 2>/dev/null || true)}
	[[ -n $goproxy ]] && args+=(--build-arg "GOPROXY=$goproxy")
	# Buildah leaves TARGETOS and TARGETARCH unset unless --platform is given.
	if [[ $ENGINE == podman ]]; then
		args+=(--build-arg TARGETOS=linux --build-arg "TARGETARCH=$(podman info --format '{{.Host.Arch}}')")
	fi
	if want_local_bases; then
		local_golang
		local_runtime
		args+=(--build-arg "GOLANG_IMAGE=$LOCAL_GOLANG" --build-arg "RUNTIME_IMAGE=$LOCAL_RUNTIME")
		log "bases ready after $((SECONDS - t0))s: $LOCAL_GOLANG, $LOCAL_RUNTIME"
	fi
	log "building $IMAGE (version $version, commit ${commit:0:12})"
	local t1=$SECONDS
	build "${args[@]}" -t "$IMAGE" "$ROOT"
	local size
	size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
	log "built $IMAGE: $((size / 1000000)) MB ($size bytes); image build $((SECONDS - t1))s, total $((SECONDS - t0))s"
}

cmd_services() {
	pick_engine
	if want_local_bases; then
		local_kafka
		local_mariadb
		echo "KAFKA_IMAGE=$LOCAL_KAFKA"
		echo "MYSQL_IMAGE=$LOCAL_MARIADB"
	else
		echo "KAFKA_IMAGE="
		echo "MYSQL_IMAGE="
	fi
}

cmd_api_up() {
	pick_engine
	if [[ $ENGINE == podman ]]; then
		podman_api_up
		echo "DOCKER_HOST=unix://$PODMAN_SOCK"
	else
		echo "DOCKER_HOST=${DOCKER_HOST:-}"
	fi
}

# The engine's objects, one per line: containers (all states), volumes,
# networks.
inventory() {
	"$ENGINE" ps -a --format 'container {{.ID}} {{.Names}} {{.Image}}' | sort
	"$ENGINE" volume ls --format 'volume {{.Name}}' | sort
	"$ENGINE" network ls --format 'network {{.Name}}' | sort
}

cmd_snapshot() {
	pick_engine
	inventory >"$1"
}

cmd_leftovers() {
	pick_engine
	local now left
	now=$(inventory)
	left=$(comm -13 "$1" <(printf '%s\n' "$now") | sed '/^$/d')
	if [[ -n $left ]]; then
		printf 'images: ERROR: left behind by the run:\n%s\n' "$left" >&2
		exit 1
	fi
	log "nothing left behind: no new container, volume or network"
}

case ${1:-} in
image) cmd_image ;;
services) cmd_services ;;
engine)
	pick_engine
	echo "$ENGINE"
	;;
api-up) cmd_api_up ;;
api-down)
	pick_engine
	[[ $ENGINE == podman ]] && podman_api_down
	;;
snapshot | leftovers)
	[[ -n ${2:-} ]] || die "usage: $0 $1 FILE"
	"cmd_$1" "$2"
	;;
*)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
	exit 2
	;;
esac
