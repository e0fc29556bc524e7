package migrations_test

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/pressly/goose/v3"

	"github.com/billing/ledger/internal/testenv"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

func TestMain(m *testing.M) { os.Exit(testenv.Main(m)) }

// A migration cut after any of its statements (a kill while migrating:
// DDL commits statement by statement) is replayed at the next run, and the
// schema ends as a run never cut leaves it; without the replay, the next
// run fails for good ("Duplicate column name").
func TestMigrationCutAfterAnyStatementIsReplayed(t *testing.T) {
	ctx := context.Background()
	want := schemaOf(t, migrated(t, nil))
	names, err := fs.Glob(migrations.FS, "*.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		var version int64
		if _, err := fmt.Sscanf(name, "%05d_", &version); err != nil {
			t.Fatal(err)
		}
		_, text, err := migrations.File(version)
		if err != nil {
			t.Fatal(err)
		}
		stmts := migrations.UpStatements(text)
		for k := 1; k < len(stmts); k++ {
			t.Run(fmt.Sprintf("%s/after_%d_of_%d", name, k, len(stmts)), func(t *testing.T) {
				db := migrated(t, func(db *sql.DB) {
					p, err := goose.NewProvider(goose.DialectMySQL, db, migrations.FS, goose.WithDisableGlobalRegistry(true))
					if err != nil {
						t.Fatal(err)
					}
					if version > 1 {
						if _, err := p.UpTo(ctx, version-1); err != nil {
							t.Fatal(err)
						}
					}
					for _, s := range stmts[:k] {
						if _, err := db.ExecContext(ctx, s); err != nil {
							t.Fatalf("statement %q: %v", s, err)
						}
					}
				})
				if got := schemaOf(t, db); got != want {
					t.Fatalf("schema after the replay differs:\n%s", diffLines(want, got))
				}
			})
		}
	}
}

// The statements upStatements cuts a file into, run in order, build the
// schema goose builds.
func TestUpStatementsAreTheMigrations(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("mysql", testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	names, _ := fs.Glob(migrations.FS, "*.sql")
	for _, name := range names {
		b, _ := migrations.FS.ReadFile(name)
		for _, s := range migrations.UpStatements(string(b)) {
			if _, err := db.ExecContext(ctx, s); err != nil {
				t.Fatalf("%s: %q: %v", name, s, err)
			}
		}
	}
	if got, want := tablesOf(t, db), tablesOf(t, migrated(t, nil)); got != want {
		t.Fatalf("schema of the statements differs from goose's:\n%s", diffLines(want, got))
	}
}

// migrated is a new database, prepared by before (nil: nothing), then
// migrated by Up.
func migrated(t *testing.T, before func(*sql.DB)) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", testenv.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if before != nil {
		before(db)
	}
	if err := migrations.Up(context.Background(), db, slog.New(slog.DiscardHandler), mysqldriver.SchemaExists); err != nil {
		t.Fatalf("Up: %v", err)
	}
	return db
}

// schemaOf is the database's tables, columns and keys, and the rows goose
// recorded, as text.
func schemaOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	return tablesOf(t, db) + rowsOf(t, db, `SELECT CAST(version_id AS CHAR), CAST(is_applied AS CHAR) FROM goose_db_version ORDER BY version_id`)
}

// tablesOf is the database's tables, columns and keys as text.
func tablesOf(t *testing.T, db *sql.DB) string {
	t.Helper()
	return rowsOf(t, db,
		`SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COALESCE(COLUMN_DEFAULT, 'NULL'), COLUMN_COMMENT, COALESCE(COLLATION_NAME, '') FROM information_schema.COLUMNS
			WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME NOT LIKE 'goose\\_%' ORDER BY TABLE_NAME, ORDINAL_POSITION`,
		`SELECT TABLE_NAME, INDEX_NAME, NON_UNIQUE, SEQ_IN_INDEX, COLUMN_NAME FROM information_schema.STATISTICS
			WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME NOT LIKE 'goose\\_%' ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX`)
}

// rowsOf is the rows of the queries, a line each.
func rowsOf(t *testing.T, db *sql.DB, queries ...string) string {
	t.Helper()
	var b strings.Builder
	for _, q := range queries {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]sql.RawBytes, len(cols))
			dest := make([]any, len(cols))
			for i := range vals {
				dest[i] = &vals[i]
			}
			if err := rows.Scan(dest...); err != nil {
				t.Fatal(err)
			}
			parts := make([]string, len(vals))
			for i, v := range vals {
				parts[i] = string(v)
			}
			b.WriteString(strings.Join(parts, " | ") + "\n")
		}
		rows.Close()
	}
	return b.String()
}

func diffLines(want, got string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	var out []string
	for l := range w {
		if !g[l] {
			out = append(out, "- "+l)
		}
	}
	for l := range g {
		if !w[l] {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
