package driver

// Feature is a part of the store that only some configurations use: the
// declaration of the privileges the store needs (mysqldriver.Access) is
// by feature, and the pipeline says which features it runs
// (pipeline.Config.Features). A feature is named by the setting that
// turns it on.
type Feature string

// The features.
const (
	FeatureAlways    Feature = "always"                   // every configuration
	FeatureClosing   Feature = "WINDOW_CLOSE_AFTER"       // windows that close: adjustments, the frontier, sealing
	FeatureEntries   Feature = "LEDGER_ENTRIES"           // ledger entries
	FeatureRetention Feature = "LEDGER_ENTRIES_RETENTION" // their retention (DeleteEntries)
	FeatureChangelog Feature = "CHANGELOG_TOPIC_PREFIX"   // the changelog: the outbox, its publisher, the snapshot
)
