package filetable

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func testSnapshot() Snapshot {
	return Snapshot{
		Version: formatVersion, ID: 7, CommitUser: "u<&>", Checkpoint: 12,
		CommitTime: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC),
		Manifests: []ManifestRef{
			{Name: "manifest-aa.json", Files: 2, Records: 10, Bytes: 100, Checksum: 1},
			{Name: "manifest-bb.json", Files: 1, Records: 5, Bytes: 50, Checksum: 2},
		},
		Delta:        &ManifestRef{Name: "manifest-bb.json", Files: 1, Records: 5, Bytes: 50, Checksum: 2},
		TotalRecords: 15, TotalFiles: 3,
		Committed: map[string]int64{"u<&>": 12, "v": 3},
	}
}

func testManifest() manifest {
	return manifest{Version: formatVersion, Files: []DataFile{
		{Path: "data/w-0-e-0-1.ndjson", Records: 3, Bytes: 30, CRC32C: 0xdeadbeef, Writer: 0, Checkpoint: 2},
		{Path: "data/w-1-e-0-1.ndjson", Records: 7, Bytes: 70, CRC32C: 1, Writer: 1, Checkpoint: 9223372036854775807},
	}}
}

// TestSnapshotEncoding: a snapshot round-trips; any change to the decoded
// value (here: each field) is caught by the checksum, and invalid ones by
// validation.
func TestSnapshotEncoding(t *testing.T) {
	s := testSnapshot()
	b, err := encodeSnapshot(&s)
	require.NoError(t, err)
	got, err := decodeSnapshot("snap", 7, b)
	require.NoError(t, err)
	require.Equal(t, s, got)
	_, err = decodeSnapshot("snap", 8, b)
	require.ErrorContains(t, err, "filetable: snap: snapshot id 7 in the file of snapshot 8")

	for _, tc := range []struct{ from, to string }{
		{`"checkpoint": 12`, `"checkpoint": 13`},
		{`"totalFiles": 3`, `"totalFiles": 4`},
		{`"v": 3`, `"v": 4`},
		{`"files": 2`, `"files": 3`},
		{`"name": "manifest-aa.json"`, `"name": "manifest-ab.json"`},
		{`2025-01-02`, `2025-01-03`},
	} {
		changed := strings.Replace(string(b), tc.from, tc.to, 1)
		require.NotEqual(t, string(b), changed, tc.from)
		_, err := decodeSnapshot("snap", 7, []byte(changed))
		require.ErrorIs(t, err, ErrCorrupt, tc.from)
		require.ErrorContains(t, err, "filetable: snap: snapshot checksum", tc.from)
	}
	for _, tc := range []struct {
		name   string
		change func(*Snapshot)
		want   string
	}{
		{"version", func(s *Snapshot) { s.Version = 2 }, "snapshot version 2"},
		{"user", func(s *Snapshot) { s.CommitUser = ""; s.Committed[""] = 12 }, "empty commit user"},
		{"committed", func(s *Snapshot) { s.Committed["u<&>"] = 11 }, "its newest commit is recorded as 11"},
		{"totals", func(s *Snapshot) { s.TotalRecords = 16 }, "the manifests hold 3 files and 15 records"},
		{"traversal", func(s *Snapshot) { s.Manifests[0].Name = "manifest-../../x.json" }, "bad manifest name"},
		{"duplicate", func(s *Snapshot) { s.Manifests[1].Name = s.Manifests[0].Name }, "listed twice"},
		{"delta", func(s *Snapshot) { s.Delta.Name = "x" }, "delta: bad manifest name"},
	} {
		s := testSnapshot()
		tc.change(&s)
		b, err := encodeSnapshot(&s)
		require.NoError(t, err)
		_, err = decodeSnapshot("snap", 0, b)
		require.ErrorIs(t, err, ErrCorrupt, tc.name)
		require.ErrorContains(t, err, tc.want, tc.name)
	}
}

