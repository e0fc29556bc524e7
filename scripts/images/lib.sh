# shellcheck shell=bash
# Sourced by the scripts of scripts/images/: which container engine to use,
# how to set Podman up on a machine without Docker, and the local
# substitutes of the public base and service images for machines that reach
# no image registry. See docs/docker.md ("Without Docker Hub").
#
# Environment (defaults in brackets):
#   CONTAINER_ENGINE [docker if it answers, else podman]
#   IMAGE_BASES [auto]   public, local, or auto: public when a registry
#                        answers (one small pull), else local substitutes
#   DEBIAN_MIRROR [http://deb.debian.org/debian]  for debootstrap

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# Everything local goes under the git-ignored .services/, next to the
# services of scripts/services.sh: the Debian root file system tarball, build
# contexts, the Podman API service's pid and log.
IMG_CACHE=$ROOT/.services/images

# Names of the local substitutes. "localhost/" keeps them apart from anything
# a registry serves; both Docker and Podman accept such names.
LOCAL_DEBIAN=localhost/billing-local/debian:bookworm
LOCAL_RUNTIME=localhost/billing-local/distroless-static:nonroot
LOCAL_MARIADB=localhost/billing-local/mariadb:10.11
# Set by local_golang and local_kafka: they depend on the host's Go and on
# scripts/kafka/pom.xml.
LOCAL_GOLANG=''
LOCAL_KAFKA=''

# The Podman API socket testcontainers-go talks to (DOCKER_HOST).
PODMAN_SOCK=/run/podman/podman.sock

log() { printf 'images: [%4ds] %s\n' "$SECONDS" "$*" >&2; }
die() {
	printf 'images: ERROR: %s\n' "$*" >&2
	exit 1
}

is_root() { [[ $(id -u) == 0 ]]; }

# apt_install PKG...: Debian packages, as root only. None of the packages
# installed here starts a service.
apt_install() {
	if ! is_root || ! command -v apt-get >/dev/null; then
		die "missing: $* (install them, or run as root on Debian)"
	fi
	mkdir -p "$IMG_CACHE"
	log "installing Debian packages: $* (log: $IMG_CACHE/apt.log)"
	{
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -q &&
			DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "$@"
	} >>"$IMG_CACHE/apt.log" 2>&1 || {
		tail -n 20 "$IMG_CACHE/apt.log" >&2
		die "apt-get install $* failed, see $IMG_CACHE/apt.log"
	}
}

# ---------------------------------------------------------------- engine

# docker_answers: the Docker CLI reaches a Docker daemon. A DOCKER_HOST that
# points at Podman's Docker-compatible socket does not count: `docker build`
# (BuildKit) does not work against it, and Podman is used directly instead.
docker_answers() {
	command -v docker >/dev/null || return 1
	local components
	components=$(timeout 20 docker version --format '{{range .Server.Components}}{{.Name}};{{end}}' 2>/dev/null) || return 1
	[[ $components != *Podman* ]]
}

# pick_engine: sets ENGINE to docker or podman (CONTAINER_ENGINE wins),
# installing and configuring Podman when it is the one.
pick_engine() {
	[[ -n ${ENGINE:-} ]] && return 0
	if [[ -n ${CONTAINER_ENGINE:-} ]]; then
		ENGINE=$CONTAINER_ENGINE
	elif docker_answers; then
		ENGINE=docker
	else
		ENGINE=podman
	fi
	case $ENGINE in
	docker) ;;
	podman) podman_setup ;;
	*) die "CONTAINER_ENGINE must be docker or podman, not $ENGINE" ;;
	esac
	log "engine: $ENGINE"
}

