package pebble

import "time"

// The paced TTL cleanup of the Pebble engine: Flink's RocksDB backend
// removes expired values in a compaction filter, which Pebble does not
// have, and Pebble's block-property collectors are handed no values for
// SET keys (so a collector cannot record the blocks' oldest stamps to skip
// the rest). Instead, each TTL state is swept on the subtask goroutine in
// small steps driven by the backend's time: at a SetTime at least
// period/sweepSteps after the last step, every TTL table examines its
// share of the elapsed period (the entries stored when its pass began x
// elapsed / period, plus one, at most maxSweepBatch; counted from the
// pass's start, so that the entries it removes do not slow the rest of
// the pass down) from where the last step stopped, with one
// iterator, and deletes what has expired. A whole pass over a state takes
// about TTLCleanupPeriod of backend time (longer when maxSweepBatch caps
// the steps of a very large state); the compactions that follow drop the
// tombstones. Running on the subtask goroutine keeps C1: a key whose
// latest value is in the write-back cache is left to the cache. This
// replaces the per-access cleanup of the heap, which on Pebble would open
// an iterator on every access.

// defaultTTLCleanupPeriod is Config.TTLCleanupPeriod's default.
const defaultTTLCleanupPeriod = time.Minute

// sweepSteps is the number of steps a pass is paced in at most; a step
// runs once period/sweepSteps of backend time has elapsed.
const sweepSteps = 1000

// maxSweepBatch bounds the entries one step examines per state, and so
// the pause a step adds to the batch whose SetTime runs it.
const maxSweepBatch = 4096

// ttlSweeper is a TTL table of the paced cleanup.
type ttlSweeper interface {
	// sweepEntries examines up to n entries after the previous call's
	// last, removing the expired ones, and reports whether it reached the
	// last entry (the next call starts a pass).
	sweepEntries(n int, now int64) bool
	// stored bounds the stored entries from above.
	stored() int
}

func (t *Table[K, V]) stored() int { return t.n }

// SweepTTL runs a step of the paced cleanup if one is due at now (the
// backend's SetTime, once per batch of records).
func (s *Store) SweepTTL(now int64) {
	if len(s.sweepers) == 0 || s.sweepPeriod < 0 {
		return
	}
	if s.sweptAt == 0 || now < s.sweptAt {
		s.sweptAt = now // the first time, or the clock went back
		return
	}
	elapsed := now - s.sweptAt
	if elapsed < s.sweepPeriod/sweepSteps {
		return
	}
	s.sweptAt = now
	for i := range s.sweepers {
		p := &s.sweepers[i]
		if p.pass <= 0 {
			p.pass = p.t.stored()
			if p.pass <= 0 {
				continue
			}
		}
		share := float64(p.pass) * float64(elapsed) / float64(s.sweepPeriod)
		if p.t.sweepEntries(int(min(share+1, maxSweepBatch)), now) {
			p.pass = 0 // the next step begins a pass
		}
	}
}

// pacedSweep is a table of the paced cleanup and the entries it held when
// its current pass began (0: none begun).
type pacedSweep struct {
	t    ttlSweeper
	pass int
}
