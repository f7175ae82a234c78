package state_test

import (
	"encoding/hex"
	"flag"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

var rewriteGolden = flag.Bool("rewrite-golden", false, "rewrite testdata/keyed_snapshot.golden")

type goldenKey struct {
	Site string
	ID   int
}

type goldenVal struct {
	Name  string
	Temp  float64
	Flags []bool
	At    time.Time
}

// goldenFixture fills a backend through the public API only, with every
// kind of state: copy-on-write values, values encoded at freeze (they hold
// slices), lists, deletes, and restored state carried over unregistered.
func goldenFixture(t testing.TB) []checkpoint.KeyGroupState {
	const maxP = 128
	r := keygroup.Range{Start: 0, End: maxP - 1}
	mk := func(restored []checkpoint.KeyGroupState) *state.KeyedBackend[string] {
		b, err := state.NewKeyedBackend[string](r, maxP, checkpoint.Groups(restored))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	set := func(b *state.KeyedBackend[string], k string) { b.SetCurrentKey(k, keygroup.Of(k, maxP)) }
	// A state restored and never registered: carried over (S3).
	pre := mk(nil)
	old, err := state.Value[string, int64](pre, "carried")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		set(pre, fmt.Sprint("c", i))
		old.Update(int64(i) * math.MaxInt32)
	}
	carried, err := pre.Snapshot()
	if err != nil {
		t.Fatal(err)
	}

	b := mk(carried)
	counts, err := state.Value[string, int](b, "count")
	if err != nil {
		t.Fatal(err)
	}
	vals, err := state.Value[string, goldenVal](b, "vals")
	if err != nil {
		t.Fatal(err)
	}
	lists, err := state.KeyedList[string, float32](b, "list")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1200 {
		k := fmt.Sprint("key-", i*7919%1009)
		set(b, k)
		n, _ := counts.Value()
		counts.Update(n + i)
		if i%3 == 0 {
			vals.Update(goldenVal{Name: strings.Repeat("x", i%40), Temp: float64(i) / 7, Flags: []bool{i%2 == 0}, At: time.Unix(int64(i), 0).UTC()})
		}
		if i%5 == 0 {
			lists.Add(float32(i) / 3)
			lists.AddAll(1, float32(math.Inf(1)))
		}
		if i%11 == 0 {
			counts.Clear()
		}
		if i%13 == 0 {
			lists.Clear()
		}
	}
	snap, err := b.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

func dumpSnapshot(snap []checkpoint.KeyGroupState) string {
	var sb strings.Builder
	for _, g := range snap {
		fmt.Fprintf(&sb, "%s %d %d\n", g.State, g.KeyGroup, len(g.Entries))
		for _, e := range g.Entries {
			fmt.Fprintf(&sb, "  %s %s\n", hex.EncodeToString(e.Key), hex.EncodeToString(e.Value))
		}
	}
	return sb.String()
}

// TestKeyedSnapshotGolden pins the snapshot bytes (S1). The golden file was
// written by the map-based backend that preceded the copy-on-write one, so
// the encoding is unchanged by it and restore decodes it as before.
func TestKeyedSnapshotGolden(t *testing.T) {
	got := dumpSnapshot(goldenFixture(t))
	const path = "testdata/keyed_snapshot.golden"
	if *rewriteGolden {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("the snapshot encoding changed (S1); %d bytes, want %d", len(got), len(want))
	}
}
