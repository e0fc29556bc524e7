package event

import (
	"encoding/json"
	"fmt"
)

// MaxTreeDepth bounds the nesting of a record decoded into a tree
// (ParseJSON, and the decoders of the other formats): a deeper record is
// rejected, so that hostile input cannot exhaust the goroutine stack of the
// recursive builders or make a record cost more than its bytes.
const MaxTreeDepth = 64

// ParseJSON parses one JSON document (RFC 8259, UTF-8; surrounding space
// allowed) into a tree of map[string]any, []any, string, json.Number, bool
// and nil, for a [Mapping] to read. It is as strict as [Decoder.Decode]:
// every string is valid UTF-8, a key repeated in the top-level object is
// rejected (ReasonDuplicateKey), one repeated in a nested object is kept as
// ambiguous (a Mapping whose path leads through it rejects the record with
// ReasonDuplicateKey: which of the values it meant would be a guess; like
// Decode, an ignored member's duplicates do no harm), and so is nesting deeper than MaxTreeDepth (ReasonInvalidJSON). Errors
// are *DecodeError; ParseJSON never panics.
func ParseJSON(data []byte) (any, *DecodeError) { return ParseJSONInto(data, nil, nil) }

// ParseJSONInto is ParseJSON building a top-level object in root (empty;
// nil: a new map) and naming its members found in names by those strings:
// a decoder that reuses root, and names the members it expects, saves the
// allocations of a map and of its keys per record. The tree is the same.
func ParseJSONInto(data []byte, root map[string]any, names []string) (any, *DecodeError) {
	p := skipSpace(data, 0)
	if p >= len(data) {
		return nil, syntaxError(p, "record value contains only white space")
	}
	var v any
	var err *DecodeError
	if p < len(data) && data[p] == '{' {
		v, p, err = parseObjectInto(data, p, 0, root, names)
	} else {
		v, p, err = parseTree(data, p, 0)
	}
	if err != nil {
		return nil, err
	}
	if p = skipSpace(data, p); p != len(data) {
		return nil, syntaxError(p, "trailing data after JSON value")
	}
	return v, nil
}

func parseTree(data []byte, p, depth int) (any, int, *DecodeError) {
	if p >= len(data) {
		return nil, 0, unexpected(data, p, "value")
	}
	switch c := data[p]; c {
	case '{', '[':
		if depth >= MaxTreeDepth {
			return nil, 0, syntaxError(p, "nesting deeper than %d levels", MaxTreeDepth)
		}
		if c == '[' {
			return parseArray(data, p, depth)
		}
		return parseObject(data, p, depth)
	case '"':
		end, escaped, err := scanString(data, p)
		if err != nil {
			return nil, 0, err
		}
		s := data[p+1 : end-1]
		if escaped {
			return string(appendUnescaped(nil, s)), end, nil
		}
		return string(s), end, nil
	case 't':
		end, err := scanLiteral(data, p, "true")
		return true, end, err
	case 'f':
		end, err := scanLiteral(data, p, "false")
		return false, end, err
	case 'n':
		end, err := scanLiteral(data, p, "null")
		return nil, end, err
	default:
		if c != '-' && (c < '0' || c > '9') {
			return nil, 0, unexpected(data, p, "value")
		}
		end, _, err := scanNumber(data, p)
		if err != nil {
			return nil, 0, err
		}
		return json.Number(data[p:end]), end, nil
	}
}

func parseArray(data []byte, p, depth int) (any, int, *DecodeError) {
	out := []any{}
	p = skipSpace(data, p+1)
	if p < len(data) && data[p] == ']' {
		return out, p + 1, nil
	}
	for {
		v, q, err := parseTree(data, p, depth+1)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, v)
		p = skipSpace(data, q)
		switch {
		case p < len(data) && data[p] == ',':
			p = skipSpace(data, p+1)
		case p < len(data) && data[p] == ']':
			return out, p + 1, nil
		default:
			return nil, 0, unexpected(data, p, "',' or ']'")
		}
	}
}

func parseObject(data []byte, p, depth int) (any, int, *DecodeError) {
	return parseObjectInto(data, p, depth, nil, nil)
}

// parseObjectInto builds the object in out (nil: a new map), its keys
// found in names by those strings.
func parseObjectInto(data []byte, p, depth int, out map[string]any, names []string) (any, int, *DecodeError) {
	if out == nil {
		out = map[string]any{}
	}
	p = skipSpace(data, p+1)
	if p < len(data) && data[p] == '}' {
		return out, p + 1, nil
	}
	for {
		if p >= len(data) || data[p] != '"' {
			return nil, 0, unexpected(data, p, "string key")
		}
		keyStart := p
		end, escaped, err := scanString(data, p)
		if err != nil {
			return nil, 0, err
		}
		kb := data[p+1 : end-1]
		if escaped {
			kb = appendUnescaped(nil, kb)
		}
		key := ""
		for _, n := range names {
			if n == string(kb) {
				key = n
				break
			}
		}
		if key == "" {
			key = string(kb)
		}
		p = skipSpace(data, end)
		if p >= len(data) || data[p] != ':' {
			return nil, 0, unexpected(data, p, "':' after object key")
		}
		v, q, err := parseTree(data, skipSpace(data, p+1), depth+1)
		if err != nil {
			return nil, 0, err
		}
		// A repeated key does not make the map grow (one hash of the key,
		// not a lookup and then a store).
		n := len(out)
		out[key] = v
		if len(out) == n {
			if depth == 0 {
				return nil, 0, &DecodeError{
					Reason: ReasonDuplicateKey,
					Detail: fmt.Sprintf("duplicate key %s at offset %d", quote(kb), keyStart),
				}
			}
			out[key] = ambiguous{}
		}
		p = skipSpace(data, q)
		switch {
		case p < len(data) && data[p] == ',':
			p = skipSpace(data, p+1)
		case p < len(data) && data[p] == '}':
			return out, p + 1, nil
		default:
			return nil, 0, unexpected(data, p, "',' or '}'")
		}
	}
}

// ambiguous stands for the value of a key repeated in a nested object.
type ambiguous struct{}
