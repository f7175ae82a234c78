// Package nettest runs jobs in parts (graph/internal/parts), as worker
// processes would, on loopback in one process: each part has its own
// data-plane server, and the channels between parts are network channels
// (package channel/netchan). It is a package of its own so that it
// compiles without graph's large external test package.
package nettest

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/snapflow/snapflow/channel/netchan"
	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/graph/internal/parts"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"github.com/snapflow/snapflow/internal/testsupport/s3test"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

var seedFlag = flag.Uint64("nettest.seed", 0, "seed of the randomized tests (0: from the clock)")

type rec struct {
	Key int64 `msgpack:"k"`
	I   int64 `msgpack:"i"`
}

type out struct {
	Key int64 `msgpack:"k"`
	I   int64 `msgpack:"i"`
	Sum int64 `msgpack:"s"`
}

const numKeys = 100

// failingSource reads record i = rec{i % numKeys, i} (source.Indexed, as
// source.Generate). In the first attempt it fails at record failAt of its
// subtasks (counted over all) once a checkpoint completed that it took
// after reading records (so the restore has state to restore), and a
// subtask that reached the end of its input before waits there, idle,
// until one completed, then fails: the failure always follows such a
// checkpoint, however slow the machine (no first attempt ends before
// one). It gives up a minute after its end of input.
type failingSource struct {
	*source.Indexed[rec]
	failAt int64
	seen   *atomic.Int64
	fired  *atomic.Bool
	// replayed counts the records read after the restart: fewer than the
	// input once the restore skipped what its checkpoint covers.
	replayed  *atomic.Int64
	completed atomic.Bool
	idleSince time.Time
	// own counts the records this subtask read; read are the
	// checkpoints it took after reading some.
	own  int64
	read map[int64]bool
}

func (s *failingSource) SnapshotState(ctx *graph.SnapshotContext) error {
	if s.own > 0 {
		if s.read == nil {
			s.read = map[int64]bool{}
		}
		s.read[ctx.CheckpointID] = true
	}
	return s.Indexed.SnapshotState(ctx)
}

func (s *failingSource) NotifyCheckpointComplete(id int64) error {
	if s.read[id] {
		s.completed.Store(true)
	}
	return nil
}

func (s *failingSource) NotifyCheckpointAborted(int64) error { return nil }

func (s *failingSource) Next(ctx *graph.Context) (rec, error) {
	first := ctx.Task().Attempt == 0 && !s.fired.Load()
	if first && s.seen.Load() >= s.failAt && s.completed.Load() && s.fired.CompareAndSwap(false, true) {
		return rec{}, fmt.Errorf("injected failure after record %d", s.seen.Load())
	}
	r, err := s.Indexed.Next(ctx)
	switch {
	case err == nil && ctx.Task().Attempt > 0:
		s.replayed.Add(1)
	case err == nil:
		s.own++
		s.seen.Add(1)
	case first && errors.Is(err, io.EOF):
		if s.idleSince.IsZero() {
			s.idleSince = time.Now()
		}
		if time.Since(s.idleSince) > time.Minute {
			return rec{}, errors.New("no checkpoint completed within a minute after the end of the first attempt's input")
		}
		return rec{}, graph.ErrNoRecord
	}
	return r, err
}

// runningSum keeps the running sum per key and emits it with every
// record.
type runningSum struct {
	sum *state.ValueState[int64, int64]
}

func (r *runningSum) InitializeState(ctx *graph.Context) error {
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), "sum")
	r.sum = v
	return err
}

func (r *runningSum) Process(ctx *graph.KeyedContext[int64], in rec, o graph.Collector[out]) error {
	s, _ := r.sum.Value()
	s += in.I
	r.sum.Update(s)
	o.Collect(out{Key: ctx.CurrentKey(), I: in.I, Sum: s})
	return nil
}

func expectedOutput(n int64) []out {
	sums := make([]int64, numKeys)
	res := make([]out, 0, n)
	for i := int64(0); i < n; i++ {
		k := i % numKeys
		sums[k] += 2 * i
		res = append(res, out{Key: k, I: 2 * i, Sum: sums[k]})
	}
	return res
}

