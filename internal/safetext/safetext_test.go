package safetext

import (
	"strconv"
	"strings"
	"testing"
)

// TestTextNeverDrivesTheTerminal: text from outside is shown as is only
// when it holds printable characters; anything else is quoted, so that no
// control byte reaches the terminal, and the quoted form reads back; a
// long value is cut on a rune, with an ellipsis.
func TestTextNeverDrivesTheTerminal(t *testing.T) {
	for in, verbatim := range map[string]bool{
		"acct-42": true, "Zoë ☃": true, "a\x1bb": false, "\x1b[2J\x1b]0;pwned\x07": false, "ok\rHIDDEN": false,
		"\xff\xfe": false, "a\x00b": false, "line\nbreak": false, "tab\there": false,
	} {
		got := Text(in, 100)
		if (got == in) != verbatim {
			t.Errorf("Text(%q) = %q; verbatim %v", in, got, verbatim)
		}
		for _, r := range got {
			if r < 0x20 || r == 0x7f {
				t.Errorf("Text(%q) holds the control character %U", in, r)
			}
		}
		if !verbatim {
			if u, err := strconv.Unquote(got); err != nil || u != in {
				t.Errorf("Text(%q) = %q does not read back: %v", in, got, err)
			}
		}
	}
	if !Printable([]byte("line\nbreak\ttab"), true) || Printable([]byte("line\nbreak"), false) {
		t.Error("newlines and tabs are printable with lines only")
	}
	if got := Bytes(nil, 10); got != "-" {
		t.Errorf("Bytes(nil) = %q", got)
	}
	if got := Bytes([]byte{}, 10); got != "" {
		t.Errorf("Bytes(empty) = %q", got)
	}
	if got := Text(strings.Repeat("é", 50), 10); len([]rune(got)) != 10 || !strings.HasSuffix(got, "…") {
		t.Errorf("Text cut = %q", got)
	}
}
