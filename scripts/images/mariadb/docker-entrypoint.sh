#!/bin/bash
# Entrypoint of the local MariaDB image (see its Containerfile). On an empty
# data directory it initialises the server the way the mysql image does:
# a temporary server without networking, root's password, root@MYSQL_ROOT_HOST,
# MYSQL_DATABASE, MYSQL_USER with all privileges on it, then every file of
# /docker-entrypoint-initdb.d in name order (*.sh sourced or run when
# executable, *.sql, *.sql.gz, *.sql.xz, *.sql.zst fed to the client as
# root). Then, or on a data directory that exists, it runs the server.
set -euo pipefail
shopt -s nullglob

note() { printf '%s [Note] [Entrypoint]: %s\n' "$(date --rfc-3339=seconds)" "$*"; }
die() {
	printf '%s [ERROR] [Entrypoint]: %s\n' "$(date --rfc-3339=seconds)" "$*" >&2
	exit 1
}

# file_env VAR: VAR_FILE names a file holding VAR's value (Docker secrets).
file_env() {
	local var=$1 file_var=${1}_FILE
	if [[ -n ${!var:-} && -n ${!file_var:-} ]]; then
		die "both $var and $file_var are set; use one"
	fi
	if [[ -n ${!file_var:-} ]]; then
		export "$var"="$(<"${!file_var}")"
	fi
}

