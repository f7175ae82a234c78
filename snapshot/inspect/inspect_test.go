package inspect_test

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot/inspect"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
)

type reading struct {
	Device string `msgpack:"d"`
	I      int64  `msgpack:"i"`
}

type total struct {
	Device string `msgpack:"d"`
	I      int64  `msgpack:"i"`
	Sum    int64  `msgpack:"s"`
	Count  int64  `msgpack:"c"`
}

// tally keeps, per device, the sum of the readings (value state), the last
// three readings (list state), the count per parity (map state) and a TTL
// value state; it emits the running totals.
type tally struct {
	sum    *state.ValueState[string, int64]
	last   *state.KeyedListState[string, int64]
	parity *state.MapState[string, bool, int64]
	seen   *state.ValueState[string, int64]
}

var ttl = state.TTLConfig{TTL: time.Hour}

func (t *tally) InitializeState(ctx *graph.Context) error {
	b := graph.KeyedState[string](ctx)
	var err error
	if t.sum, err = state.Value[string, int64](b, "sum"); err != nil {
		return err
	}
	if t.last, err = state.KeyedList[string, int64](b, "last"); err != nil {
		return err
	}
	if t.parity, err = state.Map[string, bool, int64](b, "parity"); err != nil {
		return err
	}
	t.seen, err = state.Value[string, int64](b, "seen", state.WithTTL(ttl))
	return err
}

func (t *tally) Process(ctx *graph.KeyedContext[string], in reading, o graph.Collector[total]) error {
	s, _ := t.sum.Value()
	s += in.I
	t.sum.Update(s)
	l := append(t.last.Get(), in.I)
	if len(l) > 3 {
		l = l[len(l)-3:]
	}
	t.last.Update(l)
	even := in.I%2 == 0
	n, _ := t.parity.Get(even)
	t.parity.Put(even, n+1)
	c, _ := t.seen.Value()
	t.seen.Update(c + 1)
	o.Collect(total{Device: ctx.CurrentKey(), I: in.I, Sum: s, Count: c + 1})
	return nil
}

const devices = 7

// run stops a job with a savepoint after some records and returns the
// savepoint path and the output the savepoint covers (a publishing sink
// commits exactly what it covers).
func run(t *testing.T, p int) (string, []total) {
	dir := t.TempDir()
	mem := sink.NewMemory[total]()
	cfg := graph.Config{Parallelism: p, Logf: t.Logf,
		Checkpoint: graph.CheckpointConfig{Interval: 20 * time.Millisecond, Dir: dir}}
	job := graph.NewJob("inspect", cfg)
	src := graph.Source(job, "source", source.GenerateRate(1_000_000, 20_000, func(i int64) reading {
		return reading{Device: fmt.Sprintf("dev-%d", i%devices), I: i}
	}))
	tallies := graph.ProcessKeyed(graph.KeyBy(src, func(r reading) string { return r.Device }), "tally",
		func() graph.KeyedProcessFunc[string, reading, total] { return &tally{} })
	graph.Sink(tallies, "sink", sink.Publishing[total](mem))
	e, err := job.Start(context.Background())
	require.NoError(t, err)
	for e.Stats().Counts.Completed < 2 {
		time.Sleep(5 * time.Millisecond)
	}
	path, err := e.Stop(context.Background())
	require.NoError(t, err)
	require.NoError(t, e.Wait())
	return path, mem.Published()
}

// expect is the per-device state the output implies.
type expect struct {
	sum, count int64
	last       []int64
	parity     map[bool]int64
}

func expected(out []total) map[string]*expect {
	m := map[string]*expect{}
	for _, o := range out {
		e := m[o.Device]
		if e == nil {
			e = &expect{parity: map[bool]int64{}}
			m[o.Device] = e
		}
		e.sum, e.count = o.Sum, o.Count
		e.last = append(e.last, o.I)
		if len(e.last) > 3 {
			e.last = e.last[len(e.last)-3:]
		}
		e.parity[o.I%2 == 0]++
	}
	return m
}

