package migrations

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"regexp"
	"strings"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"
)

// A migration's DDL commits statement by statement (MySQL and MariaDB have
// no transactional DDL), and goose records the version only after the
// last one: a process killed between two statements (kill -9, a pod's
// deadline) leaves a migration cut in the middle, which goose runs again
// from its first statement at the next start, and which fails there for
// good ("Duplicate column name"). So a migration that fails because what
// a statement creates already exists is replayed: statement by
// statement, each that meets its own result taken as done, under goose's
// lock, and then recorded (the caller says which errors are of a result
// that exists: mysqldriver.SchemaExists). Every statement of these migrations is a
// CREATE, an ALTER, a DROP or an insert of a singleton row, each atomic on
// its own, so a replay ends in the schema a whole run gives. (The one
// insert of many rows, 00002's journal of the keys before generations,
// lists each key again when replayed: the journal only says when the
// latest of them expires, which a repeat does not change.)

// upCut is a goose error of a migration cut in the middle by an earlier
// run (done says of the failed statement's error that its result exists):
// its version (0: err is not one).
func upCut(err error, done func(error) bool) int64 {
	var pe *goose.PartialError
	if done != nil && errors.As(err, &pe) && pe.Failed != nil && done(pe.Err) {
		return pe.Failed.Source.Version
	}
	return 0
}

// replay runs migration version's statements one by one, skipping those
// whose result exists, and records it, under locker; a migration another
// process recorded meanwhile is left alone.
func replay(ctx context.Context, db *sql.DB, locker lock.Locker, version int64, done func(error) bool, logger *slog.Logger) error {
	if err := locker.Lock(ctx, db); err != nil {
		return err
	}
	defer func() { _ = locker.Unlock(context.WithoutCancel(ctx), db) }()
	store, err := database.NewStore(database.DialectMySQL, goose.DefaultTablename)
	if err != nil {
		return err
	}
	if m, err := store.GetMigration(ctx, db, version); err == nil && m.IsApplied {
		return nil
	} else if err != nil && !errors.Is(err, database.ErrVersionNotFound) {
		return err
	}
	name, text, err := File(version)
	if err != nil {
		return err
	}
	stmts := UpStatements(text)
	for i, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			if !done(err) {
				return fmt.Errorf("migrations: replaying %s, statement %d: %w", name, i+1, err)
			}
			logger.Info("migration statement already applied", "source", name, "statement", i+1, "of", len(stmts), "err", err)
		}
	}
	return store.Insert(ctx, db, database.InsertRequest{Version: version})
}

// File is the migration of version: its name and text.
func File(version int64) (string, string, error) {
	names, err := fs.Glob(FS, fmt.Sprintf("%05d_*.sql", version))
	if err != nil || len(names) != 1 {
		return "", "", fmt.Errorf("migrations: no one file of version %d", version)
	}
	b, err := FS.ReadFile(names[0])
	return names[0], string(b), err
}

var statementEnd = regexp.MustCompile(`;[ \t]*$`)

// UpStatements are the statements of a migration's Up section: its lines
// without comments, cut at a semicolon that ends a line (as these files
// are written: no statement blocks, no semicolon ends a line inside a
// string).
func UpStatements(text string) []string {
	var out []string
	var cur strings.Builder
	up := false
	for _, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "-- +goose Up"):
			up = true
			continue
		case strings.HasPrefix(trimmed, "-- +goose Down"):
			up = false
			continue
		case !up || trimmed == "" || strings.HasPrefix(trimmed, "--"):
			continue
		}
		cur.WriteString(line)
		cur.WriteString("\n")
		if statementEnd.MatchString(line) {
			out = append(out, strings.TrimSuffix(strings.TrimSpace(cur.String()), ";"))
			cur.Reset()
		}
	}
	if s := strings.TrimSpace(cur.String()); s != "" {
		out = append(out, s)
	}
	return out
}
