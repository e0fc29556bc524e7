package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// OwnMariaDB starts a MariaDB server of the test's own, from the binaries
// scripts/services.sh uses (mariadbd and mariadb-install-db of Debian's
// mariadb-server), for tests that need a server set up differently from
// the shared ones: another system time zone (env "TZ=Asia/Tokyo"), say.
// The shared servers are never restarted or reconfigured for a test.
//
// The server has its own data directory under t.TempDir(), its own port
// on 127.0.0.1 and its own socket, root without a password, no binary
// log; it is stopped (SIGTERM, then SIGKILL) when the test ends. It
// returns an admin DSN without a database. Skipped like the other
// services when the binaries are missing (failed with CI=true).
func OwnMariaDB(t testing.TB, env ...string) string {
	t.Helper()
	requireIntegration(t)
	for _, bin := range []string{"mariadbd", "mariadb-install-db"} {
		if _, err := exec.LookPath(bin); err != nil {
			check(t, "MariaDB's binaries (package mariadb-server)", fmt.Errorf("%w: %s not found", errAbsent, bin))
		}
	}
	dir := t.TempDir()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "mariadb.sock")
	if len(sock) > 100 { // sun_path holds 108 bytes
		sock = filepath.Join(os.TempDir(), RandomName("billing-own-")+".sock")
		t.Cleanup(func() { _ = os.Remove(sock) })
	}
	cnf := filepath.Join(dir, "my.cnf")
	data := filepath.Join(dir, "data")
	// Its own tmpdir: a server deletes every #sql* file in its tmpdir when
	// it starts, which in a shared /tmp are the shared servers' temporary
	// tables in use (scripts/services.sh).
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`[mariadbd]
user = root
datadir = %[1]s
socket = %[2]s
pid-file = %[3]s
log-error = %[4]s
tmpdir = %[7]s
bind-address = 127.0.0.1
port = %[5]d
skip-name-resolve
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
innodb_flush_log_at_trx_commit = 1
transaction-isolation = REPEATABLE-READ
innodb_buffer_pool_size = 32M
max_connections = 100
sql_mode = %[6]s

[mariadb-install-db]
auth-root-authentication-method = normal
skip-test-db
`, data, sock, filepath.Join(dir, "mariadbd.pid"), filepath.Join(dir, "error.log"), port, mysql84SQLMode, tmp)
	if err := os.WriteFile(cnf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	install := exec.CommandContext(ctx, "mariadb-install-db", "--defaults-file="+cnf, "--datadir="+data)
	install.Env = append(os.Environ(), env...)
	if out, err := install.CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	srv := exec.Command("mariadbd", "--defaults-file="+cnf)
	srv.Env = append(os.Environ(), env...)
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := srv.Start(); err != nil {
		t.Fatalf("start mariadbd: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			_ = srv.Process.Kill()
			<-exited
		}
	})
	dsn := "root@tcp(127.0.0.1:" + strconv.Itoa(port) + ")/?parseTime=true&loc=UTC"
	for {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("mariadbd exited at start: %v\n%s", err, log)
		case <-ctx.Done():
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Fatalf("mariadbd did not answer within 2 minutes\n%s", log)
		case <-time.After(100 * time.Millisecond):
		}
		if err := pingOnce(dsn); err == nil {
			return dsn
		}
	}
}

func pingOnce(dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return db.PingContext(ctx)
}

// freePort is a TCP port on 127.0.0.1 that nothing listened on a moment
// ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	addr, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return addr.Port, nil
}
