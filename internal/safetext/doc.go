// Package safetext renders text that comes from outside (payloads, event
// ids, instance ids, hosts, xids) for an operator's terminal and
// messages: as is when it is valid UTF-8 of printable characters, Go-quoted
// otherwise (every control byte escaped), so that no value can drive the
// terminal or forge a line of output; and cut to a bound.
package safetext
