package format

import (
	"encoding/json"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/billing/ledger/internal/event"
)

// quickSchema checks records against a JSON Schema of the shape an
// event's schema has (an object whose properties are constrained by type,
// length and pattern; required members; additionalProperties true or
// false), instead of the general validator, which costs more than the
// rest of a record's decoding. It is built only from a schema that uses
// nothing else (annotations aside): then a record it passes is one the
// validator passes. A record it does not pass, or cannot tell (a number
// that is integral only in its fraction, 1.0), goes to the validator,
// which decides and names the cause: its dead letters are unchanged.
type quickSchema struct {
	required []string // those that are not properties
	props    map[string]*quickProp
	list     []*quickProp // props, in a slice (cheaper to go through)
	closed   bool         // additionalProperties false
	// cond, then and els are if, then and else: the condition exactly
	// decided (members present, members equal to a constant), then and
	// else schemas of the same kinds of keyword (nil: none).
	cond      *quickCond
	then, els *quickSchema
}

type quickProp struct {
	name           string
	required       bool
	types          []string // empty: any
	minLen, maxLen int      // -1: none
	pattern        *regexp.Regexp
	min            *int64 // minimum, an integer
	konst          any    // const: a boolean or a string (nil: none)
}

// quickCond is an if of the shape a tombstone's schema takes: members
// required, members (when present) equal to a boolean or string constant;
// decided exactly.
type quickCond struct {
	required []string
	consts   map[string]any
}

// jsonDraft07 are the spellings of draft-07, the registries' default and
// the compiler's: a schema of another draft has no quickSchema.
var jsonDraft07 = map[string]bool{"http://json-schema.org/draft-07/schema#": true, "http://json-schema.org/draft-07/schema": true}

// annotation reports whether a keyword only annotates (validates nothing).
func annotation(k string) bool {
	switch k {
	case "title", "description", "$comment", "examples", "default":
		return true
	}
	return false
}

// newQuickSchema returns the quickSchema of a schema's text, or nil.
func newQuickSchema(text string) *quickSchema {
	dec := json.NewDecoder(strings.NewReader(text))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil
	}
	return quickSchemaOf(doc, true)
}

// quickSchemaOf is the quickSchema of a schema's document, or nil; top:
// the schema itself (an object type, of draft-07, if and else allowed),
// not its then or else.
func quickSchemaOf(doc map[string]any, top bool) *quickSchema {
	q := &quickSchema{props: map[string]*quickProp{}}
	sawType := false
	for k, v := range doc {
		switch {
		case annotation(k), top && k == "$id" && isString(v):
		case top && k == "$schema":
			if s, _ := v.(string); !jsonDraft07[s] {
				return nil
			}
		case top && (k == "then" || k == "else"):
			sub, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			sq := quickSchemaOf(sub, false)
			if sq == nil {
				return nil
			}
			if k == "then" {
				q.then = sq
			} else {
				q.els = sq
			}
		case top && k == "if":
			if q.cond = newQuickCond(v); q.cond == nil {
				return nil
			}
		case k == "type":
			if ts, ok := jsonTypes(v); !ok || len(ts) != 1 || ts[0] != "object" {
				return nil
			}
			sawType = true
		case k == "required":
			names, ok := stringList(v)
			if !ok {
				return nil
			}
			q.required = append(q.required, names...)
		case k == "properties":
			props, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			for name, ps := range props {
				p := newQuickProp(ps)
				if p == nil {
					return nil
				}
				p.name = name
				q.props[name] = p
				q.list = append(q.list, p)
			}
		case k == "additionalProperties":
			b, ok := v.(bool)
			if !ok {
				return nil
			}
			q.closed = !b
		default:
			return nil
		}
	}
	if top && !sawType || q.cond == nil && (q.then != nil || q.els != nil) {
		return nil
	}
	var others []string
	for _, k := range q.required {
		if p := q.props[k]; p != nil {
			p.required = true
		} else {
			others = append(others, k)
		}
	}
	q.required = others
	return q
}

// newQuickCond reads an if of the shape quickCond decides, or nil.
func newQuickCond(v any) *quickCond {
	doc, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	c := &quickCond{consts: map[string]any{}}
	for k, v := range doc {
		switch k {
		case "required":
			names, ok := stringList(v)
			if !ok {
				return nil
			}
			c.required = append(c.required, names...)
		case "properties":
			props, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			for name, ps := range props {
				pd, ok := ps.(map[string]any)
				if !ok || len(pd) != 1 {
					return nil
				}
				switch k := pd["const"].(type) {
				case bool, string:
					c.consts[name] = k
				default:
					return nil
				}
			}
		default:
			return nil
		}
	}
	return c
}