func TestReadSavepoint(t *testing.T) {
	for _, p := range []int{1, 3} {
		t.Run(fmt.Sprintf("p=%d", p), func(t *testing.T) {
			path, out := run(t, p)
			want := expected(out)
			require.NotEmpty(t, want)

			c, err := inspect.Open(nil, path)
			require.NoError(t, err)
			require.True(t, c.Savepoint())

			ops, err := c.Operators()
			require.NoError(t, err)
			var tallyOp *inspect.Operator
			for i := range ops {
				if ops[i].UID == "tally" {
					tallyOp = &ops[i]
				}
			}
			require.NotNil(t, tallyOp, "operators: %+v", ops)
			require.Equal(t, p, tallyOp.Parallelism)
			require.Len(t, tallyOp.Subtasks, p)
			covered := 0
			for i, s := range tallyOp.Subtasks {
				require.Equal(t, keygroup.RangeFor(tallyOp.MaxParallelism, p, i), s.KeyGroups)
				covered += s.KeyGroups.Len()
			}
			require.Equal(t, tallyOp.MaxParallelism, covered)
			names := map[string]inspect.KeyedState{}
			for _, k := range tallyOp.Keyed {
				names[k.Name] = k
			}
			require.Equal(t, len(want), names["sum"].Entries)
			require.Equal(t, len(want), names["last"].Entries)
			require.Equal(t, "map", names["parity"].Layout.Kind)
			require.True(t, names["seen"].Layout.TTL)
			require.Equal(t, "", names["sum"].Layout.Kind, "a plain value state has no descriptor")

			for dev, w := range want {
				v, ok, err := inspect.Value[string, int64](c, "tally", "sum", dev)
				require.NoError(t, err)
				require.True(t, ok, dev)
				require.Equal(t, w.sum, v, dev)
				l, err := inspect.List[string, int64](c, "tally", "last", dev)
				require.NoError(t, err)
				require.Equal(t, w.last, l, dev)
				m, err := inspect.Map[string, bool, int64](c, "tally", "parity", dev)
				require.NoError(t, err)
				require.Equal(t, w.parity, m, dev)
				n, ok, err := inspect.Value[string, int64](c, "tally", "seen", dev, state.WithTTL(ttl))
				require.NoError(t, err)
				require.True(t, ok)
				require.Equal(t, w.count, n)
			}
			_, ok, err := inspect.Value[string, int64](c, "tally", "sum", "no-such-device")
			require.NoError(t, err)
			require.False(t, ok)

			sums, err := inspect.Values[string, int64](c, "tally", "sum")
			require.NoError(t, err)
			got := map[string]int64{}
			for k, v := range sums {
				got[k] = v
			}
			require.Len(t, got, len(want))
			for dev, w := range want {
				require.Equal(t, w.sum, got[dev])
			}
			entries, err := inspect.MapEntries[string, bool, int64](c, "tally", "parity")
			require.NoError(t, err)
			nEntries := 0
			for k, v := range entries {
				require.Equal(t, want[k.Key].parity[k.UserKey], v)
				nEntries++
			}
			require.Equal(t, names["parity"].Entries, nEntries)

			raw, err := inspect.RawEntries(c, "tally", "seen")
			require.NoError(t, err)
			require.Len(t, raw, len(want))
			for _, r := range raw {
				dev, ok := r.Key.(string)
				require.True(t, ok, "%T", r.Key)
				require.EqualValues(t, want[dev].count, r.Value)
				require.False(t, r.Stamp.IsZero())
				require.Equal(t, keygroup.Of(dev, tallyOp.MaxParallelism), r.KeyGroup)
			}
		})
	}
}

func TestErrorsNameWhatIsMissing(t *testing.T) {
	path, _ := run(t, 1)
	c, err := inspect.Open(nil, filepath.Join(path, "_metadata"))
	require.NoError(t, err)
	_, _, err = inspect.Value[string, int64](c, "nope", "sum", "dev-1")
	require.ErrorContains(t, err, `no operator with uid "nope"`)
	require.ErrorContains(t, err, "tally")
	_, _, err = inspect.Value[string, int64](c, "tally", "summ", "dev-1")
	require.ErrorContains(t, err, `no keyed state "summ"`)
	require.ErrorContains(t, err, "sum")
	_, _, err = inspect.Value[string, int64](c, "source", "sum", "dev-1")
	require.ErrorContains(t, err, "has no keyed state")
	// A TTL state read without its TTL is refused (state S11).
	_, _, err = inspect.Value[string, int64](c, "tally", "seen", "dev-1")
	require.ErrorContains(t, err, "seen")
	// A key of the wrong type fails the restore's key checks.
	_, _, err = inspect.Value[int64, int64](c, "tally", "sum", 1)
	require.Error(t, err)
	_, err = inspect.OperatorList[int64](c, "tally", "nope")
	require.ErrorContains(t, err, `no list state "nope"`)

	_, err = inspect.Open(nil, filepath.Join(t.TempDir(), "chk-1"))
	require.Error(t, err)
	require.Contains(t, err.Error(), "chk-1")
}

func TestSourcePositions(t *testing.T) {
	path, out := run(t, 2)
	c, err := inspect.Open(nil, path)
	require.NoError(t, err)
	op, err := c.Operator("source")
	require.NoError(t, err)
	// Besides its position the source's head keeps its last watermark
	// (internal/runtime/task WatermarkState).
	i := slices.IndexFunc(op.Lists, func(l inspect.ListState) bool { return l.Name == source.OffsetState })
	require.GreaterOrEqual(t, i, 0, "the generator keeps its position in list state: %+v", op.Lists)
	items, err := inspect.RawOperatorList(c, "source", source.OffsetState)
	require.NoError(t, err)
	require.Len(t, items, op.Lists[i].Items)
	// The positions account for exactly the records the savepoint covers:
	// split s of S holds the ids s, s+S, ... (source SRC5).
	var read int64
	for _, it := range items {
		m := it.Value.(map[string]any)
		next, split, splits := toInt(m["next"]), toInt(m["split"]), toInt(m["splits"])
		read += (next - split) / splits
	}
	require.Equal(t, int64(len(out)), read)
	t.Logf("source positions %s: %+v (output %d records)", op.Lists[i].Name, items, len(out))
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case nil:
		return 0 // omitted when zero
	case int8:
		return int64(x)
	case int16:
		return int64(x)
	case int32:
		return int64(x)
	case int64:
		return x
	case uint8:
		return int64(x)
	case uint16:
		return int64(x)
	case uint32:
		return int64(x)
	case uint64:
		return int64(x)
	}
	panic(fmt.Sprintf("not an integer: %T", v))
}
