package main

import (
	"bufio"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

type genOpts struct {
	devices  int
	records  string
	seed     uint64
	disorder time.Duration
	format   string
	out      string
	start    string
}

const genLong = `gen writes a synthetic device-signal dataset: --records signals of
--devices devices, one per line, streamed (constant memory whatever the
size) and deterministic for a --seed.

Each signal is {"offset": N, "device": "D17", "ts": RFC 3339 time,
"bms_soc": state of charge, "IC_totalMileage": km}: offsets run 1..records
(the record identity replay judges by), timestamps advance 100ms per
signal, and --disorder shifts each timestamp back by a random amount up to
that duration (out-of-order event time). Per device, the state of charge
random-walks and the mileage grows.`

const genExample = `  snapdemo gen --records 100000 --devices 50 --out signals.ndjson
  snapdemo gen --records 1M --format csv --disorder 5s --seed 7 --out signals.csv
  snapdemo gen --records 10 --format json                          # to stdout`

func newGenCmd(g *globalFlags, stdout io.Writer) *cobra.Command {
	o := &genOpts{}
	cmd := &cobra.Command{
		Use:     "gen",
		Short:   "Write a synthetic device-signal dataset (NDJSON, CSV or a JSON array)",
		Long:    genLong,
		Example: genExample,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runGen(o, stdout)
		},
	}
	f := cmd.Flags()
	f.IntVar(&o.devices, "devices", 100, "number of devices")
	f.StringVar(&o.records, "records", "10000", "number of signals (suffixes k, M, G: 1M = 1000000)")
	f.Uint64Var(&o.seed, "seed", 1, "random seed: the same seed gives the same dataset")
	f.DurationVar(&o.disorder, "disorder", 0, "shift each timestamp back by up to this duration (0: in order)")
	f.StringVar(&o.format, "format", "ndjson", "output format: ndjson, csv or json (one array)")
	f.StringVar(&o.out, "out", "-", "output file (-: stdout)")
	f.StringVar(&o.start, "start", "2026-01-01T00:00:00Z", "timestamp of the first signal (RFC 3339)")
	return cmd
}

// parseCount parses 1000, 10k, 1M, 2G.
func parseCount(s string) (int64, error) {
	mult := int64(1)
	t := strings.TrimSpace(s)
	switch {
	case strings.HasSuffix(t, "k"), strings.HasSuffix(t, "K"):
		mult, t = 1_000, t[:len(t)-1]
	case strings.HasSuffix(t, "M"), strings.HasSuffix(t, "m"):
		mult, t = 1_000_000, t[:len(t)-1]
	case strings.HasSuffix(t, "G"), strings.HasSuffix(t, "g"):
		mult, t = 1_000_000_000, t[:len(t)-1]
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, usagef("invalid --records %q (want a count such as 1000, 10k or 1M)", s)
	}
	return n * mult, nil
}

func runGen(o *genOpts, stdout io.Writer) (err error) {
	n, err := parseCount(o.records)
	if err != nil {
		return err
	}
	if o.devices < 1 {
		return usagef("invalid --devices %d: must be at least 1", o.devices)
	}
	if o.disorder < 0 {
		return usagef("invalid --disorder %v: must not be negative", o.disorder)
	}
	switch o.format {
	case formatNDJSON, formatCSV, formatJSON:
	default:
		return usagef("invalid --format %q (want ndjson, csv or json)", o.format)
	}
	start, err := time.Parse(time.RFC3339, o.start)
	if err != nil {
		return usagef("invalid --start %q: want an RFC 3339 time such as 2026-01-01T00:00:00Z", o.start)
	}
	w := stdout
	if o.out != "-" {
		f, err := os.Create(o.out)
		if err != nil {
			return usagef("--out %s: %v", o.out, plainErr(err))
		}
		defer func() {
			if cerr := f.Close(); err == nil && cerr != nil {
				err = cerr
			}
		}()
		w = f
	}
	bw := bufio.NewWriterSize(w, 256<<10)
	if err := generate(bw, n, o.devices, o.seed, o.disorder, o.format, start); err != nil {
		return err
	}
	return bw.Flush()
}

// generate writes n signals. Memory: two numbers per device.
func generate(w *bufio.Writer, n int64, devices int, seed uint64, disorder time.Duration, format string, start time.Time) error {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	soc := make([]int64, devices)
	km := make([]float64, devices)
	for d := range devices {
		soc[d] = 200 + rng.Int64N(200)
		km[d] = float64(rng.IntN(100000)) / 10
	}
	switch format {
	case formatCSV:
		w.WriteString("offset,device,ts,bms_soc,IC_totalMileage\n")
	case formatJSON:
		w.WriteString("[\n")
	}
	var buf []byte
	for i := int64(1); i <= n; i++ {
		d := rng.IntN(devices)
		soc[d] = max(0, min(1000, soc[d]+rng.Int64N(11)-5))
		km[d] += float64(rng.IntN(50)) / 100
		ts := start.Add(time.Duration(i-1) * 100 * time.Millisecond)
		if disorder > 0 {
			ts = ts.Add(-time.Duration(rng.Int64N(int64(disorder))))
		}
		buf = buf[:0]
		switch format {
		case formatCSV:
			buf = strconv.AppendInt(buf, i, 10)
			buf = append(buf, ",D"...)
			buf = strconv.AppendInt(buf, int64(d+1), 10)
			buf = append(buf, ',')
			buf = ts.UTC().AppendFormat(buf, time.RFC3339Nano)
			buf = append(buf, ',')
			buf = strconv.AppendInt(buf, soc[d], 10)
			buf = append(buf, ',')
			buf = strconv.AppendFloat(buf, km[d], 'f', 2, 64)
		default:
			if format == formatJSON && i > 1 {
				buf = append(buf, ',')
			}
			buf = append(buf, `{"offset":`...)
			buf = strconv.AppendInt(buf, i, 10)
			buf = append(buf, `,"device":"D`...)
			buf = strconv.AppendInt(buf, int64(d+1), 10)
			buf = append(buf, `","ts":"`...)
			buf = ts.UTC().AppendFormat(buf, time.RFC3339Nano)
			buf = append(buf, `","bms_soc":`...)
			buf = strconv.AppendInt(buf, soc[d], 10)
			buf = append(buf, `,"IC_totalMileage":`...)
			buf = strconv.AppendFloat(buf, km[d], 'f', 2, 64)
			buf = append(buf, '}')
		}
		buf = append(buf, '\n')
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("writing: %v", plainErr(err))
		}
	}
	if format == formatJSON {
		w.WriteString("]\n")
	}
	return nil
}