// countingListener counts the bytes its connections read: the proof that
// records crossed the network.
type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, read: l.read}, nil
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// worker is one part's worker in a test: its data-plane server on
// loopback, counting the bytes it reads.
type worker struct {
	cluster.Worker
	srv  *netchan.Server
	read atomic.Int64
}

var secret = []byte("s3cret")

// startWorkers starts a data-plane server on loopback for each of
// slots (worker i is "w<i+1>" with slots[i] slots), stopped when t ends.
func startWorkers(t *testing.T, slots ...int) []*worker {
	var ws []*worker
	for i, n := range slots {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		w := &worker{Worker: cluster.Worker{ID: fmt.Sprintf("w%d", i+1), Address: l.Addr().String(), Slots: n, Session: uint64(i + 1)},
			srv: netchan.NewServer(netchan.ServerConfig{Secret: secret})}
		go w.srv.Serve(countingListener{Listener: l, read: &w.read})
		t.Cleanup(w.srv.Stop)
		ws = append(ws, w)
	}
	return ws
}

// startInParts places job on ws and starts it in this process as their
// parts (parts.Start): one execution and job master, each part with its
// own server and connections to its peers.
func startInParts(t *testing.T, job *graph.Job, ws []*worker) (*graph.Execution, *cluster.Placement) {
	t.Helper()
	shape, err := parts.Shape(job)
	require.NoError(t, err)
	var cws []cluster.Worker
	var pws []parts.Worker
	for _, w := range ws {
		cws = append(cws, w.Worker)
		pw, err := parts.NewWorker(job, parts.WorkerConfig{ID: w.ID, Server: w.srv, Dial: netchan.DialConfig{Secret: secret,
			Options: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, pw.Close()) })
		pws = append(pws, pw)
	}
	pl, err := cluster.Place(shape, cws)
	require.NoError(t, err)
	e, err := parts.Start(context.Background(), job, pl, pws)
	require.NoError(t, err)
	return e.(*graph.Execution), pl
}

