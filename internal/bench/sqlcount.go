package bench

import (
	"bytes"
	"context"
	"maps"
	"net"
	"strings"
	"sync"

	"github.com/go-sql-driver/mysql"
)

// countingNet is the network name under which the child processes dial
// MySQL: a plain TCP connection that counts the commands the client sends.
// A DSN such as user:pass@benchtcp(127.0.0.1:3306)/db routes a pool through
// it, without any change to the code that opens the pool.
const countingNet = "benchtcp"

// sqlCounter counts client commands, each of which is one round trip: the
// MySQL protocol has no pipelining, and with interpolateParams (which the
// service and the naive job both use) a statement with arguments is a single
// COM_QUERY.
type sqlCounter struct {
	mu     sync.Mutex
	byKind map[string]int64
	total  int64
}

func (c *sqlCounter) add(kind string) {
	c.mu.Lock()
	c.byKind[kind]++
	c.total++
	c.mu.Unlock()
}

// snapshot returns the totals so far.
func (c *sqlCounter) snapshot() (int64, map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.total, maps.Clone(c.byKind)
}

// registerCountingNet makes countingNet dialable by go-sql-driver/mysql in
// this process (the driver's registry is the process's: a child process
// registers it once) and returns the counter of its connections' commands.
func registerCountingNet() *sqlCounter {
	rt := &sqlCounter{byKind: map[string]int64{}}
	mysql.RegisterDialContext(countingNet, func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return &countingConn{Conn: c, rt: rt}, nil
	})
	return rt
}

type countingConn struct {
	net.Conn
	rt *sqlCounter
}

// Write sees every packet the driver sends, whole: go-sql-driver/mysql
// writes one packet (4-byte header: 3 bytes length, 1 byte sequence id)
// per call. A packet with sequence id 0 starts a new command.
func (c *countingConn) Write(b []byte) (int, error) {
	if len(b) >= 5 && b[3] == 0 {
		if kind := classify(b[4], b[5:]); kind != "" {
			c.rt.add(kind)
		}
	}
	return c.Conn.Write(b)
}

// classify names a command: the statement and table for COM_QUERY, the
// command otherwise; "" for commands without a reply (no round trip).
func classify(cmd byte, payload []byte) string {
	switch cmd {
	case 0x03: // COM_QUERY
		return classifyQuery(payload)
	case 0x01, 0x19: // COM_QUIT, COM_STMT_CLOSE: no reply
		return ""
	case 0x0e:
		return "PING"
	case 0x16:
		return "STMT_PREPARE"
	case 0x17:
		return "STMT_EXECUTE"
	case 0x1f:
		return "RESET_CONNECTION"
	case 0x02:
		return "INIT_DB"
	}
	return "COMMAND"
}

func classifyQuery(q []byte) string {
	if len(q) > 300 {
		q = q[:300]
	}
	s := strings.Fields(strings.ToUpper(string(bytes.TrimSpace(q))))
	if len(s) == 0 {
		return "QUERY"
	}
	word := func(i int) string {
		if i < len(s) {
			return strings.Trim(s[i], "`(,")
		}
		return ""
	}
	switch s[0] {
	case "XA":
		return "XA " + word(1)
	case "INSERT", "REPLACE":
		for i, w := range s {
			if w == "INTO" {
				return s[0] + " " + strings.ToLower(word(i+1))
			}
		}
		return s[0]
	case "DELETE":
		for i, w := range s {
			if w == "FROM" {
				return "DELETE " + strings.ToLower(word(i+1))
			}
		}
		return "DELETE"
	case "UPDATE":
		return "UPDATE " + strings.ToLower(word(1))
	case "SELECT":
		for i, w := range s {
			if w == "FROM" {
				return "SELECT " + strings.ToLower(word(i+1))
			}
		}
		return "SELECT"
	case "START":
		return "START TRANSACTION"
	}
	return s[0]
}
