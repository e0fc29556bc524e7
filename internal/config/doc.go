// Package config is the service's configuration: one setting per
// environment variable (Config, read with envconfig), each default in its
// variable's tag and nowhere else (Defaults reads them without the
// environment; With sets variables from text in code, as Load would read
// them), checked all at once (Load, Validate) so that an operator sees
// every problem in one message instead of one per restart, and the
// settings each command reads (Scope), so that a command never fails on
// one it does not use; the tools that take settings as the defaults of
// their flags read them unchecked (Unchecked). It is the one reader of the
// environment: no other code reads a setting by hand
// (TestSettingsAreReadOnlyHere lists the few variables that are not
// settings, with their reasons). internal/service maps it onto the parts
// it configures.
package config
