package migrations

import (
	"context"
	"database/sql"
	"embed"
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
func Up(ctx context.Context, db *sql.DB, logger *slog.Logger) error {
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
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	for _, r := range results {
		logger.Info("migration applied", "source", r.Source.Path, "duration", r.Duration)
	}
	return nil
}
