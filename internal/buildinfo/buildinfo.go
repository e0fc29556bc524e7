package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// Stamped at link time (-X); empty otherwise.
var (
	Version string
	Commit  string
)

// Info describes the running binary.
type Info struct {
	Version   string `json:"version"`
	Commit    string `json:"commit"`
	GoVersion string `json:"go_version"`
	Modified  bool   `json:"modified,omitempty"` // built from a tree with uncommitted changes
}

// Get returns the build's version, commit and Go version. Unknown parts are
// "unknown", never empty, so that a metric label or a log field always has
// a value.
func Get() Info {
	i := Info{Version: Version, Commit: Commit, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.Commit == "" {
					i.Commit = s.Value
				}
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	return i
}
