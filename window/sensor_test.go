package window_test

import (
	"cmp"
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/window"
)

// The sensor-network readings of cmd/snapdemo (see the NOTICE there: data
// by Suthaharan et al. 2010, CC BY 4.0). The CSV has no timestamp column:
// a mote takes a reading every 5 seconds, so a reading's event time is
// its `reading` number × 5 s (from the Unix epoch). The test feeds the
// readings in event-time order (by reading, then mote), as the motes
// would report them live.
const sensorCSV = "../cmd/snapdemo/data/sensor-network/data.csv"

const readingEvery = 5 * time.Second

type reading struct {
	Mote    int64 `msgpack:"m"`
	Reading int64 `msgpack:"r"`
	// MilliC is the temperature in thousandths of °C (the CSV has two
	// decimals), so sums are exact.
	MilliC int64 `msgpack:"t"`
}

func (r reading) time() int64 { return r.Reading * int64(readingEvery) }

func loadReadings(t *testing.T) []reading {
	t.Helper()
	f, err := os.Open(sensorCSV)
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Equal(t, []string{"reading", "mote_id", "indoor", "humidity", "temperature", "label"}, rows[0])
	var rs []reading
	for _, row := range rows[1:] {
		n, err1 := strconv.ParseInt(row[0], 10, 64)
		m, err2 := strconv.ParseInt(row[1], 10, 64)
		whole, frac, _ := strings.Cut(row[4], ".")
		frac = (frac + "000")[:3]
		w, err3 := strconv.ParseInt(whole, 10, 64)
		fr, err4 := strconv.ParseInt(frac, 10, 64)
		require.NoError(t, cmp.Or(err1, err2, err3, err4), "row %v", row)
		rs = append(rs, reading{Mote: m, Reading: n, MilliC: w*1000 + fr})
	}
	slices.SortStableFunc(rs, func(a, b reading) int { return cmp.Or(cmp.Compare(a.Reading, b.Reading), cmp.Compare(a.Mote, b.Mote)) })
	return rs
}

// meanTemp averages the temperature (°C) of a window.
type meanTemp struct{}

type sumCount struct {
	Sum int64 `msgpack:"s"`
	N   int64 `msgpack:"n"`
}

func (meanTemp) CreateAccumulator() sumCount { return sumCount{} }
func (meanTemp) Add(r reading, a sumCount) sumCount {
	return sumCount{a.Sum + r.MilliC, a.N + 1}
}
func (meanTemp) GetResult(a sumCount) float64 { return float64(a.Sum) / float64(a.N) / 1000 }
func (meanTemp) Merge(a, b sumCount) sumCount { return sumCount{a.Sum + b.Sum, a.N + b.N} }

// warmSpell describes a session of warm readings of a mote.
type warmSpell struct {
	Mote      int64         `msgpack:"m"`
	W         window.Window `msgpack:"w"`
	First     int64         `msgpack:"f"` // reading numbers
	Last      int64         `msgpack:"l"`
	N         int64         `msgpack:"n"`
	MaxMilliC int64         `msgpack:"x"`
}

type spells struct{}

func (spells) Process(ctx *window.Context[int64], rs []reading, out graph.Collector[warmSpell]) error {
	s := warmSpell{Mote: ctx.CurrentKey(), W: ctx.Window, First: rs[0].Reading, Last: rs[0].Reading, N: int64(len(rs))}
	for _, r := range rs {
		s.First, s.Last, s.MaxMilliC = min(s.First, r.Reading), max(s.Last, r.Reading), max(s.MaxMilliC, r.MilliC)
	}
	out.Collect(s)
	return nil
}

const warm = 28_000 // milli-°C

