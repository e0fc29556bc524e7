// Package docs holds the project's documentation pages; its test checks
// that every relative link of README.md and of the pages resolves.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// pages are the Markdown files whose links are checked.
func pages(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, pattern := range []string{"../README.md", "*.md", "*/*.md"} {
		m, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) < 5 {
		t.Fatalf("found %d pages: the globs lost them", len(out))
	}
	return out
}

var (
	// link is an inline Markdown link; images and links in code are
	// dropped before it is applied.
	link     = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	fence    = regexp.MustCompile("(?ms)^```.*?^```")
	code     = regexp.MustCompile("`[^`\n]*`")
	heading  = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	external = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`)
)

// anchors returns the anchors GitHub gives the headings of a Markdown
// page: lower case, punctuation dropped, spaces as hyphens, and -1, -2,
// … for repeats.
func anchors(text string) map[string]bool {
	text = fence.ReplaceAllString(text, "")
	out := map[string]bool{}
	seen := map[string]int{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		var b strings.Builder
		for _, r := range strings.ToLower(m[1]) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		a := b.String()
		if n := seen[a]; n > 0 {
			out[a+"-"+strconv.Itoa(n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// TestLinksResolve: every relative link of README.md and docs/ names a
// file or directory that exists, and every #anchor a heading of its page.
// A page moved or a heading renamed cannot leave a link behind.
func TestLinksResolve(t *testing.T) {
	texts := map[string]string{}
	read := func(path string) (string, bool) {
		if s, ok := texts[path]; ok {
			return s, true
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return "", false
		}
		texts[path] = string(b)
		return texts[path], true
	}
	checked := 0
	for _, page := range pages(t) {
		text, _ := read(page)
		prose := code.ReplaceAllString(fence.ReplaceAllString(text, ""), "")
		for _, m := range link.FindAllStringSubmatch(prose, -1) {
			target := m[1]
			if external.MatchString(target) {
				continue
			}
			checked++
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s links to %s: no such file", page, target)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			s, ok := read(path)
			if !ok {
				t.Errorf("%s links to %s: cannot read %s", page, target, path)
				continue
			}
			if !anchors(s)[anchor] {
				t.Errorf("%s links to %s: %s has no heading with that anchor", page, target, path)
			}
		}
	}
	if checked < 50 {
		t.Fatalf("checked %d links: the pattern lost them", checked)
	}
}

// TestAnchorsAreGitHubs pins the anchor rule to examples GitHub renders.
func TestAnchorsAreGitHubs(t *testing.T) {
	got := anchors("# The contract in short\n## 3. Settings every instance must share\n" +
		"### Seeds in the writes' order, claims that wait for the decision\n## Issue 21, item 1: expiry by generations (no delete per key)\n" +
		"## Repeat\n## Repeat\n```\n# not a heading\n```\n")
	for _, want := range []string{"the-contract-in-short", "3-settings-every-instance-must-share",
		"seeds-in-the-writes-order-claims-that-wait-for-the-decision", "issue-21-item-1-expiry-by-generations-no-delete-per-key",
		"repeat", "repeat-1"} {
		if !got[want] {
			t.Errorf("no anchor %q in %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Error("a line in a code block became a heading")
	}
}
