package kafka_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/source/kafka"
)

// hidePartition makes the cluster answer every metadata request without
// partition part of topic (as a broker whose metadata lags, or a listing
// that misses it) until the returned function is called.
func hidePartition(t *testing.T, c *kfake.Cluster, topic string, part int32) (show func()) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	full, err := kmsg.NewPtrMetadataRequest().RequestWith(context.Background(), cl)
	require.NoError(t, err)
	var hidden atomic.Bool
	hidden.Store(true)
	c.ControlKey(int16(kmsg.Metadata), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if !hidden.Load() {
			return nil, nil, false
		}
		req := kr.(*kmsg.MetadataRequest)
		resp := req.ResponseKind().(*kmsg.MetadataResponse)
		resp.Brokers, resp.ClusterID, resp.ControllerID = full.Brokers, full.ClusterID, full.ControllerID
		for _, td := range full.Topics {
			if req.Topics != nil && !slices.ContainsFunc(req.Topics, func(rt kmsg.MetadataRequestTopic) bool {
				return rt.Topic != nil && td.Topic != nil && *rt.Topic == *td.Topic
			}) {
				continue
			}
			td.Partitions = slices.DeleteFunc(slices.Clone(td.Partitions), func(pd kmsg.MetadataResponseTopicPartition) bool {
				return td.Topic != nil && *td.Topic == topic && pd.Partition == part
			})
			resp.Topics = append(resp.Topics, td)
		}
		return resp, nil, true
	})
	return func() { hidden.Store(false) }
}

// TestSourcePartitionNotListed: a partition missing from the listing of
// a restore is not finished (K9): it keeps its checkpointed offset
// through that run and a further checkpoint and restore while it is still
// missing, and is read on from that offset when it is listed again, at a
// restore or by discovery while running. Every record is committed
// exactly once by identity.
func TestSourcePartitionNotListed(t *testing.T) {
	for _, discovery := range []bool{false, true} {
		name := "restore"
		if discovery {
			name = "discovery"
		}
		t.Run(name, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "in"))
			require.NoError(t, err)
			defer c.Close()
			for p := range int32(3) {
				produce(t, c, "in", p, int(p)*100, 100, nil)
			}
			ckpt, out := t.TempDir(), t.TempDir()
			cfg := kafka.Config[rec]{Brokers: c.ListenAddrs(), Topics: []string{"in"}, Deserializer: decodeID, Logf: t.Logf}
			if discovery {
				cfg.DiscoveryInterval = 10 * time.Millisecond
			}
			committed := func() int {
				got, err := sink.ReadCommitted[rec](out)
				require.NoError(t, err)
				return len(got)
			}
			// run runs the job until until holds after two checkpoints
			// completed, then cancels it; during, if set, runs once the
			// first checkpoint completed.
			run := func(restore bool, until func() bool, during func()) {
				t.Helper()
				src, err := kafka.New(cfg)
				require.NoError(t, err)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				var completed atomic.Int64
				done := make(chan error, 1)
				go func() {
					j := graph.NewJob(t.Name(), graph.Config{
						Parallelism: 2,
						Checkpoint:  graph.CheckpointConfig{Interval: 5 * time.Millisecond, Dir: ckpt, TolerableFailures: -1, Retain: 2},
						Restore:     graph.RestoreConfig{Latest: restore},
						Logf:        t.Logf,
						OnEvent: func(e graph.Event) {
							if e.Kind == graph.CheckpointCompleted {
								completed.Add(1)
							}
						},
					})
					graph.Sink(graph.Source(j, "kafka", src.New), "out", sink.TwoPhaseCommit[rec, *sink.FileTxn](&sink.TxnFiles[rec]{Dir: out, NoSync: true}))
					done <- j.Run(ctx)
				}()
				deadline := time.Now().Add(30 * time.Second)
				for !(completed.Load() >= 2 && until()) {
					if during != nil && completed.Load() >= 1 {
						during()
						during = nil
					}
					require.True(t, time.Now().Before(deadline), "timed out: %d records committed", committed())
					select {
					case err := <-done:
						t.Fatalf("job ended: %v", err)
					case <-time.After(10 * time.Millisecond):
					}
				}
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
			}
			atLeast := func(n int) func() bool { return func() bool { return committed() >= n } }

			run(false, atLeast(300), nil)
			produce(t, c, "in", 2, 1000, 50, nil) // after the checkpointed offset of partition 2
			produce(t, c, "in", 0, 2000, 20, nil)
			produce(t, c, "in", 1, 2100, 20, nil)
			show := hidePartition(t, c, "in", 2)        // the last: franz-go refuses a listing with a gap
			run(true, atLeast(340), nil)                // partition 2 not listed
			run(true, func() bool { return true }, nil) // a further checkpoint and restore while it is missing
			require.Equal(t, 340, committed(), "partition 2 was read while not listed")
			if discovery {
				run(true, atLeast(390), show) // listed again while running
			} else {
				show()
				run(true, atLeast(390), nil) // listed again at a restore
			}
			produce(t, c, "in", 2, 3000, 10, nil)
			run(true, atLeast(400), nil)
			got, err := sink.ReadCommitted[rec](out)
			require.NoError(t, err)
			seen := map[int64]int{}
			for _, r := range got {
				seen[r.ID]++
			}
			var want []int64
			for p := range int64(3) {
				for i := range int64(100) {
					want = append(want, p*100+i)
				}
			}
			for i := range int64(50) {
				want = append(want, 1000+i)
			}
			for i := range int64(20) {
				want = append(want, 2000+i, 2100+i)
			}
			for i := range int64(10) {
				want = append(want, 3000+i)
			}
			for _, id := range want {
				require.Equal(t, 1, seen[id], "id %d", id)
			}
			require.Len(t, got, len(want))
		})
	}
}