# sql_string S: S as a single-quoted SQL literal.
sql_string() {
	local s=${1//\\/\\\\}
	printf "'%s'" "${s//\'/\\\'}"
}

# sql_ident S: S as a back-quoted identifier.
# shellcheck disable=SC2016 # the back quotes are SQL, not a command
sql_ident() { printf '`%s`' "${1//\`/\`\`}"; }

# A leading option means "run the server with these options".
if [[ ${1:0:1} == - ]]; then
	set -- mariadbd "$@"
fi
if [[ $1 != mariadbd && $1 != mysqld ]]; then
	exec "$@"
fi
shift
server=(mariadbd "$@")

# The data directory and socket after every option file and argument.
conf=$("${server[@]}" --verbose --help 2>/dev/null) || die "mariadbd rejects its options: $("${server[@]}" --verbose --help 2>&1 >/dev/null | head -n 5)"
# Only the table of variables after the dashed line: words of the option
# descriptions above it can start a line too.
setting() { awk -v name="$1" '/^-{10,}/ { vars = 1; next } vars && $1 == name { print $2; exit }' <<<"$conf"; }
DATADIR=$(setting datadir)
SOCKET=$(setting socket)
DATADIR=${DATADIR%/}
[[ $DATADIR == /?* && $SOCKET == /?* ]] || die "cannot tell the data directory ($DATADIR) and socket ($SOCKET) from mariadbd --verbose --help"

if [[ $(id -u) == 0 ]]; then
	mkdir -p "$DATADIR" "$(dirname "$SOCKET")"
	chown -R mysql:mysql "$DATADIR" "$(dirname "$SOCKET")"
	server+=(--user=mysql)
fi

if [[ ! -d $DATADIR/mysql ]]; then
	file_env MYSQL_ROOT_PASSWORD
	file_env MYSQL_PASSWORD
	if [[ -z ${MYSQL_ROOT_PASSWORD:-} && -z ${MYSQL_ALLOW_EMPTY_PASSWORD:-} && -z ${MYSQL_RANDOM_ROOT_PASSWORD:-} ]]; then
		die "the database is uninitialized and no password option is set: set one of MYSQL_ROOT_PASSWORD, MYSQL_ALLOW_EMPTY_PASSWORD and MYSQL_RANDOM_ROOT_PASSWORD"
	fi
	if [[ -n ${MYSQL_RANDOM_ROOT_PASSWORD:-} ]]; then
		MYSQL_ROOT_PASSWORD=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
		note "GENERATED ROOT PASSWORD: $MYSQL_ROOT_PASSWORD"
	fi
	MYSQL_ROOT_PASSWORD=${MYSQL_ROOT_PASSWORD:-}

	note "Initializing database files in $DATADIR"
	install=(mariadb-install-db --datadir="$DATADIR" --skip-test-db --auth-root-authentication-method=normal)
	[[ $(id -u) == 0 ]] && install+=(--user=mysql)
	"${install[@]}" >/dev/null || die "mariadb-install-db failed"

	note "Starting a temporary server without networking"
	"${server[@]}" --skip-networking --socket="$SOCKET" &
	pid=$!
	client=(mariadb --protocol=socket --socket="$SOCKET" -uroot)
	for ((i = 0; i < 120; i++)); do
		"${client[@]}" -e 'SELECT 1' >/dev/null 2>&1 && break
		kill -0 "$pid" 2>/dev/null || die "the temporary server exited during start"
		sleep 0.5
	done
	((i < 120)) || die "the temporary server did not answer within 60s"

	if [[ -z ${MYSQL_INITDB_SKIP_TZINFO:-} ]]; then
		mariadb-tzinfo-to-sql /usr/share/zoneinfo 2>/dev/null | "${client[@]}" mysql || die "loading time zones failed"
	fi

	root_host=${MYSQL_ROOT_HOST:-%}
	pw=$(sql_string "$MYSQL_ROOT_PASSWORD")
	{
		# Account setup stays out of the binary log (a replica has its own).
		echo "SET @@SESSION.SQL_LOG_BIN = 0;"
		echo "DELETE FROM mysql.user WHERE user = '';"
		# mariadb-install-db also made root@<container host name>, which
		# skip-name-resolve can never match.
		echo "EXECUTE IMMEDIATE CONCAT('DROP USER IF EXISTS root@''', @@hostname, '''');"
		echo "ALTER USER 'root'@'localhost' IDENTIFIED BY $pw;"
		if [[ $root_host != localhost ]]; then
			echo "CREATE USER 'root'@$(sql_string "$root_host") IDENTIFIED BY $pw;"
			echo "GRANT ALL ON *.* TO 'root'@$(sql_string "$root_host") WITH GRANT OPTION;"
		fi
		if [[ -n ${MYSQL_DATABASE:-} ]]; then
			echo "CREATE DATABASE IF NOT EXISTS $(sql_ident "$MYSQL_DATABASE");"
		fi
		if [[ -n ${MYSQL_USER:-} ]]; then
			[[ $MYSQL_USER == root ]] && die "MYSQL_USER=root: set MYSQL_ROOT_PASSWORD for root instead"
			[[ -n ${MYSQL_PASSWORD:-} ]] || die "MYSQL_USER is set but MYSQL_PASSWORD is not"
			echo "CREATE USER $(sql_string "$MYSQL_USER")@'%' IDENTIFIED BY $(sql_string "$MYSQL_PASSWORD");"
			if [[ -n ${MYSQL_DATABASE:-} ]]; then
				echo "GRANT ALL ON $(sql_ident "$MYSQL_DATABASE").* TO $(sql_string "$MYSQL_USER")@'%';"
			fi
		fi
		echo "FLUSH PRIVILEGES;"
	} | "${client[@]}" || die "account setup failed"

	# From here on root has its password.
	export MYSQL_PWD=$MYSQL_ROOT_PASSWORD
	run_sql=("${client[@]}")
	[[ -n ${MYSQL_DATABASE:-} ]] && run_sql+=("--database=$MYSQL_DATABASE")
	for f in /docker-entrypoint-initdb.d/*; do
		case $f in
		*.sh)
			if [[ -x $f ]]; then
				note "$0: running $f"
				"$f"
			else
				note "$0: sourcing $f"
				# shellcheck disable=SC1090
				. "$f"
			fi
			;;
		*.sql) note "$0: running $f" && "${run_sql[@]}" <"$f" ;;
		*.sql.gz) note "$0: running $f" && gunzip -c "$f" | "${run_sql[@]}" ;;
		*.sql.xz) note "$0: running $f" && xzcat "$f" | "${run_sql[@]}" ;;
		*.sql.zst) note "$0: running $f" && zstd -dc "$f" | "${run_sql[@]}" ;;
		*) note "$0: ignoring $f" ;;
		esac
	done

	note "Stopping the temporary server"
	mariadb-admin --protocol=socket --socket="$SOCKET" -uroot shutdown || die "shutting the temporary server down failed"
	wait "$pid" || true
	unset MYSQL_PWD
	note "MariaDB init process done. Ready for start up."
fi

exec "${server[@]}"
