package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the goose SQL migrations, numbered in the order they apply.
//
//go:embed *.sql
var FS embed.FS

// Up applies every pending migration to db under goose's MySQL table lock,
// so that instances starting together apply each migration once.
//
// A migration an earlier run left cut in the middle (a kill) is replayed
// when done says of its failure that a statement's result exists
// (mysqldriver.SchemaExists; nil: never, and the run fails): repair.go.
func Up(ctx context.Context, db *sql.DB, logger *slog.Logger, done func(error) bool) error {
	locker, err := lock.NewMySQLTableLocker(lock.WithTableLogger(logger))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	sub, err := fs.Sub(FS, ".")
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectMySQL, db, sub, goose.WithLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	results, err := p.Up(ctx)
	// A migration cut in the middle by a kill is replayed (repair.go),
	// at most once each, then the rest applied.
	replayed := map[int64]bool{}
	for v := upCut(err, done); v > 0 && !replayed[v]; v = upCut(err, done) {
		replayed[v] = true
		var pe *goose.PartialError
		if errors.As(err, &pe) {
			results = append(results, pe.Applied...)
		}
		logger.Warn("a migration was cut in the middle by an earlier run (a kill while migrating): replaying it statement by statement, keeping what exists", "version", v)
		if err := replay(ctx, db, locker, v, done, logger); err != nil {
			return err
		}
		var more []*goose.MigrationResult
		more, err = p.Up(ctx)
		results = append(results, more...)
	}
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	for _, r := range results {
		logger.Info("migration applied", "source", r.Source.Path, "duration", r.Duration)
	}
	return nil
}
