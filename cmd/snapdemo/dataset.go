package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Signal is one device signal of the seed's dataset:
//
//	{ "D1" : { "offset": 1, "bms_soc": 331, "IC_totalMileage": 45.78 } }
type Signal struct {
	Device       string  `msgpack:"device"`
	Offset       int64   `msgpack:"offset"`
	BmsSoc       int64   `msgpack:"bms_soc"`
	TotalMileage float64 `msgpack:"mileage"`
}

func (s Signal) String() string {
	return fmt.Sprintf("%s{offset:%d bms_soc:%d IC_totalMileage:%.2f}", s.Device, s.Offset, s.BmsSoc, s.TotalMileage)
}

type signalFields struct {
	Offset       *int64   `json:"offset"`
	BmsSoc       *int64   `json:"bms_soc"`
	TotalMileage *float64 `json:"IC_totalMileage"`
}

// ParseSignals parses a device-signals JSON array. Errors name the file and
// the line of the offending element. Signals are returned in offset order;
// offsets must be unique and positive.
func ParseSignals(name string, data []byte) ([]Signal, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	lineOf := func(off int64) int { return 1 + bytes.Count(data[:min(int(off), len(data))], []byte("\n")) }
	fail := func(off int64, format string, args ...any) error {
		return fmt.Errorf("snapdemo: %s:%d: %s", name, lineOf(off), fmt.Sprintf(format, args...))
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, fail(dec.InputOffset(), "want a JSON array of signals: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '[' {
		return nil, fail(dec.InputOffset(), "want a JSON array of signals, found %v", tok)
	}
	var out []Signal
	seen := map[int64]int{}
	for i := 0; dec.More(); i++ {
		start := dec.InputOffset()
		// Point at the element itself, past the separator before it.
		for start < int64(len(data)) && strings.IndexByte(" \t\r\n,", data[start]) >= 0 {
			start++
		}
		var elem map[string]json.RawMessage
		if err := dec.Decode(&elem); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) {
				return nil, fail(se.Offset, "element %d: %v", i, err)
			}
			return nil, fail(start, "element %d: %v", i, err)
		}
		if len(elem) != 1 {
			return nil, fail(start, "element %d: want exactly one device id key, found %d", i, len(elem))
		}
		for dev, raw := range elem {
			if dev == "" {
				return nil, fail(start, "element %d: empty device id", i)
			}
			var f signalFields
			d := json.NewDecoder(bytes.NewReader(raw))
			d.DisallowUnknownFields()
			if err := d.Decode(&f); err != nil {
				return nil, fail(start, "element %d (device %s): %v", i, dev, err)
			}
			if f.Offset == nil || f.BmsSoc == nil || f.TotalMileage == nil {
				return nil, fail(start, "element %d (device %s): offset, bms_soc and IC_totalMileage are required", i, dev)
			}
			if *f.Offset <= 0 {
				return nil, fail(start, "element %d (device %s): offset %d must be positive", i, dev, *f.Offset)
			}
			if j, dup := seen[*f.Offset]; dup {
				return nil, fail(start, "element %d (device %s): offset %d already used by element %d", i, dev, *f.Offset, j)
			}
			seen[*f.Offset] = i
			out = append(out, Signal{Device: dev, Offset: *f.Offset, BmsSoc: *f.BmsSoc, TotalMileage: *f.TotalMileage})
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, fail(dec.InputOffset(), "unterminated array: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fail(dec.InputOffset(), "unexpected data after the array")
	}
	sort.Slice(out, func(a, b int) bool { return out[a].Offset < out[b].Offset })
	return out, nil
}
