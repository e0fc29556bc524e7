package service

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"

	"github.com/pressly/goose/v3"

	"github.com/billing/ledger/internal/config"
	"github.com/billing/ledger/internal/mysqlconn"
	"github.com/billing/ledger/internal/txsink/mysqldriver"
	"github.com/billing/ledger/migrations"
)

// Migrate applies the schema to every server, under goose's lock (billing
// migrate). It needs an account allowed to run DDL (see
// docs/operations.md).
func Migrate(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	dsns, err := ResolveDSNs(cfg, log)
	if err != nil {
		return err
	}
	log.Info("migrating", "mysql", mysqlconn.RedactAll(dsns))
	for i, dsn := range dsns {
		if err := migrateServer(ctx, cfg, dsn, log.With("server", i), true); err != nil {
			return fmt.Errorf("server %d: %w", i, err)
		}
	}
	return nil
}

// migrateServer applies pending migrations to one server. Unless always is
// set, it first checks without any lock or DDL whether something is
// pending, so that a service account without DDL grants runs against a
// schema migrated beforehand by `billing migrate`.
//
// Once begun it runs to its end even when a shutdown is asked for (ctx is
// not passed on): DDL commits statement by statement, and a migration file
// cut in the middle costs the next run a replay of it (package
// migrations), while goose's version table created without its first
// row is refused at every later start ("missing zero version migration")
// and only hand-written SQL repairs it. A second signal still exits at
// once (cmd/billing).
func migrateServer(ctx context.Context, cfg config.Config, dsn string, log *slog.Logger, always bool) error {
	ctx = context.WithoutCancel(ctx)
	db, err := mysqldriver.OpenDB(dsn, cfg.MySQLLockWaitTimeout, 2)
	if err != nil {
		return err
	}
	defer db.Close()
	if !always {
		pending, err := hasPending(ctx, db.DB)
		if err != nil {
			if mysqldriver.DeniedCreate(err) {
				return fmt.Errorf("checking the schema version: %w (the schema is missing and this account may not create it: run `billing migrate` with an account allowed to CREATE and ALTER, see docs/operations.md)", err)
			}
			return fmt.Errorf("checking the schema version: %w", mysqldriver.AccessDenied(dsn, err))
		}
		if !pending {
			log.Debug("schema up to date")
			return nil
		}
	}
	if err := migrations.Up(ctx, db.DB, log, mysqldriver.SchemaExists); err != nil {
		if mysqldriver.Denied(err) && mysqldriver.DeniedNumber(err) != mysqldriver.ErDBAccessDenied {
			return fmt.Errorf("%w (applying migrations needs CREATE, ALTER, INDEX, DROP and REFERENCES on the database: run `billing migrate` with such an account first, see docs/operations.md)", err)
		}
		return mysqldriver.AccessDenied(dsn, err)
	}
	return nil
}

// hasPending reports whether migrations remain to be applied; it takes no
// lock and runs no DDL once goose's version table exists.
func hasPending(ctx context.Context, db *sql.DB) (bool, error) {
	p, err := goose.NewProvider(goose.DialectMySQL, db, migrations.FS, goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return false, err
	}
	return p.HasPending(ctx)
}
