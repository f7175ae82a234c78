package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSensorWindows: the committed table holds every (mote, minute) of the
// readings exactly once, with the number of readings and the mean, minimum
// and maximum temperature of that minute, computed here from the CSV.
func TestSensorWindows(t *testing.T) {
	f, err := os.Open("data/data.csv")
	require.NoError(t, err)
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	type key struct {
		mote  string
		start int64
	}
	type agg struct {
		n             int64
		sum, min, max float64
	}
	want := map[key]agg{}
	for _, row := range rows[1:] {
		n, err := strconv.ParseInt(row[0], 10, 64)
		require.NoError(t, err)
		c, err := strconv.ParseFloat(row[4], 64)
		require.NoError(t, err)
		k := key{row[1], n * 5 / 60 * 60} // seconds
		a, ok := want[k]
		if !ok {
			a = agg{min: c, max: c}
		}
		want[k] = agg{a.n + 1, a.sum + c, min(a.min, c), max(a.max, c)}
	}

	var stdout bytes.Buffer
	table, err := run(context.Background(), options{Table: t.TempDir(), Interval: 10 * time.Millisecond, Logf: t.Logf}, &stdout)
	t.Log(stdout.String())
	require.NoError(t, err)
	require.Contains(t, stdout.String(), "every reading in exactly one committed window")
	got := map[key]bool{}
	for _, m := range table {
		k := key{strconv.FormatInt(m.Mote, 10), m.Start.Unix()}
		require.False(t, got[k], "mote %d at %s twice", m.Mote, m.Start)
		got[k] = true
		w, ok := want[k]
		require.True(t, ok, "mote %d at %s: no readings", m.Mote, m.Start)
		require.Equal(t, w.n, m.Readings, "mote %d at %s", m.Mote, m.Start)
		require.InDelta(t, w.sum/float64(w.n), m.MeanC, 1e-9)
		require.Equal(t, w.min, m.MinC)
		require.Equal(t, w.max, m.MaxC)
	}
	require.Len(t, got, len(want))
}