// TestNetworkChannelsExactlyOnce runs a keyed job at p=4 (source+map ->
// keyBy -> sum+slow+sink, chained) in three parts, as on workers w1 (2
// slots), w2 and w3 (1 each): the channels of its keyBy edge between
// subtasks on different workers are network channels on loopback with a
// shared secret, the others local. It runs in aligned, unaligned and
// aligned-with-timeout mode, with checkpoints on a local directory, an
// in-memory object store and S3 on loopback, with a failure after a
// completed checkpoint (failingSource) and the restore from the latest
// one, each part loading only its own subtasks' plan from that storage
// (the next attempt opens its channels anew, fencing the old ones): the published output is the failure-free one,
// every record exactly once by its identity (its I, with the running sum
// it produced). The sink is slowed until the failure, so the network
// channels are backpressured and barriers overtake data queued at both
// of their ends. The failure record is drawn from the seed printed
// (-nettest.seed replays it; the timing is the machine's).
//
// Issue 39: the overtaking modes lost whole buffers here (unaligned
// 3,072 of 60,000 with -nettest.seed=1796670362035617888; with a timeout,
// two runs of three). Two causes: the copies a receiver kept of what a
// priority barrier overtook were placed after the aligner's step, which
// for the barrier of the last input had completed, and acknowledged, the
// checkpoint's input state (task I6); and a priority barrier overtook an
// aligned barrier still queued at the sender, so the reader found nothing
// to promote for a checkpoint it was capturing (netchan N6).
func TestNetworkChannelsExactlyOnce(t *testing.T) {
	const n = 60_000
	want := expectedOutput(n)
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -nettest.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	// The checkpoints go to a local directory (Pebble state), an
	// in-memory object store and S3 on loopback (heap state): each part
	// reads its own subtasks' plan from there and writes its keyed state
	// there.
	local := func(t *testing.T) string { return t.TempDir() }
	var memSeq atomic.Int64
	mem := func(*testing.T) string { return fmt.Sprintf("mem://nettest-%d", memSeq.Add(1)) }
	s3 := func(t *testing.T) string { return s3test.URL(t, "checkpoints") + "&prefix=jobs/" }
	heap := graph.StateConfig{Backend: graph.HeapState}
	for _, m := range []struct {
		name  string
		cc    graph.CheckpointConfig
		dir   func(*testing.T) string
		state graph.StateConfig
	}{
		{"aligned/local", graph.CheckpointConfig{Mode: marker.Aligned}, local, graph.StateConfig{}},
		{"unaligned/memblob", graph.CheckpointConfig{Mode: marker.Unaligned}, mem, heap},
		{"aligned-timeout/s3", graph.CheckpointConfig{Mode: marker.Aligned, AlignedTimeout: time.Millisecond}, s3, heap},
	} {
		failAt := 1 + rng.Int64N(n/4)
		t.Run(fmt.Sprintf("%s/fail-at=%d", m.name, failAt), func(t *testing.T) {
			ws := startWorkers(t, 2, 1, 1)
			var seen, replayed, count atomic.Int64
			var fired atomic.Bool
			committer := sink.NewMemory[out]()
			cc := m.cc
			cc.Interval, cc.Dir, cc.Retain, cc.TolerableFailures = 3*time.Millisecond, m.dir(t), 2, -1
			job := graph.NewJob("network", graph.Config{
				Parallelism: 4, Checkpoint: cc, State: m.state, Restart: graph.FixedDelay(2, time.Millisecond), Logf: t.Logf,
			})
			src := graph.Source(job, "source", func() graph.SourceFunc[rec] {
				return &failingSource{Indexed: source.NewIndexed(n, func(i int64) rec { return rec{Key: i % numKeys, I: i} }),
					failAt: failAt, seen: &seen, fired: &fired, replayed: &replayed}
			})
			mapped := graph.Map(src, "double", func(r rec) rec { r.I *= 2; return r })
			sums := graph.ProcessKeyed(graph.KeyBy(mapped, func(r rec) int64 { return r.Key }), "sum",
				func() graph.KeyedProcessFunc[int64, rec, out] {
					return &runningSum{}
				})
			slow := graph.Map(sums, "slow", func(o out) out {
				if !fired.Load() && count.Add(1)%32 == 0 {
					time.Sleep(200 * time.Microsecond)
				}
				return o
			})
			graph.Sink(slow, "sink", sink.Publishing[out](committer, sink.WithLogf(t.Logf)))

			e, pl := startInParts(t, job, ws)
			require.NoError(t, e.Wait())

			got := committer.Published()
			slices.SortFunc(got, func(a, b out) int { return cmp.Compare(a.I, b.I) })
			require.Equal(t, len(want), len(got), "published record count")
			require.Equal(t, want, got)
			require.True(t, fired.Load(), "the first attempt failed")
			st := e.Stats()
			require.Equal(t, 1, st.Counts.Restored, "the failure restored a checkpoint")
			require.Positive(t, st.LatestRestored.ID)
			require.Less(t, replayed.Load(), int64(n), "records read again after the restore")
			// Subtasks 0 and 3 run on w1, 1 on w2, 2 on w3: 10 of the keyBy
			// edge's 16 channels cross workers, and every worker reads
			// records from the network.
			network := 0
			for _, c := range pl.Channels {
				if c.Network {
					network++
				}
			}
			require.Equal(t, 10, network, "network channels of the placement")
			var read int64
			for _, w := range ws {
				require.Positive(t, w.read.Load(), "bytes read from the network by %s", w.ID)
				read += w.read.Load()
			}
			require.Greater(t, read, int64(n), "bytes read from the network")
			if m.cc.Mode == marker.Unaligned {
				require.Positive(t, inFlight(st, "sum"), "input channel state at the network reader")
			}
		})
	}
}

// inFlight sums the persisted in-flight data of op's subtasks over the
// checkpoints in the history.
func inFlight(st *snapshot.Stats, op string) int64 {
	var n int64
	for _, cs := range st.History {
		for _, s := range cs.Subtasks {
			if s.Task.Operator == op {
				n += s.InFlightSize
			}
		}
	}
	return n
}
