package objstore

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

func TestRecordRoundTripAndDamage(t *testing.T) {
	recs := []Record{
		{ID: 0, Kind: marker.Checkpoint, Dir: "chk-0"},
		{ID: 7, Kind: marker.Savepoint, Stop: true, TriggerTime: -5, Dir: "savepoint-7", ExecutionID: "exec", MetadataSize: 1 << 40, MetadataCRC: 0xdeadbeef},
	}
	for _, r := range recs {
		b, err := EncodeRecord(r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeRecord(RecordName(r.ID), b)
		if err != nil || got != r {
			t.Fatalf("round trip of %+v: %+v, %v", r, got, err)
		}
		// Every flipped bit and every truncation is refused.
		for i := range len(b) * 8 {
			c := bytes.Clone(b)
			c[i/8] ^= 1 << (i % 8)
			if _, err := DecodeRecord(RecordName(r.ID), c); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("bit %d flipped: %v", i, err)
			}
		}
		for n := range len(b) {
			if _, err := DecodeRecord(RecordName(r.ID), b[:n]); !errors.Is(err, checkpoint.ErrCorrupt) {
				t.Fatalf("truncated to %d: %v", n, err)
			}
		}
		// A record under another id's name is refused (a swapped object).
		if _, err := DecodeRecord(RecordName(r.ID+1), b); !errors.Is(err, checkpoint.ErrCorrupt) {
			t.Fatalf("misnamed record: %v", err)
		}
	}
	for _, bad := range []Record{
		{ID: -1, Kind: marker.Checkpoint, Dir: "chk-1"},
		{ID: 1, Kind: marker.Kind(9), Dir: "chk-1"},
		{ID: 1, Kind: marker.Checkpoint, Stop: true, Dir: "chk-1"},
		{ID: 1, Kind: marker.Checkpoint, Dir: "../chk-1"},
		{ID: 1, Kind: marker.Checkpoint},
	} {
		if _, err := EncodeRecord(bad); !errors.Is(err, checkpoint.ErrInvalid) {
			t.Errorf("EncodeRecord(%+v): %v, want ErrInvalid", bad, err)
		}
	}
}

// FuzzDecodeRecord: decoding never panics, refuses what it cannot
// read with ErrCorrupt or ErrUnsupportedVersion, and is canonical: what
// it accepts encodes back to the same bytes (OS3). With fixCRC the
// fuzzer's bytes get a valid checksum, so that it reaches the fields.
func FuzzDecodeRecord(f *testing.F) {
	for _, r := range []Record{
		{ID: 3, Kind: marker.Checkpoint, Dir: "chk-3", ExecutionID: "e"},
		{ID: 12, Kind: marker.Savepoint, Stop: true, Dir: "savepoint-12", MetadataSize: 99, MetadataCRC: 1},
	} {
		b, err := EncodeRecord(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(RecordName(r.ID), b, false)
		f.Add(RecordName(r.ID), b, true)
	}
	f.Fuzz(func(t *testing.T, name string, b []byte, fixCRC bool) {
		if fixCRC && len(b) >= 4 {
			// Past the checksum: the fields themselves.
			end := len(b) - 4
			b = binary.BigEndian.AppendUint32(b[:end:end], crc32.Checksum(b[:end], castagnoli))
		}
		r, err := DecodeRecord(name, b)
		if err != nil {
			if !errors.Is(err, checkpoint.ErrCorrupt) && !errors.Is(err, checkpoint.ErrUnsupportedVersion) {
				t.Fatalf("error %v wraps neither ErrCorrupt nor ErrUnsupportedVersion", err)
			}
			return
		}
		again, err := EncodeRecord(r)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", r, err)
		}
		if !bytes.Equal(again, b) {
			t.Fatalf("not canonical: %x decodes to %+v, which encodes to %x", b, r, again)
		}
		if name != RecordName(r.ID) {
			t.Fatalf("record of %d accepted under the name %q", r.ID, name)
		}
	})
}
