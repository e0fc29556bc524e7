package harness

import (
	"testing"

	"github.com/go-sql-driver/mysql"
)

// TestDatabaseDSN needs no server: it checks the DSN that NewDatabase hands
// out keeps the admin credentials and address and carries the settings
// tests rely on.
func TestDatabaseDSN(t *testing.T) {
	for _, admin := range []string{
		"root:root@tcp(127.0.0.1:3306)/",
		"root:root@tcp(127.0.0.1:3306)/?multiStatements=true&interpolateParams=true&timeout=5s",
	} {
		dsn, err := databaseDSN(admin, "t_0123456789abcdef")
		if err != nil {
			t.Fatalf("databaseDSN(%q): %v", admin, err)
		}
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatalf("result %q does not parse: %v", dsn, err)
		}
		if cfg.DBName != "t_0123456789abcdef" || cfg.User != "root" || cfg.Passwd != "root" ||
			cfg.Net != "tcp" || cfg.Addr != "127.0.0.1:3306" {
			t.Errorf("databaseDSN(%q) = %q: wrong database, credentials or address", admin, dsn)
		}
		if !cfg.ParseTime || cfg.MultiStatements || cfg.InterpolateParams {
			t.Errorf("databaseDSN(%q) = %q: want parseTime on, multiStatements and interpolateParams off", admin, dsn)
		}
	}
}
