package event

import (
	"bytes"
	"fmt"
	"unicode/utf8"
)

// This file is a strict RFC 8259 JSON lexer specialised for Decode: it
// validates, but does not build, values. Its guarantees, relied on by
// decode.go:
//
//   - Every string it accepts (keys and values, at any depth) is valid
//     UTF-8 after unescaping: raw bytes are valid UTF-8 and every \u escape
//     of a UTF-16 surrogate is part of a high+low pair. appendUnescaped may
//     therefore assume well-formed input.
//   - Numbers match -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?.
//   - Nesting depth is unbounded (the bracket stack lives on the heap only
//     beyond 64 levels), and there is no recursion, so hostile input cannot
//     exhaust the goroutine stack.
//   - Errors carry ReasonInvalidJSON or ReasonInvalidUTF8 and the byte
//     offset of the problem; Field is left empty for the caller to fill in.

// strSafe[c] reports whether byte c may appear verbatim in a JSON string
// and needs no further inspection: printable ASCII except '"' and '\\'.
var strSafe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(data []byte, p int) int {
	for p < len(data) && isSpace(data[p]) {
		p++
	}
	return p
}

func syntaxError(off int, format string, args ...any) *DecodeError {
	return &DecodeError{
		Reason: ReasonInvalidJSON,
		Detail: fmt.Sprintf(format, args...) + fmt.Sprintf(" at offset %d", off),
	}
}

// unexpected reports the byte at data[p] (or end of input) where something
// else was required.
func unexpected(data []byte, p int, want string) *DecodeError {
	if p >= len(data) {
		return syntaxError(p, "unexpected end of input, expected %s", want)
	}
	return syntaxError(p, "invalid character %s, expected %s", describeByte(data[p]), want)
}

func describeByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}

func utf8Error(off int, detail string) *DecodeError {
	return &DecodeError{
		Reason: ReasonInvalidUTF8,
		Detail: fmt.Sprintf("%s at offset %d", detail, off),
	}
}

// scanString scans the JSON string whose opening quote is at data[p]. It
// returns the offset just past the closing quote and whether the string
// contains any escape sequence (if not, its content is the raw bytes).
func scanString(data []byte, p int) (end int, escaped bool, err *DecodeError) {
	start := p
	p++
	for {
		for p < len(data) && strSafe[data[p]] {
			p++
		}
		if p >= len(data) {
			return 0, false, syntaxError(start, "unterminated string")
		}
		switch c := data[p]; {
		case c == '"':
			return p + 1, escaped, nil
		case c == '\\':
			escaped = true
			if p, err = scanEscape(data, p); err != nil {
				return 0, false, err
			}
		case c < 0x20:
			return 0, false, syntaxError(p, "unescaped control character %s in string", describeByte(c))
		default:
			r, size := utf8.DecodeRune(data[p:])
			if r == utf8.RuneError && size == 1 {
				return 0, false, utf8Error(p, "invalid UTF-8 in string")
			}
			p += size
		}
	}
}

// scanEscape validates the escape sequence starting with the backslash at
// data[p] and returns the offset just past it. A high surrogate escape is
// consumed together with the low surrogate escape that must follow it.
func scanEscape(data []byte, p int) (int, *DecodeError) {
	if p+1 >= len(data) {
		return 0, syntaxError(p, "unterminated escape sequence")
	}
	switch data[p+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return p + 2, nil
	case 'u':
	default:
		return 0, syntaxError(p, "invalid escape sequence: backslash followed by %s", describeByte(data[p+1]))
	}
	v, ok := hex4(data, p+2)
	if !ok {
		return 0, syntaxError(p, "invalid \\u escape")
	}
	switch {
	case v < 0xd800 || v > 0xdfff:
		return p + 6, nil
	case v >= 0xdc00:
		return 0, utf8Error(p, fmt.Sprintf("unpaired low surrogate \\u%04x", v))
	}
	q := p + 6
	if q+1 >= len(data) || data[q] != '\\' || data[q+1] != 'u' {
		return 0, utf8Error(p, fmt.Sprintf("unpaired high surrogate \\u%04x", v))
	}
	w, ok := hex4(data, q+2)
	if !ok {
		return 0, syntaxError(q, "invalid \\u escape")
	}
	if w < 0xdc00 || w > 0xdfff {
		return 0, utf8Error(p, fmt.Sprintf("unpaired high surrogate \\u%04x", v))
	}
	return q + 6, nil
}

// hex4 decodes the four hex digits at data[p:p+4].
func hex4(data []byte, p int) (rune, bool) {
	if p+4 > len(data) {
		return 0, false
	}
	var v rune
	for _, c := range data[p : p+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		v = v<<4 | rune(c)
	}
	return v, true
}

