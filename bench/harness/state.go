package harness

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

// The keyed-state scenario: state of a given size built by a keyed job,
// checkpointed, updated in part (an incremental checkpoint), restored and
// restored at another parallelism; on the heap, in Pebble, and in raw
// Pebble (the same keys and values written by hand, for reference).

// stateValueSize is the size of each key's value.
const stateValueSize = 1024

// stateRun is what one run of the keyed-state job measured.
type stateRun struct {
	dur time.Duration
	// restore is from Start until every keyed subtask's InitializeState
	// ran, after its backend restored.
	restore time.Duration
	// ckMs, stored and size are the final checkpoint's end-to-end duration
	// and its stored and full sizes.
	ckMs         float64
	stored, size float64
	peak         uint64
	checkpointed bool
}

// stateJob runs the keyed-state job once: its source (uid src) emits the
// keys [lo, hi), and the keyed operator stores a fresh value of
// stateValueSize bytes under each; with check, every key must already have
// a value (restored). The job restores the latest checkpoint of dir, if
// any, leaving out the state of the earlier runs' sources.
func stateJob(ctx context.Context, name string, cfg graph.Config, src string, lo, hi int64, check bool) (stateRun, error) {
	var run stateRun
	var mu sync.Mutex
	var lastInit time.Time
	j := graph.NewJob(name, cfg)
	keys := graph.Source(j, src, source.Generate(hi-lo, func(i int64) int64 { return lo + i }))
	vals := graph.ProcessKeyed(graph.KeyBy(keys, func(k int64) int64 { return k }), "store",
		func() graph.KeyedProcessFunc[int64, int64, int64] {
			return &storeValue{check: check, initialized: func() {
				mu.Lock()
				lastInit = time.Now()
				mu.Unlock()
			}}
		})
	graph.Sink(vals, "discard", func() graph.SinkFunc[int64] { return discard{} })
	s, err := measure(func() error {
		start := time.Now()
		x, err := j.Start(ctx)
		if err != nil {
			return err
		}
		err = x.Wait()
		mu.Lock()
		run.restore = lastInit.Sub(start)
		mu.Unlock()
		cks := completed(x.Stats())
		if len(cks) > 0 {
			last := cks[len(cks)-1]
			run.checkpointed = true
			run.ckMs, run.stored, run.size = ms(last.EndToEnd), float64(last.StoredSize), float64(last.StateSize)
		}
		return err
	})
	run.dur, run.peak = s.dur, s.peak
	return run, err
}

// storeValue stores a value per key.
type storeValue struct {
	v           *state.ValueState[int64, []byte]
	check       bool
	initialized func()
}

func (s *storeValue) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, []byte](graph.KeyedState[int64](ctx), "value")
	s.v = v
	s.initialized()
	return err
}

func (s *storeValue) Process(ctx *graph.KeyedContext[int64], k int64, out graph.Collector[int64]) error {
	if s.check {
		if old, ok := s.v.Value(); !ok || len(old) != stateValueSize {
			return fmt.Errorf("key %d: no restored value (%d bytes)", k, len(old))
		}
	}
	s.v.Update(stateValue(k))
	out.Collect(k)
	return nil
}

// stateValue is key k's value: stateValueSize pseudo-random bytes (so
// that Pebble's compression does not shrink the state below its size).
func stateValue(k int64) []byte {
	b := make([]byte, stateValueSize)
	x := uint64(k)*0x9e3779b97f4a7c15 + 1
	for i := 0; i < len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	return b
}

type discard struct{}

func (discard) Write(*graph.Context, int64) error { return nil }

func runState(ctx context.Context, r *runner, sc *Scenario) error {
	var vs variants
	for round := range r.cfg.Repeat {
		for _, size := range r.sz.state {
			keys := size / stateValueSize
			cs := mibLabel(size)
			for _, backend := range []graph.StateBackend{graph.HeapState, graph.PebbleState} {
				if err := r.stateRound(ctx, &vs, cs, keys, backend); err != nil {
					vs.get(cs, backend.String()).fail(round, "%v", err)
				}
			}
			if err := r.rawPebbleRound(&vs, cs, keys); err != nil {
				vs.get(cs, "raw-pebble").fail(round, "%v", err)
			}
			// The ratio: the engine's Pebble build rate over raw Pebble's,
			// same round.
			eng, raw := vs.get(cs, graph.PebbleState.String()), vs.get(cs, "raw-pebble")
			if len(eng.rates) == round+1 && len(raw.rates) == round+1 {
				eng.addRatio(eng.rates[round]/raw.rates[round], "engine (Pebble) / raw Pebble records/s while building")
			}
		}
		r.logf("state: round %d done", round+1)
	}
	sc.Results = vs.results()
	sc.Notes = append(sc.Notes, fmt.Sprintf("Records/s is the build run: every key written once (%d-byte values), "+
		"then the final checkpoint. `update 1%%` rewrites 1 %% of the keys after a restore: its checkpoint is incremental "+
		"in Pebble (stored < full), whole on the heap. Restore and rescale: from Start until every keyed subtask "+
		"initialized its state, at p=2 and from p=2 to p=3. Raw Pebble: batches of 1,000 Sets without the engine, "+
		"then Flush and Checkpoint (its `checkpoint ms`), and pebble.Open of that checkpoint (its `restore ms`).", stateValueSize))
	return nil
}

