package sink_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source"
)

// failOnce fails the job once, at record 600; the restart replays the
// input from the last completed checkpoint.
type failOnce struct{ failed *atomic.Bool }

func (f failOnce) Process(_ *graph.Context, i int64, out graph.Collector[int64]) error {
	if i == 600 && f.failed.CompareAndSwap(false, true) {
		return errors.New("injected failure")
	}
	out.Collect(i)
	return nil
}

// Publishing buffers each checkpoint's records and hands them to the
// Committer once the checkpoint completed: a job that fails and restarts
// still publishes every record exactly once.
func ExamplePublishing() {
	dir, _ := os.MkdirTemp("", "publishing")
	defer os.RemoveAll(dir)

	job := graph.NewJob("exactly-once", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: dir},
		Restart:     graph.FixedDelay(3, 10*time.Millisecond),
	})
	var failed atomic.Bool
	ids := graph.Source(job, "ids", source.GenerateRate(1000, 20000, func(i int64) int64 { return i }))
	passed := graph.Process(ids, "fail-once", func() graph.ProcessFunc[int64, int64] { return failOnce{&failed} })
	published := sink.NewMemory[int64]()
	graph.Sink(passed, "publish", sink.Publishing[int64](published))

	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	got := published.Published()
	slices.Sort(got)
	fmt.Println("failed once:", failed.Load())
	distinct := len(slices.Compact(slices.Clone(got)))
	fmt.Println("published:", len(got), "distinct:", distinct, "from", got[0], "to", got[len(got)-1])
	// Output:
	// failed once: true
	// published: 1000 distinct: 1000 from 0 to 999
}

// store is a toy transactional store: transactions stage records,
// pre-commit makes them durable, commit publishes them.
type store struct {
	mu        sync.Mutex
	staged    map[string][]string
	published []string
}

// storeTxn is the handle of one transaction: its name, unique per sink,
// subtask and attempt, is the transaction's identity in the store.
type storeTxn struct {
	s    *store
	name string
}

func (s *store) Begin(id sink.TxnID) (storeTxn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staged[id.Name()] = nil
	return storeTxn{s, id.Name()}, nil
}

func (s *store) Write(t storeTxn, rec string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.staged[t.name] = append(s.staged[t.name], rec)
	return nil
}

// PreCommit would flush and fsync a real store's transaction.
func (s *store) PreCommit(storeTxn, int64) error { return nil }

// Commit publishes a staged transaction; one that is gone (committed or
// aborted before) is left alone, so Commit is idempotent.
func (s *store) Commit(t storeTxn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	recs, ok := s.staged[t.name]
	if ok {
		s.published = append(s.published, recs...)
		delete(s.staged, t.name)
	}
	return nil
}

func (s *store) Abort(t storeTxn) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.staged, t.name)
	return nil
}

func (s *store) RecoverAndCommit(t storeTxn) error { return s.Commit(t) }
func (s *store) RecoverAndAbort(t storeTxn) error  { return s.Abort(t) }

// TwoPhaseCommit drives a transactional store: a transaction per
// checkpoint and subtask, pre-committed at the checkpoint's barrier and
// committed when the checkpoint completes.
func ExampleTwoPhaseCommit() {
	dir, _ := os.MkdirTemp("", "twophase")
	defer os.RemoveAll(dir)

	st := &store{staged: map[string][]string{}}
	job := graph.NewJob("to-store", graph.Config{
		Checkpoint: graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	words := graph.Source(job, "words", source.Slice([]string{"one", "two", "three"}))
	graph.Sink(words, "store", sink.TwoPhaseCommit[string, storeTxn](st))
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(st.published, len(st.staged))
	// Output: [one two three] 0
}

// batchWriter is one writer subtask of a WriteAndCommit sink: it collects
// records, and Prepare hands them on as one committable.
type batchWriter struct{ recs []string }

func (w *batchWriter) Write(rec string) error { w.recs = append(w.recs, rec); return nil }

func (w *batchWriter) Prepare(int64) ([][]string, error) {
	if len(w.recs) == 0 {
		return nil, nil
	}
	batch := w.recs
	w.recs = nil
	return [][]string{batch}, nil
}

func (w *batchWriter) Close() error { return nil }

// table is the global committer: it publishes the batches of a
// checkpoint together and remembers the newest checkpoint of each commit
// user, its idempotency key.
type table struct {
	rows   []string
	latest map[string]int64
}

func (t *table) LatestCommitted(user string) (int64, bool, error) {
	c, ok := t.latest[user]
	return c, ok, nil
}

func (t *table) Commit(user string, checkpoint int64, batches [][]string) error {
	if c, ok := t.latest[user]; ok && checkpoint <= c {
		return fmt.Errorf("table: commit %s/%d: %w", user, checkpoint, sink.ErrCommitted)
	}
	for _, b := range batches {
		t.rows = append(t.rows, b...)
	}
	t.latest[user] = checkpoint
	return nil
}

// WriteAndCommit splits a sink into parallel writers and one committer
// that publishes everything a checkpoint wrote in one commit (the file
// table's topology: writers write data files, the committer publishes a
// snapshot).
func ExampleWriteAndCommit() {
	dir, _ := os.MkdirTemp("", "writeandcommit")
	defer os.RemoveAll(dir)

	tbl := &table{latest: map[string]int64{}}
	job := graph.NewJob("to-table", graph.Config{
		Parallelism: 2,
		Checkpoint:  graph.CheckpointConfig{Interval: 10 * time.Millisecond, Dir: dir},
	})
	words := graph.Source(job, "words", source.Slice([]string{"a", "b", "c", "d", "e"}))
	sink.WriteAndCommit(words, "table",
		func(graph.TaskInfo) (sink.Writer[string, []string], error) { return &batchWriter{}, nil }, tbl)
	if err := job.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}
	slices.Sort(tbl.rows)
	fmt.Println(tbl.rows, "commit users:", len(tbl.latest))
	// Output: [a b c d e] commit users: 1
}
