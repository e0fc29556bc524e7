// Package waits makes the service's waits without a bound of their own
// visible: a loop that waits for something another process or server must
// do (the commit log's visible position to reach a decided checkpoint, an
// open Kafka transaction to end, an operator to repair the changelog's
// progress) registers a Wait in the instance's Set, says each round what
// it still waits for, and ends it. The Set logs a wait once it has lasted
// First, then at most every Every, saying what it waits for and since
// when; Current lists the waits in progress (the instance's /waits
// endpoint, which `billing status` shows).
package waits
