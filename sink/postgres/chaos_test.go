package postgres

// The chaos harness of the job tests (the pattern of sink/twophase_test.go):
// faults at named sites around the committer's methods and the sink's
// hooks, counted over every subtask and attempt of a job.

import (
	"github.com/snapflow/snapflow/internal/testsupport/inject"
	"github.com/snapflow/snapflow/sink"
)

// fault and chaos are the shared fault injection (internal/testsupport/inject).
type (
	fault = inject.Fault
	chaos = inject.Chaos
)

// chaosPG is the PostgreSQL committer with faults around every
// operation; "-after" sites fail after the operation took effect (the
// reply was lost).
type chaosPG struct {
	*Sink[rec]
	c *chaos
}

var (
	_ sink.TwoPhaseCommitter[rec, *Txn] = chaosPG{}
	_ sink.BatchWriter[rec, *Txn]       = chaosPG{}
	_ sink.StaleAborter                 = chaosPG{}
)

func (f chaosPG) Begin(id sink.TxnID) (*Txn, error) {
	if err := f.c.Hit("begin"); err != nil {
		return nil, err
	}
	return f.Sink.Begin(id)
}

func (f chaosPG) Write(h *Txn, r rec) error {
	if err := f.c.Hit("write"); err != nil {
		return err
	}
	return f.Sink.Write(h, r)
}

func (f chaosPG) WriteBatch(h *Txn, rs []rec) error {
	if err := f.c.Hit("write"); err != nil {
		return err
	}
	return f.Sink.WriteBatch(h, rs)
}

func (f chaosPG) PreCommit(h *Txn, ckpt int64) error {
	if err := f.c.Hit("precommit"); err != nil {
		return err
	}
	if err := f.Sink.PreCommit(h, ckpt); err != nil {
		return err
	}
	// Prepared, but the reply is lost: the snapshot fails, and the abort
	// at the close must roll back the prepared transaction.
	if err := f.c.Hit("precommit-after"); err != nil {
		h.conn = nil
		return err
	}
	return nil
}

func (f chaosPG) commit(site string, h *Txn, commit func(*Txn) error) error {
	if err := f.c.Hit(site); err != nil {
		return err
	}
	if err := commit(h); err != nil {
		return err
	}
	return f.c.Hit(site + "-after")
}

func (f chaosPG) Commit(h *Txn) error { return f.commit("commit", h, f.Sink.Commit) }

func (f chaosPG) RecoverAndCommit(h *Txn) error {
	return f.commit("rcommit", h, f.Sink.RecoverAndCommit)
}

// Abort fails as an abort does in practice: the connection is lost (the
// server rolls the open transaction back).
func (f chaosPG) Abort(h *Txn) error {
	if err := f.c.Hit("abort"); err != nil {
		if h.conn != nil {
			discard(h.conn)
			h.conn = nil
		}
		return err
	}
	return f.Sink.Abort(h)
}

func (f chaosPG) RecoverAndAbort(h *Txn) error {
	if err := f.c.Hit("rabort"); err != nil {
		return err
	}
	return f.Sink.RecoverAndAbort(h)
}

func (f chaosPG) AbortStale(s sink.Stale) error {
	if err := f.c.Hit("stale"); err != nil {
		return err
	}
	if err := f.Sink.AbortStale(s); err != nil {
		return err
	}
	return f.c.Hit("stale-after")
}

// noStale hides AbortStale (the negative control of the stale test).
type noStale struct{ chaosPG }

func (noStale) AbortStale() {} // shadows the promoted method: not a StaleAborter

// noEndAbort hides AbortUncovered: the execution's end leaves its prepared
// transactions behind, as a killed process does.
type noEndAbort struct{ chaosPG }

func (noEndAbort) AbortUncovered() {} // shadows the promoted method: not a sink.EndAborter
