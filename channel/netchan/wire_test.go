package netchan

import (
	"reflect"
	"testing"
	"time"

	"github.com/snapflow/snapflow/marker"
)

// TestWireRoundTrip encodes a frame of every kind and decodes it back;
// every truncation of an encoding is refused.
func TestWireRoundTrip(t *testing.T) {
	frames := []frame{
		{kind: kindOpen, attempt: 7, role: roleReceiver, id: ChannelID{From: "map", To: "sink", Edge: 2, FromSubtask: 3, ToSubtask: 129}},
		{kind: kindData, attempt: 7, seq: 1 << 40, payload: []byte{1, 2, 3, 0xff}},
		{kind: kindEvent, attempt: -1, seq: 3, event: marker.NewBarrier(marker.Barrier{ID: 9, Timestamp: -5,
			Options: marker.Options{Kind: marker.Savepoint, Mode: marker.Unaligned, Stop: true, AlignedTimeout: time.Second}})},
		{kind: kindEvent, attempt: 1, seq: 4, event: marker.NewWatermark(marker.MinWatermark)},
		{kind: kindEvent, attempt: 1, seq: 5, event: marker.EndOfInput},
		{kind: kindCredit, attempt: 1, credit: 12},
	}
	var c wireCodec
	for _, f := range frames {
		b, err := c.Marshal(&f)
		if err != nil {
			t.Fatal(err)
		}
		var got frame
		if err := c.Unmarshal(b, &got); err != nil {
			t.Fatalf("%+v: %v", f, err)
		}
		if !reflect.DeepEqual(got, f) {
			t.Errorf("round trip of %+v gave %+v", f, got)
		}
		for n := range len(b) {
			if f.kind == kindData && n >= len(b)-len(f.payload) {
				break // a shorter payload is a payload
			}
			if err := c.Unmarshal(b[:n], &got); err == nil {
				t.Errorf("%d of %d bytes of %+v decoded as %+v", n, len(b), f, got)
			}
		}
		if err := c.Unmarshal(append(b[:len(b):len(b)], 0), &got); err == nil && f.kind != kindData {
			t.Errorf("%+v with a trailing byte decoded", f)
		}
	}
}

// TestMsgpackCodec: records round-trip, structs as arrays of their fields
// (the encoding of a buffer of channel state), and a short payload is
// refused.
func TestMsgpackCodec(t *testing.T) {
	type rec struct {
		ID   int64
		Name string
	}
	var c MsgpackCodec[rec]
	recs := []rec{{1, "a"}, {-2, "bc"}}
	b, err := c.AppendRecords([]byte{0xAA}, recs)
	if err != nil {
		t.Fatal(err)
	}
	// After the prefix: fixarray(2), then each record as fixarray(2) of
	// int64 (msgpack's encoder writes int64 at full width, as channel
	// state does) and fixstr.
	want := []byte{0xAA, 0x92,
		0x92, 0xd3, 0, 0, 0, 0, 0, 0, 0, 1, 0xa1, 'a',
		0x92, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xa2, 'b', 'c'}
	if !reflect.DeepEqual(b, want) {
		t.Errorf("encoded % x, want % x", b, want)
	}
	got, err := c.DecodeRecords(b[1:], make([]rec, 0, 4))
	if err != nil || !reflect.DeepEqual(got, recs) {
		t.Errorf("decoded %v, %v", got, err)
	}
	if _, err := c.DecodeRecords(b[1:len(b)-1], nil); err == nil {
		t.Error("a truncated buffer decoded")
	}
}