# podman_setup: Podman with runc, as measured on our Debian 12 machines
# (Podman 4.3, CNI networking).
# crun, Podman's default runtime, refuses to start containers where the
# cgroups are in hybrid mode; runc works. Podman's default rlimits (nofile
# 1048576) exceed the host's hard limits there, and runc's setrlimit is
# refused: the defaults below stay at or under the host's. Both go into a
# drop-in of containers.conf, so that every Podman client uses them: the
# CLI, podman-compose and the API service testcontainers-go talks to.
# Root only (rootless Podman keeps its own configuration); idempotent.
podman_setup() {
	# dnsname: containers of a compose project find each other by service
	# name on the project's network (Podman 4.3 with CNI networking).
	if ! command -v podman >/dev/null || ! command -v runc >/dev/null ||
		{ [[ -d /usr/lib/cni ]] && [[ ! -x /usr/lib/cni/dnsname ]]; }; then
		apt_install podman runc golang-github-containernetworking-plugin-dnsname
	fi
	is_root || return 0
	local nofile nproc conf=/etc/containers/containers.conf.d/50-billing-ledger.conf want
	nofile=$(ulimit -Hn)
	[[ $nofile == unlimited || $nofile -gt 65536 ]] && nofile=65536
	nproc=$(ulimit -Hu)
	# Podman runs conmon and runc under a process limit of its own (32768
	# measured here); a container limit above it is refused as well.
	[[ $nproc == unlimited || $nproc -gt 16384 ]] && nproc=16384
	want=$(
		cat <<EOF
# Written by scripts/images/lib.sh (billing ledger): runc instead of crun,
# and rlimits within the host's hard limits. Delete to restore the defaults.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
EOF
	)
	if [[ ! -f $conf || $(<"$conf") != "$want" ]]; then
		mkdir -p "$(dirname "$conf")"
		printf '%s\n' "$want" >"$conf"
		log "podman: wrote $conf (runtime runc, nofile $nofile, nproc $nproc)"
	fi
}

# podman_api_up: the Docker-compatible API on PODMAN_SOCK, for
# testcontainers-go. Reuses a service that answers; otherwise starts one
# and records its pid, so podman_api_down stops only what this started.
podman_api_up() {
	local pidfile=$IMG_CACHE/podman-api.pid i
	mkdir -p "$IMG_CACHE"
	if podman --url "unix://$PODMAN_SOCK" version >/dev/null 2>&1; then
		return 0
	fi
	mkdir -p "$(dirname "$PODMAN_SOCK")"
	log "podman: starting the API service on $PODMAN_SOCK (log: $IMG_CACHE/podman-api.log)"
	setsid podman system service --time=0 "unix://$PODMAN_SOCK" </dev/null >>"$IMG_CACHE/podman-api.log" 2>&1 &
	echo $! >"$pidfile"
	for ((i = 0; i < 100; i++)); do
		podman --url "unix://$PODMAN_SOCK" version >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	die "podman: API service not answering on $PODMAN_SOCK, see $IMG_CACHE/podman-api.log"
}

podman_api_down() {
	local pidfile=$IMG_CACHE/podman-api.pid pid
	[[ -s $pidfile ]] || return 0
	pid=$(<"$pidfile")
	rm -f "$pidfile"
	if [[ -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF "system service"; then
		log "podman: stopping the API service (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
	fi
}

# image_label IMAGE LABEL: prints the label's value, empty when the image
# or the label does not exist.
image_label() {
	"$ENGINE" image inspect --format "{{ index .Config.Labels \"$2\" }}" "$1" 2>/dev/null || true
}

image_id() { "$ENGINE" image inspect --format '{{.Id}}' "$1" 2>/dev/null; }

# up_to_date IMAGE INPUTS: the image exists and was built from INPUTS (a
# hash of everything that went into it, recorded as a label).
up_to_date() { [[ $(image_label "$1" billing.local.inputs) == "$2" ]]; }

# build ARGS...: the engine's build. Podman writes the Docker image format:
# the OCI format has no HEALTHCHECK and Podman would drop it.
build() {
	if [[ $ENGINE == podman ]]; then
		podman build --format docker "$@"
	else
		DOCKER_BUILDKIT=1 docker build "$@"
	fi
}

# ---------------------------------------------------------------- registry

# Dockerfile ARG defaults, read from the Dockerfile itself so that the
# public image names have one home.
dockerfile_arg() {
	local line
	line=$(grep -m1 -E "^ARG $1=" "$ROOT/Dockerfile") || die "Dockerfile: no ARG $1"
	line=${line#*=}
	# The only reference the defaults use.
	local go_version
	go_version=$(grep -m1 -E '^ARG GO_VERSION=' "$ROOT/Dockerfile" | cut -d= -f2)
	printf '%s\n' "${line//\$\{GO_VERSION\}/$go_version}"
}

# want_local_bases: decides (once) between the public images and the local
# substitutes, from IMAGE_BASES or, by default, from whether a registry
# answers: the runtime base (a few MB) is pulled as the probe.
want_local_bases() {
	if [[ -z ${USE_LOCAL:-} ]]; then
		case ${IMAGE_BASES:-auto} in
		local) USE_LOCAL=1 ;;
		public) USE_LOCAL=0 ;;
		auto)
			local probe
			probe=$(dockerfile_arg RUNTIME_IMAGE)
			if "$ENGINE" image inspect "$probe" >/dev/null 2>&1 ||
				timeout 300 "$ENGINE" pull -q "$probe" >/dev/null 2>&1; then
				USE_LOCAL=0
			else
				log "no registry answers (pull of $probe failed): building local substitutes of the base images"
				USE_LOCAL=1
			fi
			;;
		*) die "IMAGE_BASES must be auto, public or local, not ${IMAGE_BASES}" ;;
		esac
	fi
	((USE_LOCAL == 1))
}