// TestSensorNetwork: per-mote one-minute tumbling mean temperatures and
// sessions of warm readings (at least 28 °C, a gap of a minute ending
// one) over the sensor-network data, on the heap and in Pebble with
// checkpoints, equal a plain computation over the same readings.
func TestSensorNetwork(t *testing.T) {
	rs := loadReadings(t)
	require.Len(t, rs, 18_914)
	type mk struct{ mote, minute int64 }
	sums := map[mk]sumCount{}
	for _, r := range rs {
		k := mk{r.Mote, r.time() / int64(time.Minute)}
		s := sums[k]
		sums[k] = sumCount{s.Sum + r.MilliC, s.N + 1}
	}
	wantMeans := map[mk]float64{}
	for k, s := range sums {
		wantMeans[k] = float64(s.Sum) / float64(s.N) / 1000
	}
	gap := time.Minute
	var wantSpells []warmSpell
	byMote := map[int64][]reading{}
	for _, r := range rs {
		if r.MilliC >= warm {
			byMote[r.Mote] = append(byMote[r.Mote], r)
		}
	}
	for m, ws := range byMote {
		cur := warmSpell{Mote: m, First: ws[0].Reading}
		for i, r := range ws {
			if i > 0 && r.time()-ws[i-1].time() > int64(gap) {
				cur.W = window.Window{Start: readingAt(cur.First), End: readingAt(cur.Last) + int64(gap)}
				wantSpells = append(wantSpells, cur)
				cur = warmSpell{Mote: m, First: r.Reading}
			}
			cur.Last, cur.N, cur.MaxMilliC = r.Reading, cur.N+1, max(cur.MaxMilliC, r.MilliC)
		}
		cur.W = window.Window{Start: readingAt(cur.First), End: readingAt(cur.Last) + int64(gap)}
		wantSpells = append(wantSpells, cur)
	}
	bySpell := func(a, b warmSpell) int { return cmp.Or(cmp.Compare(a.Mote, b.Mote), cmp.Compare(a.First, b.First)) }
	slices.SortFunc(wantSpells, bySpell)
	require.GreaterOrEqual(t, len(wantSpells), 10, "the data has warm spells")

	for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
		t.Run(backend.String(), func(t *testing.T) {
			j := graph.NewJob("sensors", graph.Config{Parallelism: 2, Logf: t.Logf,
				State:      graph.StateConfig{Backend: backend, Pebble: state.PebbleEngine{Dir: t.TempDir()}},
				Checkpoint: graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: t.TempDir()}})
			ts := func(r reading) int64 { return r.time() }
			src := graph.Source(j, "readings", source.Generate(int64(len(rs)), func(i int64) reading { return rs[i] }),
				graph.Watermarks(graph.WatermarkStrategy[reading]{Timestamp: ts, OutOfOrderness: readingEvery, Interval: time.Millisecond}))
			byMoteKey := func(r reading) int64 { return r.Mote }
			means := window.Aggregate(graph.KeyBy(src, byMoteKey), "minute-means",
				window.Spec[reading]{Assigner: window.TumblingEventTime(time.Minute), Timestamp: ts},
				state.AggregateFunction[reading, sumCount, float64](meanTemp{}))
			warmOnes := graph.Filter(src, "warm", func(r reading) bool { return r.MilliC >= warm })
			sessions := window.Process(graph.KeyBy(warmOnes, byMoteKey), "warm-spells",
				window.Spec[reading]{Assigner: window.EventTimeSession(gap), Timestamp: ts},
				func() window.ProcessFunc[int64, reading, warmSpell] { return spells{} })
			gotMeans, gotSpells := sink.NewMemory[window.Result[int64, float64]](), sink.NewMemory[warmSpell]()
			graph.Sink(means, "means", sink.Publishing[window.Result[int64, float64]](gotMeans))
			graph.Sink(sessions, "spells", sink.Publishing[warmSpell](gotSpells))
			require.NoError(t, j.Run(context.Background()))

			got := map[mk]float64{}
			for _, r := range gotMeans.Published() {
				require.Equal(t, int64(time.Minute), r.Window.End-r.Window.Start)
				k := mk{r.Key, r.Window.Start / int64(time.Minute)}
				_, dup := got[k]
				require.False(t, dup, "minute %v of mote %d twice", r.Window, r.Key)
				require.Equal(t, sums[k].N, r.Count)
				got[k] = r.Value
			}
			require.Equal(t, wantMeans, got)
			sp := gotSpells.Published()
			slices.SortFunc(sp, bySpell)
			require.Equal(t, wantSpells, sp, fmt.Sprintf("%d spells, want %d", len(sp), len(wantSpells)))
		})
	}
}

func readingAt(n int64) int64 { return n * int64(readingEvery) }
