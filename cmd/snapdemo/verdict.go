package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"io"
	"math/bits"
	"os"
	"path/filepath"
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

// judgeBudget bounds the memory judge holds ids in: 8 bytes per id of the
// input and of the output each. Above it, the ids are spilled to
// temporary files by hash partition and each partition is judged in turn.
const judgeBudget = 64 << 20

// judge compares the ids of the input (streamed again) with those of the
// committed output, by record identity (hashes of the ids, a multiset
// each). Memory stays bounded whatever the input's size: when the ids
// could exceed judgeBudget, they are written to temporary files in hash
// partitions (a partition's ids meet only their own partition's), and the
// partitions are compared one at a time.
func judge(ctx context.Context, ds *dataset, sch *schema, out output, atLeastOnce bool) (*verdict, error) {
	parts := 1
	// At least ~40 bytes of input per record; twice for the output.
	for est := ds.Size / 40 * 16; est/int64(parts) > judgeBudget && parts < 1<<12; {
		parts *= 2
	}
	ids, err := newIDSets(parts)
	if err != nil {
		return nil, err
	}
	defer ids.close()
	err = scanFields(ds, func(f *fields, raw []byte, line int64) error {
		r, err := sch.record(f, raw)
		if err != nil {
			return &inputError{ds.Name, line, err}
		}
		return ids.add(0, idHash(r.ID))
	})
	if err != nil {
		return nil, err
	}
	byAttempt := map[string]int64{}
	if err := out.scan(ctx, func(r ReplayRow) error {
		byAttempt[fmt.Sprintf("%s/%d", r.Run, r.Attempt)]++
		return ids.add(1, idHash(r.ID))
	}); err != nil {
		return nil, err
	}
	v, err := ids.compare()
	if err != nil {
		return nil, err
	}
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

// idSets holds the id hashes of the input (side 0) and of the output
// (side 1): in memory with one partition, else in a temporary file per
// side and partition (the top bits of the hash choose it).
type idSets struct {
	mem   [2][]uint64
	dir   string
	files [2][]*os.File
	bufs  [2][]*bufio.Writer
	shift uint
}

func newIDSets(parts int) (*idSets, error) {
	s := &idSets{}
	if parts == 1 {
		return s, nil
	}
	s.shift = uint(64 - bits.TrailingZeros(uint(parts)))
	dir, err := os.MkdirTemp("", "snapdemo-verdict-")
	if err != nil {
		return nil, fmt.Errorf("verdict: %w", err)
	}
	s.dir = dir
	for side := range 2 {
		for p := range parts {
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("%d-%d", side, p)))
			if err != nil {
				s.close()
				return nil, fmt.Errorf("verdict: %w", err)
			}
			s.files[side] = append(s.files[side], f)
			s.bufs[side] = append(s.bufs[side], bufio.NewWriterSize(f, 16<<10))
		}
	}
	return s, nil
}

func (s *idSets) add(side int, h uint64) error {
	if s.dir == "" {
		s.mem[side] = append(s.mem[side], h)
		return nil
	}
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], h)
	_, err := s.bufs[side][h>>s.shift].Write(b[:])
	return err
}

// compare compares the two sides, partition by partition.
func (s *idSets) compare() (comparison, error) {
	if s.dir == "" {
		return compare(s.mem[0], s.mem[1]), nil
	}
	total := comparison{badWhat: map[uint64]string{}}
	var in, got []uint64
	for p := range s.files[0] {
		var err error
		if in, err = s.read(0, p, in[:0]); err != nil {
			return total, err
		}
		if got, err = s.read(1, p, got[:0]); err != nil {
			return total, err
		}
		c := compare(in, got)
		total.RecordsIn += c.RecordsIn
		total.Rows += c.Rows
		total.Distinct += c.Distinct
		total.Duplicates += c.Duplicates
		total.Lost += c.Lost
		total.Unexpected += c.Unexpected
		for _, h := range c.badHashes {
			if len(total.badHashes) < 5 {
				total.badHashes = append(total.badHashes, h)
				total.badWhat[h] = c.badWhat[h]
			}
		}
	}
	total.ExactlyOnce = total.Duplicates == 0 && total.Lost == 0 && total.Unexpected == 0
	return total, nil
}

// read returns the hashes of one side's partition p, appended to dst.
func (s *idSets) read(side, p int, dst []uint64) ([]uint64, error) {
	if err := s.bufs[side][p].Flush(); err != nil {
		return nil, fmt.Errorf("verdict: %w", err)
	}
	f := s.files[side][p]
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("verdict: %w", err)
	}
	r := bufio.NewReaderSize(f, 64<<10)
	var b [8]byte
	for {
		if _, err := io.ReadFull(r, b[:]); err == io.EOF {
			return dst, nil
		} else if err != nil {
			return nil, fmt.Errorf("verdict: %s: %w", f.Name(), err)
		}
		dst = append(dst, binary.LittleEndian.Uint64(b[:]))
	}
}

func (s *idSets) close() {
	for side := range s.files {
		for _, f := range s.files[side] {
			f.Close()
		}
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
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
