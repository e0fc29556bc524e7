package integration_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// servicesCtl restarts, stops and kills the Kafka broker and MariaDB that
// scripts/services.sh manages. The chaos suite only ever touches services
// it has proven to be that script's: the ports the tests connect to must be
// the ports the script's generated configuration names, and `status` must
// report both running.
type servicesCtl struct {
	script string   // path to services.sh
	root   string   // the checkout the script belongs to (its .services/)
	env    []string // KAFKA_PORT, KAFKA_CONTROLLER_PORT, MYSQL_PORT for the script
	kafka  string   // 127.0.0.1:port the tests use
	mysql  string
}

// newServicesCtl checks that brokers and the admin DSN point at the
// services of script (CHAOS_SERVICES_SCRIPT, default ../scripts/services.sh
// from the package directory) and returns a controller for them.
func newServicesCtl(ctx context.Context, brokers []string, adminDSN string) (*servicesCtl, error) {
	script := os.Getenv("CHAOS_SERVICES_SCRIPT")
	if script == "" {
		script = filepath.Join("..", "scripts", "services.sh")
	}
	script, err := filepath.Abs(script)
	if err != nil {
		return nil, fmt.Errorf("services script: %w", err)
	}
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("services script: %w (set CHAOS_SERVICES_SCRIPT)", err)
	}
	s := &servicesCtl{script: script, root: filepath.Dir(filepath.Dir(script))}

	if len(brokers) != 1 {
		return nil, fmt.Errorf("chaos needs the single local broker of services.sh, got brokers %v", brokers)
	}
	kport, err := loopbackPort(brokers[0])
	if err != nil {
		return nil, fmt.Errorf("KAFKA_BROKERS: %w", err)
	}
	cfg, err := mysql.ParseDSN(adminDSN)
	if err != nil {
		return nil, fmt.Errorf("MYSQL_DSN: %w", err)
	}
	if cfg.Net != "tcp" {
		return nil, fmt.Errorf("MYSQL_DSN: chaos needs TCP to the local MariaDB, got %s", cfg.Net)
	}
	mport, err := loopbackPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("MYSQL_DSN: %w", err)
	}
	s.kafka, s.mysql = "127.0.0.1:"+kport, "127.0.0.1:"+mport

	// The controller port is not visible to clients: take it from the
	// configuration the script generated, which also proves the broker on
	// kport is this checkout's.
	props := filepath.Join(s.root, ".services", "kafka", "config", "server.properties")
	cport, err := controllerPort(props, kport)
	if err != nil {
		return nil, err
	}
	s.env = []string{"KAFKA_PORT=" + kport, "KAFKA_CONTROLLER_PORT=" + cport, "MYSQL_PORT=" + mport}

	out, err := s.run(ctx, time.Minute, "status")
	if err != nil {
		return nil, fmt.Errorf("%s status: %w\n%s(chaos restarts the services of scripts/services.sh only; start them with `make services`)", script, err, out)
	}
	for _, want := range []string{"kafka    running", "mariadb  running"} {
		if !strings.Contains(out, want) {
			return nil, fmt.Errorf("%s status does not report %q:\n%s", script, want, out)
		}
	}
	return s, nil
}

// loopbackPort returns the port of addr, which must be on the loopback
// interface: the suite restarts local services only.
func loopbackPort(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	if host != "127.0.0.1" && host != "localhost" {
		return "", fmt.Errorf("%s is not on 127.0.0.1: chaos only restarts local services", addr)
	}
	return port, nil
}

// controllerPort reads the KRaft controller port from the broker's
// generated server.properties, after checking that its client listener is
// on kport.
func controllerPort(props, kport string) (string, error) {
	f, err := os.Open(props)
	if err != nil {
		return "", fmt.Errorf("broker configuration of services.sh: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "listeners=")
		if !ok {
			continue
		}
		var plain, ctrl string
		for _, l := range strings.Split(rest, ",") {
			if p, ok := strings.CutPrefix(l, "PLAINTEXT://127.0.0.1:"); ok {
				plain = p
			}
			if p, ok := strings.CutPrefix(l, "CONTROLLER://127.0.0.1:"); ok {
				ctrl = p
			}
		}
		if plain != kport || ctrl == "" {
			return "", fmt.Errorf("%s: listeners=%s, but the tests use port %s: not this checkout's broker", props, rest, kport)
		}
		return ctrl, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("%s: %w", props, err)
	}
	return "", fmt.Errorf("%s: no listeners line", props)
}

// run runs the script with args, bounded by timeout, and returns its
// combined output.
func (s *servicesCtl) run(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", append([]string{s.script}, args...)...)
	cmd.Env = append(os.Environ(), s.env...)
	cmd.Dir = s.root
	// The script starts servers with setsid, so killing the script on
	// timeout leaves a half-started server to the next start, which
	// reuses or replaces it.
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		err = errors.Join(err, fmt.Errorf("services.sh %s: %w", strings.Join(args, " "), ctx.Err()))
	}
	return string(out), err
}

// serviceLogs are the server logs worth showing when a run fails.
func (s *servicesCtl) serviceLogs() map[string]string {
	return map[string]string{
		"kafka":   filepath.Join(s.root, ".services", "kafka", "logs", "server.log"),
		"mariadb": filepath.Join(s.root, ".services", "mariadb", "logs", "error.log"),
	}
}
