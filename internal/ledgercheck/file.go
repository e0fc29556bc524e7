package ledgercheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// Marshal encodes e as the expected-ledger JSON document: the metadata
// fields indented, then "balances" and "windows" with one compact row per
// line (diffable, and far smaller than fully indented rows), and
// "adjustments" likewise when there are any. Nil slices and
// maps are written as empty ones. The output is deterministic for equal e.
func Marshal(e *Expected) ([]byte, error) {
	head := *e
	head.Balances, head.Windows, head.Adjustments = nil, nil, nil
	if head.DeadLetters == nil {
		head.DeadLetters = map[string]int64{}
	}
	// Encode the metadata without the row arrays, then splice them in
	// before the closing brace. Maps encode with sorted keys.
	type meta Expected
	hb, err := json.MarshalIndent(struct {
		meta
		Balances    []BalanceRow `json:"balances,omitempty"`
		Windows     []WindowRow  `json:"windows,omitempty"`
		Adjustments []WindowRow  `json:"adjustments,omitempty"`
	}{meta: meta(head)}, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode expected ledger: %w", err)
	}
	hb = bytes.TrimSuffix(hb, []byte("\n}"))
	var buf bytes.Buffer
	buf.Grow(len(hb) + 120*(len(e.Balances)+len(e.Windows)))
	buf.Write(hb)
	if err := writeRows(&buf, "balances", e.Balances); err != nil {
		return nil, err
	}
	if err := writeRows(&buf, "windows", e.Windows); err != nil {
		return nil, err
	}
	if len(e.Adjustments) > 0 {
		if err := writeRows(&buf, "adjustments", e.Adjustments); err != nil {
			return nil, err
		}
	}
	buf.WriteString("\n}\n")
	return buf.Bytes(), nil
}

func writeRows[T any](buf *bytes.Buffer, name string, rows []T) error {
	fmt.Fprintf(buf, ",\n  %q: [", name)
	for i, r := range rows {
		b, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("encode %s row %d: %w", name, i, err)
		}
		if i > 0 {
			buf.WriteByte(',')
		}
		buf.WriteString("\n    ")
		buf.Write(b)
	}
	if len(rows) > 0 {
		buf.WriteString("\n  ")
	}
	buf.WriteByte(']')
	return nil
}

// Unmarshal decodes and validates an expected-ledger document. Unknown
// fields are ignored (forward compatibility within a version); a wrong
// version, trailing data or an inconsistent ledger (see [Expected.Validate])
// is an error.
func Unmarshal(data []byte) (*Expected, error) {
	var e Expected
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("decode expected ledger: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("decode expected ledger: trailing data after the JSON document")
	}
	if e.DeadLetters == nil {
		e.DeadLetters = map[string]int64{}
	}
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("invalid expected ledger: %w", err)
	}
	return &e, nil
}

// WriteFile writes e to path atomically: to a temporary file in the same
// directory, synced, then renamed over path. Readers see either the old file
// or the complete new one, never a partial file; on error path is untouched
// and the temporary file is removed.
func WriteFile(path string, e *Expected) (err error) {
	data, err := Marshal(e)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write expected ledger: %w", err)
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err = f.Write(data); err != nil {
		return fmt.Errorf("write expected ledger %s: %w", tmp, err)
	}
	if err = f.Chmod(0o644); err != nil {
		return fmt.Errorf("write expected ledger %s: %w", tmp, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("sync expected ledger %s: %w", tmp, err)
	}
	if err = f.Close(); err != nil {
		return fmt.Errorf("close expected ledger %s: %w", tmp, err)
	}
	if err = os.Rename(tmp, path); err != nil {
		return fmt.Errorf("rename expected ledger into place: %w", err)
	}
	// Make the rename durable; not all platforms can sync a directory.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// ReadFile reads and validates the expected-ledger file at path.
func ReadFile(path string) (*Expected, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read expected ledger: %w", err)
	}
	e, err := Unmarshal(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return e, nil
}
