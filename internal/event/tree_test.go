package event

import (
	"reflect"
	"testing"
)

// FuzzParseJSONInto: ParseJSONInto gives ParseJSON's tree and errors,
// whatever the document, its root built in a map reused from the document
// before and its expected member names interned.
func FuzzParseJSONInto(f *testing.F) {
	for _, tc := range acceptCases {
		f.Add([]byte(tc.in))
	}
	for _, tc := range rejectCases {
		if len(tc.in) <= fuzzMaxPayload+16 {
			f.Add([]byte(tc.in))
		}
	}
	f.Add([]byte(`{"event_id":"e","event_id":"f"}`))
	f.Add([]byte(`{"event\u005fid":"e","event_id":"f"}`))
	f.Add([]byte(`{"a":{"b":1,"b":2},"currency":null,"":[]}`))
	f.Add([]byte(`[{"event_id":1}]`))
	f.Add([]byte(` "x" `))
	root := map[string]any{}
	names := []string{"event_id", "account_id", "amount_minor", "currency", "occurred_at", "a", ""}
	f.Fuzz(func(t *testing.T, doc []byte) {
		want, werr := ParseJSON(doc)
		clear(root)
		got, err := ParseJSONInto(doc, root, names)
		if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(err, werr) {
			t.Fatalf("%q:\n got %#v %v\nwant %#v %v", doc, got, err, want, werr)
		}
		if m, ok := got.(map[string]any); ok && reflect.ValueOf(m).UnsafePointer() != reflect.ValueOf(root).UnsafePointer() {
			t.Fatalf("%q: the root is not built in the map given", doc)
		}
	})
}
