// Package ledgerstatus says where a ledger stands, without changing
// anything: the positions stored per partition against the topic's log,
// the last committed checkpoint, the XA branches in doubt (this ledger's,
// told from other ledgers' by the MAC of their xids), the dead letters not
// re-injected, the commit log's position and the period settings. `billing
// status` prints a [Report]; the metrics sampler (internal/metrics)
// exports the same quantities, computed by the same functions, so that the
// command and the dashboards always agree.
//
// It reads the control tables through the driver's read-only view
// (driver.View: SELECT and XA RECOVER only, parsed where they are
// written), so an account with SELECT on the ledger's database (and, on
// MySQL 8, XA_RECOVER_ADMIN) can run it, and its tests run on the
// in-memory driver.
package ledgerstatus
