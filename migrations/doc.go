// Package migrations embeds the ledger's schema so that the binary applies
// it at start (goose, under goose's MySQL table lock) without files on disk.
package migrations