// stateRound runs the three runs of the keyed-state job on one backend:
// build (p=2), update 1 % after a restore (p=2), rescale (p=2 -> 3).
func (r *runner) stateRound(ctx context.Context, vs *variants, cs string, keys int64, backend graph.StateBackend) error {
	dir, err := r.checkpointDir()
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := graph.Config{
		Parallelism: 2,
		// Only the final checkpoint at the end of each run.
		Checkpoint: graph.CheckpointConfig{Interval: time.Hour, Dir: dir},
		State:      graph.StateConfig{Backend: backend},
		Restore:    graph.RestoreConfig{Latest: true, AllowNonRestoredState: true},
		Logf:       quiet,
	}
	if backend == graph.PebbleState {
		cfg.State.Pebble = state.PebbleEngine{Dir: filepath.Join(dir, "pebble-work")}
		if err := os.MkdirAll(cfg.State.Pebble.Dir, 0o755); err != nil {
			return err
		}
	}
	v := vs.get(cs, backend.String())
	v.res.Params = map[string]string{"keys": fmt.Sprint(keys), "value_bytes": fmt.Sprint(stateValueSize)}
	build, err := stateJob(ctx, "bench-state", cfg, "build", 0, keys, false)
	if err != nil {
		return fmt.Errorf("build: %w", err)
	}
	if !build.checkpointed {
		return fmt.Errorf("build: no final checkpoint")
	}
	v.addRate(keys, sample{dur: build.dur, peak: build.peak})
	v.addFigure("full checkpoint ms", build.ckMs)
	v.addFigure("full checkpoint stored bytes", build.stored)
	part := max(keys/100, 1)
	upd, err := stateJob(ctx, "bench-state", cfg, "update", 0, part, true)
	if err != nil {
		return fmt.Errorf("update: %w", err)
	}
	v.addFigure("restore ms", ms(upd.restore))
	v.addFigure("update 1% checkpoint ms", upd.ckMs)
	v.addFigure("update 1% checkpoint stored bytes", upd.stored)
	v.addFigure("update 1% checkpoint full bytes", upd.size)
	cfg.Parallelism = 3
	resc, err := stateJob(ctx, "bench-state", cfg, "rescale", part, min(2*part, keys), true)
	if err != nil {
		return fmt.Errorf("rescale: %w", err)
	}
	v.addFigure("rescale 2->3 restore ms", ms(resc.restore))
	return nil
}

// rawPebbleRound writes the same keys and values into a Pebble instance by
// hand, takes a checkpoint of it and opens that.
func (r *runner) rawPebbleRound(vs *variants, cs string, keys int64) error {
	dir, err := os.MkdirTemp(r.tmp, "raw-pebble-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	v := vs.get(cs, "raw-pebble")
	var ckMs float64
	s, err := measure(func() error {
		db, err := pebble.Open(filepath.Join(dir, "db"), &pebble.Options{Logger: quietPebble{}})
		if err != nil {
			return err
		}
		defer db.Close()
		b := db.NewBatch()
		var key [8]byte
		for k := range keys {
			binary.BigEndian.PutUint64(key[:], uint64(k))
			if err := b.Set(key[:], stateValue(k), nil); err != nil {
				return err
			}
			if b.Count() == 1000 {
				if err := b.Commit(pebble.NoSync); err != nil {
					return err
				}
				b = db.NewBatch()
			}
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			return err
		}
		t := time.Now()
		if err := db.Flush(); err != nil {
			return err
		}
		if err := db.Checkpoint(filepath.Join(dir, "chk")); err != nil {
			return err
		}
		ckMs = ms(time.Since(t))
		return nil
	})
	if err != nil {
		return err
	}
	v.res.Params = map[string]string{"keys": fmt.Sprint(keys), "value_bytes": fmt.Sprint(stateValueSize)}
	v.addRate(keys, s)
	v.addFigure("full checkpoint ms", ckMs)
	t := time.Now()
	db, err := pebble.Open(filepath.Join(dir, "chk"), &pebble.Options{Logger: quietPebble{}})
	if err != nil {
		return err
	}
	_, closer, err := db.Get([]byte{0, 0, 0, 0, 0, 0, 0, 0})
	if err == nil {
		closer.Close()
	}
	v.addFigure("restore ms", ms(time.Since(t)))
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

// quietPebble drops raw Pebble's informational logs.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)         {}
func (quietPebble) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, "pebble: "+f+"\n", args...) }
func (quietPebble) Fatalf(f string, args ...any) { panic(fmt.Sprintf("pebble: "+f, args...)) }

func mibLabel(b int64) string {
	if b >= 1<<30 {
		return fmt.Sprintf("%d GiB state", b>>30)
	}
	return fmt.Sprintf("%d MiB state", b>>20)
}
