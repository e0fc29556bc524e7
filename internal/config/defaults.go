package config

import (
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kelseyhightower/envconfig"
)

// Defaults is the configuration every setting has when its variable is
// not set, read from the envconfig tags of Config, the one home of each
// default (Load applies the same tags; `billing --help` and the README's
// table show them; TestDefaultsAreLoads holds Defaults to Load's reading
// of an empty environment, TestReadmeShowsTheDefaults the README to the
// tags). It reads no environment: tests and the benchmark take the
// service's configuration from it and change what they must. The
// required settings (KAFKA_BROKERS, MYSQL_DSN) are empty.
func Defaults() Config {
	var c Config
	v := reflect.ValueOf(&c).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		def, ok := t.Field(i).Tag.Lookup("default")
		if !ok {
			continue
		}
		if err := decodeDefault(v.Field(i), def); err != nil {
			// A tag that does not parse is a bug of this file that every
			// test of the package finds.
			panic(fmt.Sprintf("config: the default of %s: %v", t.Field(i).Tag.Get("envconfig"), err))
		}
	}
	return c
}

// With returns c with the settings of vars (variable name → value, the
// text an environment would hold) set as Load reads them, so that a
// configuration can be built in code from Defaults and the overrides of a
// command line (the benchmark's -service-env). An unknown variable or a
// value that does not parse is a problem of the *Error; the result is not
// validated (Validate).
func (c Config) With(vars map[string]string) (Config, error) {
	v := reflect.ValueOf(&c).Elem()
	t := v.Type()
	var problems []string
	for _, name := range slices.Sorted(maps.Keys(vars)) {
		i := slices.IndexFunc(reflect.VisibleFields(t), func(f reflect.StructField) bool { return f.Tag.Get("envconfig") == name })
		if i < 0 {
			problems = append(problems, fmt.Sprintf("%s is not a setting of the service", name))
			continue
		}
		if err := decodeDefault(v.Field(i), vars[name]); err != nil {
			problems = append(problems, fmt.Sprintf("%s=%q: %v", name, vars[name], err))
		}
	}
	if len(problems) > 0 {
		return c, &Error{Problems: problems}
	}
	return c, nil
}

// Unchecked reads every setting as Load does, none of them required and
// none checked (a value that does not parse is left zero, as LoadScope
// leaves a setting outside its scope): for the tools whose flags take a
// setting from the environment when no flag gives it (billing-gen,
// billing-verify) and for the commands that use one setting alone
// (billing healthcheck), each of which checks what it uses itself. The
// defaults are the tags', as everywhere.
func Unchecked() Config {
	// No setting is in the empty scope: none is required, no parse
	// failure or check is reported (every check names its settings).
	c, _ := LoadScope(Scope{})
	return c
}

// Environment returns the settings the process environment sets (variable
// name → value), for With.
func Environment() map[string]string {
	out := map[string]string{}
	t := reflect.TypeFor[Config]()
	for i := 0; i < t.NumField(); i++ {
		name := t.Field(i).Tag.Get("envconfig")
		if v, ok := os.LookupEnv(name); ok {
			out[name] = v
		}
	}
	return out
}

// decodeDefault sets f to the text s (a default, or a value With is
// given), as envconfig decodes the kinds of Config's fields.
func decodeDefault(f reflect.Value, s string) error {
	if d, ok := f.Addr().Interface().(envconfig.Decoder); ok {
		return d.Decode(s)
	}
	switch f.Interface().(type) {
	case time.Duration:
		d, err := time.ParseDuration(s)
		f.SetInt(int64(d))
		return err
	case string:
		f.SetString(s)
		return nil
	case int:
		n, err := strconv.ParseInt(s, 0, strconv.IntSize)
		f.SetInt(n)
		return err
	case bool:
		b, err := strconv.ParseBool(s)
		f.SetBool(b)
		return err
	case []string:
		f.Set(reflect.ValueOf(strings.Split(s, ",")))
		return nil
	}
	return fmt.Errorf("no default decoder for %s", f.Type())
}
