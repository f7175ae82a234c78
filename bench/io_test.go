package bench

import (
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// BenchmarkFileSources reads b.N signals from a file of each format through
// the engine and through a plain loop (PlainRead), alternating in one run,
// (csv: CSV decoding into the struct by its tags; csv-func: CSVFunc with
// the loop's hand-written decoder) and reports the engine's records/s, its ratio to the loop's (median of
// the rounds, with spread) and the engine's peak live heap next to the
// file's size:
//
//	go test -run '^$' -bench FileSources -benchtime 1000000x ./bench/
func BenchmarkFileSources(b *testing.B) {
	for _, format := range []string{"ndjson", "json-array", "csv", "csv-func"} {
		b.Run(format, func(b *testing.B) {
			n := int64(b.N)
			path := filepath.Join(b.TempDir(), "signals."+format)
			file := format
			if format == "csv-func" {
				file = "csv"
			}
			size, err := WriteSignals(path, file, n)
			require.NoError(b, err)
			want := SignalsSum(n)
			const rounds = 3
			var ratios []float64
			var engine time.Duration
			var peak uint64
			b.ResetTimer()
			for range rounds {
				start := time.Now()
				got, err := PlainRead(path, file)
				base := time.Since(start)
				require.NoError(b, err)
				require.Equal(b, want, got)

				runtime.GC()
				stop := PeakHeap(time.Millisecond)
				start = time.Now()
				got, err = EngineRead(path, format)
				d := time.Since(start)
				peak = max(peak, stop())
				require.NoError(b, err)
				require.Equal(b, want, got)
				engine += d
				ratios = append(ratios, base.Seconds()/d.Seconds())
			}
			b.StopTimer()
			slices.Sort(ratios)
			b.ReportMetric(float64(n)*rounds/engine.Seconds(), "records/s")
			b.ReportMetric(ratios[len(ratios)/2], "engine-vs-loop-x")
			b.ReportMetric(ratios[0], "engine-vs-loop-x-min")
			b.ReportMetric(ratios[len(ratios)-1], "engine-vs-loop-x-max")
			b.ReportMetric(float64(size)/(1<<20), "file-MiB")
			b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
		})
	}
}

// BenchmarkFileTableSink writes b.N signals into the file table through the
// engine (checkpoints every 100 ms, each committing a snapshot) and through
// a plain loop writing the same NDJSON to one file (PlainWrite),
// alternating in one run, and reports the engine's records/s, its ratio to
// the loop's and its peak live heap. A last round measures the visibility
// delay: from a record's emission to the moment a reader polling the table
// every millisecond sees it in a committed snapshot (the checkpoint
// interval plus the time to complete the checkpoint and commit):
//
//	go test -run '^$' -bench FileTableSink -benchtime 1000000x ./bench/
func BenchmarkFileTableSink(b *testing.B) {
	n := int64(b.N)
	const rounds = 3
	var ratios []float64
	var engine time.Duration
	var peak uint64
	b.ResetTimer()
	for range rounds {
		dir := b.TempDir()
		start := time.Now()
		require.NoError(b, PlainWrite(dir, n))
		base := time.Since(start)

		runtime.GC()
		stop := PeakHeap(time.Millisecond)
		start = time.Now()
		tbl, err := EngineWrite(filepath.Join(dir, "table"), n, 100*time.Millisecond, nil)
		d := time.Since(start)
		peak = max(peak, stop())
		require.NoError(b, err)
		s, ok, err := tbl.Latest()
		require.NoError(b, err)
		require.True(b, ok)
		require.Equal(b, n, s.TotalRecords)
		engine += d
		ratios = append(ratios, base.Seconds()/d.Seconds())
	}
	b.StopTimer()
	slices.Sort(ratios)
	b.ReportMetric(float64(n)*rounds/engine.Seconds(), "records/s")
	b.ReportMetric(ratios[len(ratios)/2], "engine-vs-loop-x")
	b.ReportMetric(ratios[0], "engine-vs-loop-x-min")
	b.ReportMetric(ratios[len(ratios)-1], "engine-vs-loop-x-max")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")

	delays, err := TableVisibility(filepath.Join(b.TempDir(), "table"), n, 100*time.Millisecond)
	require.NoError(b, err)
	b.ReportMetric(delays[len(delays)/2], "visible-p50-ms")
	b.ReportMetric(delays[len(delays)*99/100], "visible-p99-ms")
	b.ReportMetric(delays[len(delays)-1], "visible-max-ms")
}
