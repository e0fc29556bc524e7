package safetext

import (
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Printable reports whether b is valid UTF-8 of printable characters
// (and, with lines, of tabs and newlines).
func Printable(b []byte, lines bool) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !(lines && (r == '\n' || r == '\t')) {
			return false
		}
	}
	return true
}

// Bytes renders an identifier for a table cell or a message: "-" when
// absent (nil), else as Text.
func Bytes(b []byte, max int) string {
	if b == nil {
		return "-"
	}
	return Text(string(b), max)
}

// Text is s as is when printable, Go-quoted otherwise, cut to max runes
// (the last one an ellipsis).
func Text(s string, max int) string {
	if !Printable([]byte(s), false) {
		s = strconv.Quote(s)
	}
	if utf8.RuneCountInString(s) > max {
		s = string([]rune(s)[:max-1]) + "…"
	}
	return s
}