// TestManifestEncoding: a manifest round-trips and is checked against
// the snapshot's reference to it.
func TestManifestEncoding(t *testing.T) {
	m := testManifest()
	b, err := encodeManifest(&m)
	require.NoError(t, err)
	got, err := decodeManifest("man", b, nil)
	require.NoError(t, err)
	require.Equal(t, m, got)
	ref := refOf("manifest-x.json", m)
	require.Equal(t, ManifestRef{Name: "manifest-x.json", Files: 2, Records: 10, Bytes: 100, Checksum: m.Checksum}, ref)
	_, err = decodeManifest("man", b, &ref)
	require.NoError(t, err)
	ref.Records++
	_, err = decodeManifest("man", b, &ref)
	require.ErrorContains(t, err, "filetable: man: manifest holds 2 files, 10 records")
	changed := strings.Replace(string(b), `"records":7`, `"records":8`, 1)
	_, err = decodeManifest("man", []byte(changed), nil)
	require.ErrorContains(t, err, "manifest checksum")

	m = testManifest()
	m.Files[1].Path = "data/../x.ndjson"
	b, err = encodeManifest(&m)
	require.NoError(t, err)
	_, err = decodeManifest("man", b, nil)
	require.ErrorContains(t, err, `entry 1: bad data file path "data/../x.ndjson"`)
}

// TestNames: the names readers accept.
func TestNames(t *testing.T) {
	for name, want := range map[string]int64{"snapshot-1": 1, "snapshot-120": 120, "snapshot-0": 0, "snapshot-007": 0,
		"snapshot-5.bak": 0, "snapshot-": 0, ".snapshot-5-x.tmp": 0, "snapshot-99999999999999999999": 0, "snapshot--1": 0} {
		id, ok := parseSnapshotName(name)
		require.Equal(t, want, id, name)
		require.Equal(t, want != 0, ok, name)
	}
	for p, want := range map[string]bool{"data/a.ndjson": true, "data/.a.ndjson": false, "data/a/b.ndjson": false,
		"data/a.json": false, "x/a.ndjson": false, "data/.ndjson": false, `data/a\b.ndjson`: false, "data/a b.ndjson": false} {
		require.Equal(t, want, validDataPath(p), p)
	}
}

func fuzzSeeds(f *testing.F, encoded ...[]byte) {
	for _, b := range encoded {
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add([]byte(""))
	f.Add([]byte("null"))
	f.Add([]byte("{}"))
	f.Add([]byte(`{"version":1,"id":1,"commitUser":"u","checkpoint":1,"committed":{"u":1},"manifests":null}`))
	f.Add([]byte(`[1,2,3]`))
}

// FuzzSnapshot: the snapshot decoder never panics, names the file in
// every error, and what it accepts re-encodes to itself.
func FuzzSnapshot(f *testing.F) {
	s := testSnapshot()
	b, err := encodeSnapshot(&s)
	require.NoError(f, err)
	s2 := Snapshot{Version: 1, ID: 1, CommitUser: "u", Checkpoint: 1, Manifests: []ManifestRef{}, Committed: map[string]int64{"u": 1}}
	b2, err := encodeSnapshot(&s2)
	require.NoError(f, err)
	fuzzSeeds(f, b, b2)
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeSnapshot("dir/snapshot/snapshot-x", 0, b)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "filetable: dir/snapshot/snapshot-x: ") || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %q does not name the file or wrap ErrCorrupt", err)
			}
			return
		}
		again, err := encodeSnapshot(&s)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
		s2, err := decodeSnapshot("again", s.ID, again)
		if err != nil {
			t.Fatalf("accepted %q, its encoding fails: %v", b, err)
		}
		if s2.Checksum != s.Checksum {
			t.Fatalf("checksum %08x, again %08x", s.Checksum, s2.Checksum)
		}
	})
}

// FuzzManifest: the manifest decoder never panics, names the file in
// every error, and what it accepts re-encodes to itself.
func FuzzManifest(f *testing.F) {
	m := testManifest()
	b, err := encodeManifest(&m)
	require.NoError(f, err)
	empty := manifest{Version: 1, Files: []DataFile{}}
	b2, err := encodeManifest(&empty)
	require.NoError(f, err)
	fuzzSeeds(f, b, b2)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeManifest("dir/manifest/manifest-x.json", b, nil)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "filetable: dir/manifest/manifest-x.json: ") || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %q does not name the file or wrap ErrCorrupt", err)
			}
			return
		}
		ref := refOf("manifest-x.json", m)
		again, err := encodeManifest(&m)
		if err != nil {
			t.Fatalf("accepted %q but cannot encode it: %v", b, err)
		}
		if _, err := decodeManifest("again", again, &ref); err != nil {
			t.Fatalf("accepted %q, its encoding fails: %v", b, err)
		}
	})
}
