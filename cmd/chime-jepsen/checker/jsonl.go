package checker

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// ReadJSONL reads a file of one JSON value per line. Blank lines are skipped; any other line
// that does not decode (a truncated last line included) is an error naming the file and the
// line, because a history the checker silently shortened could hide a violation.
func ReadJSONL[T any](path string) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }() // read only: a read error is what matters
	var out []T
	r := bufio.NewReaderSize(f, 1<<20)
	for line := 1; ; line++ {
		b, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(b)) > 0 {
			var v T
			if jerr := json.Unmarshal(b, &v); jerr != nil {
				return nil, fmt.Errorf("%s:%d: %w", path, line, jerr)
			}
			out = append(out, v)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
	}
}

// WriteJSONL writes items to path, one JSON value per line, replacing the file.
func WriteJSONL[T any](path string, items []T) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	enc := json.NewEncoder(w) // Encode ends each value with '\n'
	for i := range items {
		if err := enc.Encode(&items[i]); err != nil {
			_ = f.Close() // the file is incomplete either way; err says why
			return fmt.Errorf("%s: item %d: %w", path, i, err)
		}
	}
	if err := w.Flush(); err != nil {
		_ = f.Close() // the file is incomplete either way; err says why
		return err
	}
	return f.Close()
}