# ---------------------------------------------------------------- local images

# local_debian: Debian 12 (minbase, plus ca-certificates and tzdata) from
# debootstrap, imported as LOCAL_DEBIAN. The root file system is kept as a
# tarball under .services/images, so a later import needs no download.
local_debian() {
	local tar=$IMG_CACHE/debian-bookworm.tar
	mkdir -p "$IMG_CACHE"
	# A fresh clone on a machine whose engine already has the image (CI on
	# a developer's machine) has no tarball: the image is good as it is.
	if [[ ! -s $tar ]] && [[ -n $(image_label "$LOCAL_DEBIAN" billing.local.inputs) ]]; then
		return 0
	fi
	if [[ ! -s $tar ]]; then
		command -v debootstrap >/dev/null || apt_install debootstrap
		is_root || die "debootstrap needs root"
		local rootfs=$IMG_CACHE/debian-rootfs.tmp mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
		rm -rf "$rootfs"
		log "debian: debootstrap bookworm from $mirror (log: $IMG_CACHE/debootstrap.log)"
		debootstrap --variant=minbase --include=ca-certificates,tzdata bookworm "$rootfs" "$mirror" \
			>"$IMG_CACHE/debootstrap.log" 2>&1 || {
			tail -n 20 "$IMG_CACHE/debootstrap.log" >&2
			die "debootstrap failed, see $IMG_CACHE/debootstrap.log"
		}
		debian_tune "$rootfs" "$mirror"
		tar --numeric-owner -C "$rootfs" -cf "$tar.tmp" .
		mv "$tar.tmp" "$tar"
		rm -rf "$rootfs"
	fi
	local inputs
	inputs=$(sha256sum <"$tar" | cut -c1-16)
	up_to_date "$LOCAL_DEBIAN" "$inputs" && return 0
	log "debian: importing $tar as $LOCAL_DEBIAN"
	"$ENGINE" import --change 'CMD ["bash"]' \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change "LABEL billing.local.inputs=$inputs" \
		"$tar" "$LOCAL_DEBIAN" >/dev/null
}

