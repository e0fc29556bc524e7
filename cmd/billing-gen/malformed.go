package main

import (
	"github.com/billing/ledger/internal/event"
	"github.com/billing/ledger/internal/event/format"
	"github.com/billing/ledger/internal/ledgercheck"
)

// malformedReason is the dead letter a malformed record of kind k becomes
// in format f (with -cloudevents ce): the empty and the too-large record
// are refused for their size first; with CloudEvents every other kind has
// no CloudEvent's headers, and in the registry formats no magic byte.
func malformedReason(f, ce string, k ledgercheck.MalformedKind) string {
	switch {
	case k == ledgercheck.MalformedEmptyPayload || k == ledgercheck.MalformedPayloadTooLarge:
		return k.Reason()
	case ce != "":
		return string(event.ReasonInvalidCloudEvent)
	case format.NeedsRegistry(f):
		return string(event.ReasonInvalidEncoding)
	}
	return k.Reason()
}