// appendUnescaped appends the decoded form of the content (without quotes)
// of a string already accepted by scanString.
func appendUnescaped(dst, src []byte) []byte {
	for len(src) > 0 {
		i := bytes.IndexByte(src, '\\')
		if i < 0 {
			return append(dst, src...)
		}
		dst = append(dst, src[:i]...)
		src = src[i:]
		switch c := src[1]; c {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			v, _ := hex4(src, 2)
			if v >= 0xd800 && v < 0xdc00 {
				w, _ := hex4(src, 8)
				v = 0x10000 + (v-0xd800)<<10 + (w - 0xdc00)
				src = src[6:]
			}
			dst = utf8.AppendRune(dst, v)
			src = src[6:]
			continue
		default: // '"', '\\', '/'
			dst = append(dst, c)
		}
		src = src[2:]
	}
	return dst
}

// scanNumber scans the JSON number starting at data[p]. isInt reports that
// it has neither a fraction nor an exponent part. The byte following the
// number is not examined: "012" scans as "0" and the caller rejects the
// '1' that follows.
func scanNumber(data []byte, p int) (end int, isInt bool, err *DecodeError) {
	if p < len(data) && data[p] == '-' {
		p++
	}
	switch {
	case p >= len(data):
		return 0, false, unexpected(data, p, "digit")
	case data[p] == '0':
		p++
	case '1' <= data[p] && data[p] <= '9':
		p = skipDigits(data, p+1)
	default:
		return 0, false, unexpected(data, p, "digit")
	}
	isInt = true
	if p < len(data) && data[p] == '.' {
		isInt = false
		q := skipDigits(data, p+1)
		if q == p+1 {
			return 0, false, unexpected(data, q, "digit after decimal point")
		}
		p = q
	}
	if p < len(data) && (data[p] == 'e' || data[p] == 'E') {
		isInt = false
		p++
		if p < len(data) && (data[p] == '+' || data[p] == '-') {
			p++
		}
		q := skipDigits(data, p)
		if q == p {
			return 0, false, unexpected(data, q, "digit in exponent")
		}
		p = q
	}
	return p, isInt, nil
}

func skipDigits(data []byte, p int) int {
	for p < len(data) && '0' <= data[p] && data[p] <= '9' {
		p++
	}
	return p
}

func scanLiteral(data []byte, p int, lit string) (int, *DecodeError) {
	if len(data)-p < len(lit) || string(data[p:p+len(lit)]) != lit {
		return 0, syntaxError(p, "invalid literal, expected %q", lit)
	}
	return p + len(lit), nil
}

// skipValue validates the JSON value starting at data[p] (no leading
// space) and returns the offset just past it. Keys of nested objects are
// not checked for duplicates.
func skipValue(data []byte, p int) (int, *DecodeError) {
	var stackBuf [64]byte
	stack := stackBuf[:0] // closing brackets of the open containers
	var err *DecodeError
	for {
		// A value is expected at p.
		if p >= len(data) {
			return 0, unexpected(data, p, "value")
		}
		switch c := data[p]; c {
		case '{', '[':
			p = skipSpace(data, p+1)
			if c == '{' {
				if p < len(data) && data[p] == '}' {
					p++
					break
				}
				stack = append(stack, '}')
				if p, err = scanKeyColon(data, p); err != nil {
					return 0, err
				}
				continue
			}
			if p < len(data) && data[p] == ']' {
				p++
				break
			}
			stack = append(stack, ']')
			continue
		case '"':
			if p, _, err = scanString(data, p); err != nil {
				return 0, err
			}
		case 't':
			if p, err = scanLiteral(data, p, "true"); err != nil {
				return 0, err
			}
		case 'f':
			if p, err = scanLiteral(data, p, "false"); err != nil {
				return 0, err
			}
		case 'n':
			if p, err = scanLiteral(data, p, "null"); err != nil {
				return 0, err
			}
		default:
			if c != '-' && (c < '0' || c > '9') {
				return 0, unexpected(data, p, "value")
			}
			if p, _, err = scanNumber(data, p); err != nil {
				return 0, err
			}
		}
		// A complete value ends before p: close containers or move on to
		// the next element.
		for {
			if len(stack) == 0 {
				return p, nil
			}
			p = skipSpace(data, p)
			closer := stack[len(stack)-1]
			if p < len(data) && data[p] == closer {
				stack = stack[:len(stack)-1]
				p++
				continue
			}
			if p >= len(data) || data[p] != ',' {
				return 0, unexpected(data, p, fmt.Sprintf("',' or '%c'", closer))
			}
			p = skipSpace(data, p+1)
			if closer == '}' {
				if p, err = scanKeyColon(data, p); err != nil {
					return 0, err
				}
			}
			break
		}
	}
}

// scanKeyColon scans `"key" :` plus following space inside a nested object
// and returns the offset of the member value.
func scanKeyColon(data []byte, p int) (int, *DecodeError) {
	if p >= len(data) || data[p] != '"' {
		return 0, unexpected(data, p, "string key")
	}
	p, _, err := scanString(data, p)
	if err != nil {
		return 0, err
	}
	p = skipSpace(data, p)
	if p >= len(data) || data[p] != ':' {
		return 0, unexpected(data, p, "':' after object key")
	}
	return skipSpace(data, p+1), nil
}