# debian_tune ROOTFS MIRROR: what the official debian image does for
# containers: no service starts during package installs, no documentation,
# apt lists not kept; plus the full set of bookworm suites, and the host's
# apt settings that decide whether its mirror can be used at all (for
# example Check-Valid-Until off for a snapshot mirror).
debian_tune() {
	local rootfs=$1 mirror=$2
	printf '#!/bin/sh\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
	chmod 755 "$rootfs/usr/sbin/policy-rc.d"
	cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
	cat >"$rootfs/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
APT::Install-Recommends "false";
Acquire::Languages "none";
EOF
	rm -f "$rootfs/etc/apt/sources.list"
	cat >"$rootfs/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: ${mirror%/debian}/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
	# Certificate authorities the host trusts beyond Debian's (a company or
	# sandbox proxy in front of the module proxy, say) are trusted in the
	# images too, as local certificates that survive update-ca-certificates.
	local host_bundle=/etc/ssl/certs/ca-certificates.crt
	if [[ -r $host_bundle ]]; then
		mkdir -p "$rootfs/usr/local/share/ca-certificates"
		awk -v dir="$rootfs/usr/local/share/ca-certificates" -v have="$rootfs/etc/ssl/certs/ca-certificates.crt" '
			BEGIN { while ((getline l < have) > 0) known[l] = 1 }
			/-----BEGIN CERTIFICATE-----/ { pem = ""; key = ""; inside = 1 }
			inside { pem = pem $0 "\n"; if (key == "" && $0 !~ /-----/) key = $0 }
			/-----END CERTIFICATE-----/ {
				inside = 0
				if (!(key in known)) { n++; f = dir "/host-" n ".crt"; printf "%s", pem > f; close(f) }
			}' "$host_bundle"
		if compgen -G "$rootfs/usr/local/share/ca-certificates/host-*.crt" >/dev/null; then
			chroot "$rootfs" update-ca-certificates >/dev/null 2>&1 || die "update-ca-certificates failed in $rootfs"
		fi
	fi
	if command -v apt-config >/dev/null; then
		apt-config dump | grep -E '^Acquire::(Check-Valid-Until|Check-Date|https?::Proxy) ' \
			>"$rootfs/etc/apt/apt.conf.d/90host" || rm -f "$rootfs/etc/apt/apt.conf.d/90host"
	fi
	rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb
}

