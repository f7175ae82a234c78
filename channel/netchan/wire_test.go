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
