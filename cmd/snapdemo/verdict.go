package main

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"slices"
	"strings"
)

// verdict is the judgement of exactly-once by record identity: every input
// record's id is committed exactly as often as it occurs in the input
// (once, for unique ids).
type verdict struct {
	RecordsIn  int64 `json:"records_in"`
	Rows       int64 `json:"rows_committed"`
	Distinct   int64 `json:"distinct"`
	Duplicates int64 `json:"duplicates"`
	Lost       int64 `json:"lost"`
	// Unexpected counts committed rows whose id is not in the input.
	Unexpected int64 `json:"unexpected"`
	// Pending counts the input records not committed yet by a run that
	// stopped with a savepoint (see stopped); Lost is then 0.
	Pending     int64 `json:"pending,omitempty"`
	ExactlyOnce bool  `json:"exactly_once"`
	// Guarantee is what the checkpoint mode promises: "exactly-once"
	// (aligned, unaligned) or "at-least-once" (duplicates allowed, no
	// loss); Held says whether the output keeps it.
	Guarantee string   `json:"guarantee"`
	Held      bool     `json:"held"`
	Examples  []string `json:"examples,omitempty"`
	// ByAttempt counts the committed rows by the run (execution) and
	// attempt that processed them: "run/attempt".
	ByAttempt map[string]int64 `json:"committed_by_attempt,omitempty"`
}

func idHash(id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64()
}

// judge compares the ids of the input (streamed again) with those of the
// committed output. It holds 8 bytes per record of each, sorted.
func judge(ctx context.Context, ds *dataset, sch *schema, out output, atLeastOnce bool) (*verdict, error) {
	var in, got []uint64
	err := scanFields(ds, func(f *fields, raw []byte, line int64) error {
		r, err := sch.record(f, raw)
		if err != nil {
			return &inputError{ds.Name, line, err}
		}
		in = append(in, idHash(r.ID))
		return nil
	})
	if err != nil {
		return nil, err
	}
	byAttempt := map[string]int64{}
	if err := out.scan(ctx, func(r ReplayRow) error {
		got = append(got, idHash(r.ID))
		byAttempt[fmt.Sprintf("%s/%d", r.Run, r.Attempt)]++
		return nil
	}); err != nil {
		return nil, err
	}
	v := compare(in, got)
	v.ByAttempt = byAttempt
	v.Guarantee, v.Held = "exactly-once", v.ExactlyOnce
	if atLeastOnce {
		v.Guarantee, v.Held = "at-least-once", v.Lost == 0 && v.Unexpected == 0
	}
	if !v.ExactlyOnce {
		// Name a few of the ids at stake.
		bad := map[uint64]string{}
		for _, h := range v.badHashes {
			bad[h] = ""
		}
		_ = scanFields(ds, func(f *fields, raw []byte, _ int64) error {
			if r, err := sch.record(f, raw); err == nil {
				if _, ok := bad[idHash(r.ID)]; ok {
					bad[idHash(r.ID)] = r.ID
				}
			}
			return nil
		})
		_ = out.scan(ctx, func(r ReplayRow) error {
			if s, ok := bad[idHash(r.ID)]; ok && s == "" {
				bad[idHash(r.ID)] = r.ID
			}
			return nil
		})
		for _, h := range v.badHashes {
			v.Examples = append(v.Examples, fmt.Sprintf("id %s: %s", bad[h], v.badWhat[h]))
		}
	}
	return &v.verdict, nil
}

type comparison struct {
	verdict
	badHashes []uint64
	badWhat   map[uint64]string
}

// compare merges the sorted multisets of input and output ids.
func compare(in, got []uint64) comparison {
	slices.Sort(in)
	slices.Sort(got)
	c := comparison{badWhat: map[uint64]string{}}
	c.RecordsIn, c.Rows = int64(len(in)), int64(len(got))
	note := func(h uint64, what string) {
		if len(c.badHashes) < 5 {
			c.badHashes = append(c.badHashes, h)
			c.badWhat[h] = what
		}
	}
	i, j := 0, 0
	for i < len(in) || j < len(got) {
		var h uint64
		switch {
		case j >= len(got) || (i < len(in) && in[i] < got[j]):
			h = in[i]
		default:
			h = got[j]
		}
		ni, nj := 0, 0
		for i < len(in) && in[i] == h {
			i++
			ni++
		}
		for j < len(got) && got[j] == h {
			j++
			nj++
		}
		if nj > 0 {
			c.Distinct++
		}
		switch {
		case ni == 0:
			c.Unexpected += int64(nj)
			note(h, fmt.Sprintf("committed %d time(s), not in the input", nj))
		case nj > ni:
			c.Duplicates += int64(nj - ni)
			note(h, fmt.Sprintf("committed %d time(s), %d in the input", nj, ni))
		case nj < ni:
			c.Lost += int64(ni - nj)
			note(h, fmt.Sprintf("committed %d time(s), %d in the input", nj, ni))
		}
	}
	c.ExactlyOnce = c.Duplicates == 0 && c.Lost == 0 && c.Unexpected == 0
	return c
}

// stopped judges the output of a job that stopped with a savepoint before
// the end of its input: the records it did not commit are pending, not
// lost (the run that resumes from the savepoint commits them, and judges
// the whole input again), and the guarantee holds if no record is
// committed twice or out of nowhere.
func (v *verdict) stopped() {
	v.Pending, v.Lost = v.Lost, 0
	v.ExactlyOnce = v.Duplicates == 0 && v.Unexpected == 0
	if v.ExactlyOnce {
		v.Examples = nil // they named the pending records
	}
	if v.Guarantee == "exactly-once" {
		v.Held = v.ExactlyOnce
	}
}

func (v *verdict) summary() string {
	s := fmt.Sprintf("%d records in, %d rows committed, %d distinct, %d duplicates, %d lost, %d unexpected",
		v.RecordsIn, v.Rows, v.Distinct, v.Duplicates, v.Lost, v.Unexpected)
	if v.Pending > 0 {
		s += fmt.Sprintf(", %d pending", v.Pending)
	}
	return s
}

func (v *verdict) print(w io.Writer) {
	fmt.Fprintln(w, v.summary())
	if v.Pending > 0 && v.ExactlyOnce {
		fmt.Fprintf(w, "every committed record exactly once; %d records are still to come (the job stopped with a savepoint): "+
			"restore it to commit them\n", v.Pending)
		return
	}
	if v.ExactlyOnce {
		fmt.Fprintf(w, "every input record exactly once in the committed output: %d records, %d rows\n", v.RecordsIn, v.Rows)
		return
	}
	if v.Guarantee == "at-least-once" && v.Held {
		fmt.Fprintf(w, "every input record at least once in the committed output (--mode at-least-once: barriers are not aligned, "+
			"so a restore may replay records a checkpoint already counted): %d duplicates: %s\n", v.Duplicates, strings.Join(v.Examples, "; "))
		return
	}
	fmt.Fprintf(w, "EXACTLY-ONCE VIOLATED: %s\n", strings.Join(v.Examples, "; "))
}
