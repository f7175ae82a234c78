package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCSVFormatMismatch: --format csv on NDJSON or a JSON array names the
// file, the line and the likely format instead of encoding/csv's error
// about quotes; a CSV parse error names the line and column.
func TestCSVFormatMismatch(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct{ name, content, want string }{
		{"signals.ndjson", "{\"device\":\"a\",\"offset\":1}\n{\"device\":\"b\",\"offset\":2}\n", "signals.ndjson:1: --format csv, but the line starts with '{': this looks like NDJSON (one JSON object per line): pass --format ndjson"},
		{"signals.json", "\n\n  [{\"device\":\"a\",\"offset\":1}]\n", "signals.json:3: --format csv, but the line starts with '[': this looks like a JSON array: pass --format json"},
		{"bad.csv", "device,offset\na,1\nb\"x,2\n", "bad.csv:3: column 2: bare \" in non-quoted-field (want CSV with a header line; is --format right?)"},
	} {
		path := filepath.Join(dir, tc.name)
		require.NoError(t, os.WriteFile(path, []byte(tc.content), 0o644))
		d, err := openDataset(path, formatCSV)
		require.NoError(t, err)
		err = scanFields(d, func(*fields, []byte, int64) error { return nil })
		require.Error(t, err, tc.name)
		require.Contains(t, err.Error(), tc.want)
	}
}
