// Package publisher publishes the ledger's changelog
// (docs/changelog.md): the change events the checkpoints wrote to the
// outbox (changelog_outbox, inside their XA branches), to Kafka, in Kafka
// transactions, in the order the checkpoints committed (the commit log's
// commit_seq), only up to the commit log's visible position, exactly once.
//
// One publisher per ledger runs at a time: a lease row in changelog_state
// says which instance (liveness only). Safety is Kafka's: every publisher
// of a ledger uses the same transactional id and initialises it before it
// reads or writes anything, which fences the previous holder (its open
// transaction is aborted, anything it sends after is refused).
//
// Where to resume comes from Kafka, never from MySQL: every transaction
// also writes a progress record to <prefix>._progress saying how far it
// publishes, on the topic's one partition (a topic of more is refused:
// kafka.go); after initialising, the publisher reads the last committed
// one. MySQL's changelog_state.published is a hint, raised after each
// Kafka commit and only after the outbox rows it covers are deleted; a
// crash between the two leaves it behind, never ahead. A record lost
// (Kafka holds less than the hint) stops the publishing until an operator
// runs RecoverProgress (recover.go), which rebuilds it from the change
// events the topics hold.
//
// The waits without a bound of their own (the commit log's visible
// position, an open transaction on the progress topic, the backlog
// holding checkpoints, a refusal) are reported in Config.Waits (package
// waits).
//
// The decisions (where to resume, what goes into the next transaction,
// what may be deleted) are pure functions (plan.go); publisher.go does the
// I/O; backlog.go watches the backlog on every instance (the hold on
// checkpoints, metrics).
package publisher
