// Package health decides what the service's /healthz and /readyz answer,
// so that an orchestrator can act on them:
//
//   - /healthz (liveness) is 200 from the first second of the process,
//     through startup, and fails only when the pipeline is wedged: records
//     have waited for longer than MaxStall without a checkpoint committing.
//     Restarting the instance then gives its partitions to another member.
//   - /readyz (readiness) is 200 when the instance can do its job: startup
//     is over, MySQL and Kafka answer, the group coordinator lists it as a
//     member of the group, the partitions it was assigned are claimed, and
//     checkpoints keep up. A member with no partitions (a standby, when
//     there are more instances than partitions) is ready.
//
// The Monitor reads everything from memory; the round trips (MySQL pings,
// a DescribeGroups) run in its own loop every CheckInterval, so that a
// probe never waits on a remote system.
package health
