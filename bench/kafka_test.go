package bench

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkKafka moves b.N records (100 bytes each, 4 partitions) from a
// kfake topic to another through the engine (Kafka source -> Kafka sink,
// parallelism 1, checkpoints every 100 ms in memory) and through a plain
// franz-go consume/produce loop (PlainKafkaLoop), alternating in one run,
// in exactly-once mode (transactional sink; the loop commits a transaction
// every 100 ms) and at-least-once mode (flush on checkpoint; the loop
// flushes at the end), and reports the engine's records/s and its ratio to
// the loop's (median of the rounds, with spread). A last run per mode
// measures the visibility delay: records produced into a topic at about
// 50k/s while the job runs, from their production to the moment a
// read_committed consumer of the output receives them:
//
//	go test -run '^$' -bench Kafka -benchtime 200000x ./bench/
func BenchmarkKafka(b *testing.B) {
	for _, mode := range []string{"exactly-once", "at-least-once"} {
		b.Run(mode, func(b *testing.B) {
			eos := mode == "exactly-once"
			n := int64(b.N)
			c, err := KafkaCluster("in")
			require.NoError(b, err)
			defer c.Close()
			brokers := c.ListenAddrs()
			require.NoError(b, FillKafka(c, "in", n))
			const rounds = 3
			var ratios []float64
			var engine time.Duration
			b.ResetTimer()
			for round := range rounds {
				out := fmt.Sprintf("loop-%d", round)
				require.NoError(b, c.CreateTopic(out, kafkaParts, nil))
				start := time.Now()
				require.NoError(b, PlainKafkaLoop(brokers, "in", out, out, n, eos))
				base := time.Since(start)

				out = fmt.Sprintf("engine-%d", round)
				require.NoError(b, c.CreateTopic(out, kafkaParts, nil))
				start = time.Now()
				require.NoError(b, EngineKafka(context.Background(), brokers, "in", out, out, 1, eos, true))
				d := time.Since(start)
				b.StopTimer()
				got, err := CountCommitted(brokers, out)
				require.NoError(b, err)
				require.Equal(b, n, got)
				b.StartTimer()
				engine += d
				ratios = append(ratios, base.Seconds()/d.Seconds())
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(float64(n)*rounds/engine.Seconds(), "records/s")
			b.ReportMetric(ratios[len(ratios)/2], "engine-vs-loop-x")
			b.ReportMetric(ratios[0], "engine-vs-loop-x-min")
			b.ReportMetric(ratios[len(ratios)-1], "engine-vs-loop-x-max")

			delays, err := KafkaVisibility(c, eos, min(n, 50_000))
			require.NoError(b, err)
			b.ReportMetric(delays[len(delays)/2], "visible-p50-ms")
			b.ReportMetric(delays[len(delays)*99/100], "visible-p99-ms")
			b.ReportMetric(delays[len(delays)-1], "visible-max-ms")
		})
	}
}