# local_golang: the golang build image's substitute: the Debian base plus
# the host's Go toolchain (GOROOT), laid out like the official image.
local_golang() {
	local goroot gover inputs
	goroot=$(go env GOROOT) || die "go not found: the local golang image copies the host's Go"
	gover=$(go env GOVERSION)
	LOCAL_GOLANG=localhost/billing-local/golang:${gover#go}-bookworm
	local_debian
	inputs=$({
		echo "$gover"
		image_id "$LOCAL_DEBIAN"
		cat "$ROOT/scripts/images/golang/Containerfile"
	} | sha256sum | cut -c1-16)
	up_to_date "$LOCAL_GOLANG" "$inputs" && return 0
	log "golang: building $LOCAL_GOLANG from $goroot"
	build -q -f "$ROOT/scripts/images/golang/Containerfile" \
		--build-arg DEBIAN_IMAGE="$LOCAL_DEBIAN" --label billing.local.inputs="$inputs" \
		-t "$LOCAL_GOLANG" "$goroot" >/dev/null
}

# local_runtime: the distroless static (nonroot) substitute: no shell, no
# package manager; CA certificates, tzdata, passwd/group with nonroot.
local_runtime() {
	local dir=$ROOT/scripts/images/distroless inputs
	local_debian
	inputs=$({
		image_id "$LOCAL_DEBIAN"
		cat "$dir"/*
	} | sha256sum | cut -c1-16)
	up_to_date "$LOCAL_RUNTIME" "$inputs" && return 0
	log "distroless: building $LOCAL_RUNTIME"
	build -q -f "$dir/Containerfile" --build-arg DEBIAN_IMAGE="$LOCAL_DEBIAN" \
		--label billing.local.inputs="$inputs" -t "$LOCAL_RUNTIME" "$dir" >/dev/null
}

# kafka_jars: the broker's classpath in .services/kafka/libs, as
# scripts/services.sh resolves it (same pom, same Maven call, same cache
# check): reused when services.sh already resolved it.
kafka_jars() {
	local pom=$ROOT/scripts/kafka/pom.xml libs=$ROOT/.services/kafka/libs want have=''
	want=$(sha256sum "$pom" | cut -d' ' -f1)
	[[ -f $libs/.pom.sha256 ]] && have=$(<"$libs/.pom.sha256")
	if [[ $have == "$want" ]] && compgen -G "$libs/kafka_2.13-*.jar" >/dev/null; then
		return 0
	fi
	command -v mvn >/dev/null || apt_install maven
	local tmp=$ROOT/.services/kafka/libs.tmp
	rm -rf "$tmp"
	mkdir -p "$IMG_CACHE"
	log "kafka: resolving jars with Maven (log: $IMG_CACHE/mvn.log)"
	mvn -q -B -f "$pom" -Dmaven.repo.local="$ROOT/.services/kafka/m2" -Dstyle.color=never \
		dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$tmp" \
		>"$IMG_CACHE/mvn.log" 2>&1 || {
		tail -n 30 "$IMG_CACHE/mvn.log" >&2
		die "kafka: mvn dependency:copy-dependencies failed, see $IMG_CACHE/mvn.log"
	}
	echo "$want" >"$tmp/.pom.sha256"
	rm -rf "$libs"
	mv "$tmp" "$libs"
}

# local_kafka: Apache Kafka from the Maven jars plus Debian's JRE, configured
# through KAFKA_* variables like the apache/kafka image.
local_kafka() {
	local dir=$ROOT/scripts/images/kafka version ctx inputs
	version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$ROOT/scripts/kafka/pom.xml")
	[[ -n $version ]] || die "scripts/kafka/pom.xml names no kafka.version"
	LOCAL_KAFKA=localhost/billing-local/kafka:$version
	kafka_jars
	local_debian
	inputs=$({
		image_id "$LOCAL_DEBIAN"
		cat "$ROOT/.services/kafka/libs/.pom.sha256"
		find "$dir" -type f | sort | xargs cat
		cat "$ROOT/scripts/kafka/format-storage"
	} | sha256sum | cut -c1-16)
	up_to_date "$LOCAL_KAFKA" "$inputs" && return 0
	# The build context: these files, the storage format step shared with
	# scripts/services.sh, and the jars (hard links, no copy).
	ctx=$IMG_CACHE/kafka-context
	rm -rf "$ctx"
	mkdir -p "$ctx"
	cp -a "$dir"/. "$ctx"/
	cp -a "$ROOT/scripts/kafka/format-storage" "$ctx/bin/"
	cp -al "$ROOT/.services/kafka/libs" "$ctx/libs" 2>/dev/null || cp -a "$ROOT/.services/kafka/libs" "$ctx/libs"
	log "kafka: building $LOCAL_KAFKA (log: $IMG_CACHE/kafka-build.log)"
	build -f "$ctx/Containerfile" --build-arg DEBIAN_IMAGE="$LOCAL_DEBIAN" \
		--label billing.local.inputs="$inputs" -t "$LOCAL_KAFKA" "$ctx" >"$IMG_CACHE/kafka-build.log" 2>&1 || {
		tail -n 30 "$IMG_CACHE/kafka-build.log" >&2
		die "kafka: image build failed, see $IMG_CACHE/kafka-build.log"
	}
	rm -rf "$ctx"
}

# local_mariadb: MariaDB from Debian's packages, with an entrypoint that
# honours the mysql image's variables and /docker-entrypoint-initdb.d.
local_mariadb() {
	local dir=$ROOT/scripts/images/mariadb inputs
	local_debian
	inputs=$({
		image_id "$LOCAL_DEBIAN"
		find "$dir" -type f | sort | xargs cat
	} | sha256sum | cut -c1-16)
	up_to_date "$LOCAL_MARIADB" "$inputs" && return 0
	log "mariadb: building $LOCAL_MARIADB (log: $IMG_CACHE/mariadb-build.log)"
	build -f "$dir/Containerfile" --build-arg DEBIAN_IMAGE="$LOCAL_DEBIAN" \
		--label billing.local.inputs="$inputs" -t "$LOCAL_MARIADB" "$dir" >"$IMG_CACHE/mariadb-build.log" 2>&1 || {
		tail -n 30 "$IMG_CACHE/mariadb-build.log" >&2
		die "mariadb: image build failed, see $IMG_CACHE/mariadb-build.log"
	}
}