// holds decides the condition on a record's object.
func (c *quickCond) holds(obj map[string]any) bool {
	for _, k := range c.required {
		if _, ok := obj[k]; !ok {
			return false
		}
	}
	for k, want := range c.consts {
		if v, ok := obj[k]; ok && v != want {
			return false
		}
	}
	return true
}

// stringList reads a list of strings (a required keyword's).
func stringList(v any) ([]string, bool) {
	items, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, 0, len(items))
	for _, it := range items {
		s, ok := it.(string)
		if !ok {
			return nil, false
		}
		out = append(out, s)
	}
	return out, true
}

func isString(v any) bool {
	_, ok := v.(string)
	return ok
}

func newQuickProp(v any) *quickProp {
	p := &quickProp{minLen: -1, maxLen: -1}
	if b, ok := v.(bool); ok && b {
		return p // true: anything
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil
	}
	for k, v := range doc {
		switch {
		case annotation(k):
		case k == "type":
			if p.types, ok = jsonTypes(v); !ok {
				return nil
			}
		case k == "minLength", k == "maxLength":
			n, ok := v.(json.Number)
			if !ok || !event.IsIntText(string(n)) || strings.HasPrefix(string(n), "-") {
				return nil
			}
			i, err := n.Int64()
			if err != nil || i > 1<<31 {
				return nil
			}
			if k == "minLength" {
				p.minLen = int(i)
			} else {
				p.maxLen = int(i)
			}
		case k == "pattern":
			s, ok := v.(string)
			if !ok {
				return nil
			}
			re, err := regexp.Compile(s) // the validator's engine
			if err != nil {
				return nil
			}
			p.pattern = re
		case k == "minimum":
			n, ok := v.(json.Number)
			if !ok || !event.IsIntText(string(n)) {
				return nil
			}
			i, err := n.Int64()
			if err != nil {
				return nil
			}
			p.min = &i
		case k == "const":
			switch c := v.(type) {
			case bool, string:
				p.konst = c
			default:
				return nil
			}
		default:
			return nil
		}
	}
	return p
}

// jsonTypes reads a type keyword: one type name or a list of them.
func jsonTypes(v any) ([]string, bool) {
	var ts []string
	switch x := v.(type) {
	case string:
		ts = []string{x}
	case []any:
		for _, e := range x {
			s, ok := e.(string)
			if !ok {
				return nil, false
			}
			ts = append(ts, s)
		}
	default:
		return nil, false
	}
	for _, t := range ts {
		switch t {
		case "string", "integer", "number", "object", "array", "boolean", "null":
		default:
			return nil, false
		}
	}
	return ts, len(ts) > 0
}

// valid reports whether tree (a tree of ParseJSON holding only plain
// values) surely satisfies the schema.
func (q *quickSchema) valid(tree any) bool {
	obj, ok := tree.(map[string]any)
	if !ok {
		return false
	}
	for _, k := range q.required {
		if _, ok := obj[k]; !ok {
			return false
		}
	}
	if q.closed && len(obj) > len(q.props) {
		return false
	}
	if q.closed {
		for k := range obj {
			if q.props[k] == nil {
				return false
			}
		}
	}
	for _, p := range q.list {
		v, ok := obj[p.name]
		if !ok && p.required || ok && !p.valid(v) {
			return false
		}
	}
	if q.cond != nil {
		sub := q.els
		if q.cond.holds(obj) {
			sub = q.then
		}
		if sub != nil && !sub.valid(obj) {
			return false
		}
	}
	return true
}

func (p *quickProp) valid(v any) bool {
	if len(p.types) > 0 {
		t := quickType(v)
		found := false
		for _, want := range p.types {
			if want == t || want == "number" && t == "integer" {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	if p.konst != nil && v != p.konst {
		return false
	}
	if p.min != nil {
		if n, ok := v.(json.Number); ok {
			// An integer's text only (1e3, 2.0: the validator's).
			i, err := n.Int64()
			if !event.IsIntText(string(n)) || err != nil || i < *p.min {
				return false
			}
		}
	}
	s, ok := v.(string)
	if !ok {
		return true
	}
	if p.minLen >= 0 || p.maxLen >= 0 {
		n := utf8.RuneCountInString(s)
		if p.minLen >= 0 && n < p.minLen || p.maxLen >= 0 && n > p.maxLen {
			return false
		}
	}
	return p.pattern == nil || p.pattern.MatchString(s)
}

// quickType is the JSON Schema type of a plain tree value; a number is
// "integer" only when its text is one (1.0, an integer to the validator,
// is "number" here, and goes to it).
func quickType(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if event.IsIntText(string(x)) {
			return "integer"
		}
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return ""
}
