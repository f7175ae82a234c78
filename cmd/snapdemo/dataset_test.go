package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseEmbeddedDataset(t *testing.T) {
	sigs, err := ParseSignals("device-signals.json", embedded)
	require.NoError(t, err)
	require.Len(t, sigs, 9)
	require.Equal(t, Signal{Device: "D6", Offset: 6, BmsSoc: 316, TotalMileage: 45.49}, sigs[5])
}

func TestParseErrorsNameFileAndLine(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"{}", "x.json:1: want a JSON array of signals"},
		{"[\n{\"D1\": {\"offset\": 1, \"bms_soc\": 1, \"IC_totalMileage\": 1}},\n{\"D2\": {\"offset\": 1, \"bms_soc\": 1, \"IC_totalMileage\": 1}}]", "x.json:3: element 1 (device D2): offset 1 already used by element 0"},
		{"[\n{\"D1\": {\"offset\": 1}}]", "x.json:2: element 0 (device D1): offset, bms_soc and IC_totalMileage are required"},
		{"[\n{\"D1\": {\"offset\": 1, \"bms_soc\": 1, \"IC_totalMileage\": 1, \"x\": 2}}]", "x.json:2: element 0 (device D1): json: unknown field \"x\""},
		{"[\n{\"D1\": {\"offset\": 1, \"bms_soc\": 1, \"IC_totalMileage\": 1}, \"D2\": {}}]", "x.json:2: element 0: want exactly one device id key, found 2"},
		{"[\n{\"D1\": {\"offset\": -3, \"bms_soc\": 1, \"IC_totalMileage\": 1}}]", "x.json:2: element 0 (device D1): offset -3 must be positive"},
		{"[\n{\"D1\": {\"offset\": 1, \"bms_soc\": 1, \"IC_totalMileage\": 1}}\n,\n{\"D1\": ", "x.json:4: element 1"},
		{"[\n{\"D1\": {\"offset\": \"1\", \"bms_soc\": 1, \"IC_totalMileage\": 1}}]", "x.json:2: element 0 (device D1): json: cannot unmarshal string"},
	} {
		_, err := ParseSignals("x.json", []byte(tc.in))
		require.Error(t, err, tc.in)
		require.Contains(t, err.Error(), tc.want, tc.in)
	}
}

func FuzzParseSignals(f *testing.F) {
	f.Add(embedded)
	f.Add([]byte(`[{"D1":{"offset":1,"bms_soc":2,"IC_totalMileage":3.5}}]`))
	f.Add([]byte(`[`))
	f.Add([]byte(`[{"":{}}]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sigs, err := ParseSignals("fuzz.json", data)
		if err != nil {
			require.Nil(t, sigs)
			return
		}
		seen := map[int64]bool{}
		for i, s := range sigs {
			require.NotEmpty(t, s.Device)
			require.Positive(t, s.Offset)
			require.False(t, seen[s.Offset])
			seen[s.Offset] = true
			if i > 0 {
				require.Less(t, sigs[i-1].Offset, s.Offset)
			}
		}
	})
}
