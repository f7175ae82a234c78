package sink

import (
	"cmp"
	"errors"
	"fmt"
	"log"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/state"
)

// TwoPhaseCommitter is the contract of a transactional external system,
// driven by the sink that TwoPhaseCommit builds (Flink's
// TwoPhaseCommitSinkFunction). H is the transaction's handle: what the
// sink keeps in its checkpointed state to finish the transaction after a
// restore, never the records. It must survive msgpack (the state codec) and
// be small: a file path, a prepared-transaction id. It may be a pointer to
// a struct whose unexported fields hold what only the running attempt
// needs (an open file, a connection); those are not checkpointed, and a
// restored handle has them zero.
//
// The sink calls the methods of one transaction from one subtask
// goroutine, in this order: Begin; Write (or WriteBatch) any number of
// times; PreCommit; then, once a checkpoint covering it completed, Commit,
// or after a restore RecoverAndCommit. A transaction that is not to be
// committed gets Abort, or after a restore RecoverAndAbort. Implementations
// shared by several subtasks must be safe for concurrent use across
// transactions.
//
//   - Begin starts a transaction named txn. txn is unique and stable:
//     use txn.Name() for anything the external system needs to name it.
//   - PreCommit makes the transaction durable and ready to commit, not
//     visible: after it returns, Commit and RecoverAndCommit must succeed
//     eventually (a flush and fsync, a PREPARE TRANSACTION). checkpoint is
//     the checkpoint that pre-commits it (EndOfInput at the end of the
//     input of a job without checkpointing); a system may record it with
//     the transaction (see StaleAborter).
//   - Commit makes it visible. It must be idempotent: it is retried after
//     an error, possibly after it took effect.
//   - RecoverAndCommit commits a transaction restored from a checkpoint.
//     The sink does not know whether it was committed before (the
//     notification may have been lost, or the commit done just before a
//     failure): committing an already committed transaction must succeed
//     without effect. An error that no retry can cure should wrap
//     restore.ErrUnrecoverable: the job then fails at once, naming the
//     transaction, instead of retrying.
//   - Abort discards a transaction that was never pre-committed, and
//     RecoverAndAbort one restored from a checkpoint that had begun but not
//     pre-committed it. That transaction may have been pre-committed
//     since, for a checkpoint that did not complete; its records are
//     replayed into a new transaction. Both must be idempotent, must
//     accept a transaction that is gone already, and must leave a
//     committed one alone (a restore of an older checkpoint).
type TwoPhaseCommitter[T, H any] interface {
	Begin(txn TxnID) (H, error)
	Write(h H, rec T) error
	PreCommit(h H, checkpoint int64) error
	Commit(h H) error
	Abort(h H) error
	RecoverAndCommit(h H) error
	RecoverAndAbort(h H) error
}

// BatchWriter is an optional, faster form of TwoPhaseCommitter.Write that
// receives a whole buffer of records at a time. The slice is valid only
// during the call.
type BatchWriter[T, H any] interface {
	WriteBatch(h H, recs []T) error
}

// LingeringAborter is an optional interface of a TwoPhaseCommitter that
// can find the transactions the failed attempts of an execution left
// behind. A restarted subtask (attempt > 0) calls it once, after it
// recovered the restored transactions and before it begins one.
type LingeringAborter interface {
	// AbortLingering aborts every transaction l contains that is not
	// committed, as RecoverAndAbort would. It must not touch committed
	// transactions.
	AbortLingering(l Lingering) error
}

// StaleAborter is an optional interface of a TwoPhaseCommitter whose
// system keeps pre-committed transactions, and the locks they hold, until
// they are resolved, across process deaths (PostgreSQL's prepared
// transactions): a transaction a killed process pre-committed for a
// checkpoint that never completed would block the replayed rows forever,
// and no restored state names it. A subtask calls AbortStale once, when
// the job was restored or restarted (Stale.Restored or Stale.Attempt not
// zero), after it recovered the restored transactions and before it
// begins one.
type StaleAborter interface {
	// AbortStale aborts every uncommitted transaction s contains. It must
	// not touch committed transactions, nor those of the current attempt
	// (another subtask of it may have pre-committed one already).
	AbortStale(s Stale) error
}

// EndAborter is an optional interface of a TwoPhaseCommitter whose
// pre-committed transactions hold resources until they are resolved
// (PostgreSQL's prepared transactions hold row locks and VACUUM's
// horizon). When the job's execution ends for good (it finished, stopped,
// was cancelled or failed beyond its restart strategy: graph.JobEnd), the
// sink calls AbortUncovered once, so that what the execution pre-committed
// for checkpoints that never completed does not wait for a restore that
// may never come.
type EndAborter interface {
	// AbortUncovered aborts every uncommitted transaction u contains. It
	// must not touch committed transactions, nor those of other commit
	// users, sinks or executions.
	AbortUncovered(u Uncovered) error
}

// Uncovered describes the pre-committed transactions of an execution that
// ended for good that no completed checkpoint covers: those of its commit
// user, sink and execution pre-committed for a checkpoint after
// Completed, the newest checkpoint or savepoint it completed (or
// restored). No restore can name them (a restore resumes from a completed
// checkpoint, at most Completed), and no later checkpoint of the
// execution completes. Those up to Completed stay: a restore of Completed
// commits them.
type Uncovered struct {
	CommitUser, Sink, Execution string
	Completed                   int64
}

// Contains reports whether a transaction id pre-committed for checkpoint
// is uncovered.
func (u Uncovered) Contains(id TxnID, checkpoint int64) bool {
	return id.CommitUser == u.CommitUser && id.Sink == u.Sink && id.Execution == u.Execution && checkpoint > u.Completed
}

// Stale describes the pre-committed transactions a restored or restarted
// sink subtask may find that no restored state names: those of its commit
// user and sink pre-committed for a checkpoint after Restored by any other
// attempt or execution than the current one. With Restored the newest
// completed checkpoint (a restart, Restore.Latest), those checkpoints
// never completed, so their records are replayed. Every pre-committed
// transaction of a checkpoint up to Restored is pending in the restored
// state or committed. A fork of a running job that keeps its commit
// user would abort what the running job pre-committed: a fork passes
// WithCommitUser.
type Stale struct {
	CommitUser, Sink string
	// Restored is the restored checkpoint, 0 if the attempt restored none.
	Restored int64
	// Execution and Attempt are the current ones, whose transactions are
	// never stale.
	Execution string
	Attempt   int
}

// Contains reports whether a transaction id pre-committed for checkpoint
// is stale.
func (s Stale) Contains(id TxnID, checkpoint int64) bool {
	return id.CommitUser == s.CommitUser && id.Sink == s.Sink && checkpoint > s.Restored &&
		(id.Execution != s.Execution || id.Attempt != s.Attempt)
}

// Lingering describes the transactions a restarted subtask may find that
// no checkpoint it can restore names: those its subtask began in earlier
// attempts of the same execution after the newest one the restored state
// names. They were begun after the restored checkpoint's barrier, or
// pre-committed for checkpoints that never completed (else the restart
// would have restored a later one), and the subtask that began them is
// gone, so their records are replayed and they are to be
// aborted. Transactions of other executions are never lingering: another
// execution may still run, or restore a later checkpoint of its own.
type Lingering struct {
	CommitUser, Execution, Sink string
	Subtask                     int
	// Attempt is the restarted attempt: lingering transactions began in an
	// earlier one.
	Attempt int
	// After, if not nil, is the newest transaction of this subtask and
	// execution in the restored state: only transactions begun after it
	// (a later attempt, or a higher Seq in its attempt) linger.
	After *TxnID
}

// Contains reports whether id is one of the lingering transactions.
func (l Lingering) Contains(id TxnID) bool {
	if id.CommitUser != l.CommitUser || id.Execution != l.Execution || id.Sink != l.Sink ||
		id.Subtask != l.Subtask || id.Attempt >= l.Attempt {
		return false
	}
	return l.After == nil || id.after(*l.After)
}

// after reports whether t began after u, both of one subtask of one
// execution.
func (t TxnID) after(u TxnID) bool {
	return t.Attempt > u.Attempt || t.Attempt == u.Attempt && t.Seq > u.Seq
}

// TxnID names a transaction of a TwoPhaseCommit sink. It is chosen when
// the transaction begins, so unlike Txn it cannot carry the checkpoint that
// will pre-commit it; the attempt and a sequence number within the attempt
// take its place. Every field is part of the identity.
type TxnID struct {
	// CommitUser is the sink's identity across restarts and restores, as
	// in Txn (CommitUserState).
	CommitUser string `msgpack:"user"`
	// Execution is the execution (graph.TaskInfo.Execution) that began
	// the transaction.
	Execution string `msgpack:"exec"`
	Sink      string `msgpack:"sink"`
	Subtask   int    `msgpack:"subtask"`
	// Attempt is the attempt of the execution that began the transaction
	// (graph.TaskInfo.Attempt).
	Attempt int `msgpack:"attempt"`
	// Seq counts the transactions the subtask began in the attempt, from 0.
	Seq int64 `msgpack:"seq"`
}

// String is "sink-subtask@execution/attempt#seq".
func (t TxnID) String() string {
	return fmt.Sprintf("%s-%d@%s/%d#%d", t.Sink, t.Subtask, t.Execution, t.Attempt, t.Seq)
}

// Name is a unique name made of every field of t, safe as a file name and
// as an identifier in most systems: "sink_subtask_attempt_seq_execution_user",
// each string field with every byte outside [A-Za-z0-9-] written as %XX.
// Different TxnIDs have different names.
func (t TxnID) Name() string {
	var b strings.Builder
	escapeName(&b, t.Sink)
	for _, n := range []int64{int64(t.Subtask), int64(t.Attempt), t.Seq} {
		b.WriteByte('_')
		b.WriteString(strconv.FormatInt(n, 10))
	}
	b.WriteByte('_')
	escapeName(&b, t.Execution)
	b.WriteByte('_')
	escapeName(&b, t.CommitUser)
	return b.String()
}

// ParseTxnName returns the TxnID whose Name is name.
func ParseTxnName(name string) (TxnID, error) {
	parts := strings.Split(name, "_")
	if len(parts) != 6 {
		return TxnID{}, fmt.Errorf("sink: %q is not a transaction name", name)
	}
	var id TxnID
	var nums [3]int64
	for i, s := range parts[1:4] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || strconv.FormatInt(n, 10) != s {
			return TxnID{}, fmt.Errorf("sink: %q is not a transaction name", name)
		}
		nums[i] = n
	}
	var err1, err2, err3 error
	id.Sink, err1 = unescapeName(parts[0])
	id.Execution, err2 = unescapeName(parts[4])
	id.CommitUser, err3 = unescapeName(parts[5])
	if err := errors.Join(err1, err2, err3); err != nil {
		return TxnID{}, fmt.Errorf("sink: %q is not a transaction name: %w", name, err)
	}
	id.Subtask, id.Attempt, id.Seq = int(nums[0]), int(nums[1]), nums[2]
	if id.Name() != name {
		return TxnID{}, fmt.Errorf("sink: %q is not a transaction name", name)
	}
	return id, nil
}

func unescapeName(s string) (string, error) {
	if !strings.Contains(s, "%") {
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] != '%' {
			b = append(b, s[i])
			continue
		}
		if i+2 >= len(s) {
			return "", errors.New("truncated escape")
		}
		v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
		if err != nil {
			return "", err
		}
		b = append(b, byte(v))
		i += 2
	}
	return string(b), nil
}

func escapeName(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}

// TwoPhaseState is the name of the operator list state of a TwoPhaseCommit
// sink: one element per transaction it holds, the pre-committed ones with
// the checkpoint that pre-committed them and the open one (see the package
// documentation).
const TwoPhaseState = "two-phase-transactions"

// txnEntry is one element of TwoPhaseState.
type txnEntry[H any] struct {
	Txn TxnID `msgpack:"txn"`
	// Checkpoint pre-committed the transaction; 0 when Open.
	Checkpoint int64 `msgpack:"checkpoint,omitempty"`
	// Open: begun, not pre-committed (aborted on restore).
	Open   bool `msgpack:"open,omitempty"`
	Handle H    `msgpack:"handle"`
}

// Retry says how a TwoPhaseCommit sink retries a commit, a recover-and-
// commit and an abort before it fails the job. The zero value is the
// default: 5 attempts, 10ms before the second, doubling up to 1s.
type Retry struct {
	// Attempts is the number of tries per operation (default 5; 1 does not
	// retry).
	Attempts int
	// Backoff is the wait before the second try; it doubles after each
	// (default 10ms).
	Backoff time.Duration
	// MaxBackoff caps the wait (default 1s).
	MaxBackoff time.Duration
	// Sleep waits (default time.Sleep). The subtask handles nothing else
	// meanwhile.
	Sleep func(time.Duration)
}

func (r Retry) withDefaults() Retry {
	if r.Attempts <= 0 {
		r.Attempts = 5
	}
	if r.Backoff <= 0 {
		r.Backoff = 10 * time.Millisecond
	}
	if r.MaxBackoff <= 0 {
		r.MaxBackoff = time.Second
	}
	if r.MaxBackoff < r.Backoff {
		r.MaxBackoff = r.Backoff
	}
	if r.Sleep == nil {
		r.Sleep = time.Sleep
	}
	return r
}

// TxnError is the error of a transaction operation that failed for good
// (after Retry's attempts, or at once when the error wraps
// restore.ErrUnrecoverable). It names the transaction, whose handle stays
// in the sink's state: the job fails, and the attempt that restores the
// newest checkpoint commits (or aborts) it again.
type TxnError struct {
	// Op is "commit", "recover-and-commit", "recover-and-abort", "abort" or
	// "pre-commit".
	Op  string
	Txn TxnID
	// Checkpoint pre-committed the transaction (0 if it was open).
	Checkpoint int64
	// Handle is the transaction's handle (H).
	Handle   any
	Attempts int
	Err      error
}

func (e *TxnError) Error() string {
	ckpt := "open"
	if e.Checkpoint != 0 {
		ckpt = "checkpoint " + strconv.FormatInt(e.Checkpoint, 10)
	}
	return fmt.Sprintf("sink: %s of transaction %v (%s, handle %+v) failed after %d attempt(s): %v",
		e.Op, e.Txn, ckpt, e.Handle, e.Attempts, e.Err)
}

func (e *TxnError) Unwrap() error { return e.Err }

// TwoPhaseCommit returns a sink factory that drives c by the checkpoint
// protocol (see the package documentation), with the default Retry. opts
// are those of Publishing (WithCommitUser, WithLogf).
func TwoPhaseCommit[T, H any](c TwoPhaseCommitter[T, H], opts ...Option) func() graph.SinkFunc[T] {
	return TwoPhaseCommitWithRetry(c, Retry{}, opts...)
}

// TwoPhaseCommitWithRetry is TwoPhaseCommit with the given Retry.
func TwoPhaseCommitWithRetry[T, H any](c TwoPhaseCommitter[T, H], retry Retry, opts ...Option) func() graph.SinkFunc[T] {
	o := options{logf: log.Printf}
	for _, opt := range opts {
		opt(&o)
	}
	if o.user == "" {
		o.user = newCommitUser()
	}
	retry = retry.withDefaults()
	batch, _ := c.(BatchWriter[T, H])
	return func() graph.SinkFunc[T] {
		return &twoPhase[T, H]{c: c, batch: batch, retry: retry, opts: o, user: o.user}
	}
}

// twoPhase is the sink function of TwoPhaseCommit. Every method runs on
// the subtask goroutine.
type twoPhase[T, H any] struct {
	c     TwoPhaseCommitter[T, H]
	batch BatchWriter[T, H]
	retry Retry
	opts  options
	user  string
	info  graph.TaskInfo
	ckpt  bool
	state *state.List[txnEntry[H]]
	// open is the transaction records go to; nil before InitializeState
	// and after the end of input.
	open    *txnEntry[H]
	written int // records written to open
	seq     int64
	ended   bool
	// pending are pre-committed, not yet committed, ascending checkpoint.
	pending []txnEntry[H]
}

func (p *twoPhase[T, H]) InitializeState(ctx *graph.Context) error {
	id, _ := ctx.RestoredCheckpoint()
	return p.initialize(ctx.Task(), ctx.CheckpointingEnabled(), id, ctx.OperatorState(), envOf(ctx))
}

func (p *twoPhase[T, H]) initialize(info graph.TaskInfo, ckpt bool, restoredID int64, ops *state.OperatorStore, env restoreEnv) error {
	p.info, p.ckpt = info, ckpt
	user, _, err := restoreCommitUser(ops, p.opts, info, p.user, env, "")
	if err != nil {
		return err
	}
	p.user = user
	if hr, ok := p.c.(HorizonReporter); ok {
		retry := func(f func() error) (int, error) { return p.withRetry("committed-horizon", "commit user "+user, f) }
		if err := checkHorizon(hr, user, info, restoredID, env.allowRepublish, retry, p.opts.logf); err != nil {
			return err
		}
	}
	l, err := state.ListState[txnEntry[H]](ops, TwoPhaseState)
	if err != nil {
		return err
	}
	p.state = l
	// Recover: every pre-committed transaction in the restored state
	// belongs to a checkpoint up to the restored one, which completed, so
	// it is committed, in checkpoint order (P3). Whether it was committed
	// before is unknown (a lost notification, a failure after the commit),
	// hence RecoverAndCommit, idempotent. The open transactions were begun
	// after the restored checkpoint's barrier: their records are replayed,
	// so they are aborted. With a changed parallelism a subtask may get
	// several of either, of other subtasks; their handles are
	// self-contained. Only transactions of this sink's commit user are
	// touched (P8): the others belong to the job that took the checkpoint,
	// which this one forks.
	restored := slices.Clone(l.Get())
	slices.SortStableFunc(restored, func(a, b txnEntry[H]) int {
		if a.Open != b.Open {
			if a.Open {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.Checkpoint, b.Checkpoint)
	})
	var others []TxnID
	for _, e := range restored {
		switch {
		case e.Txn.CommitUser != p.user:
			others = append(others, e.Txn)
		case e.Open:
			if err := p.try("recover-and-abort", e, p.c.RecoverAndAbort); err != nil {
				return err
			}
		default:
			if err := p.try("recover-and-commit", e, p.c.RecoverAndCommit); err != nil {
				return err
			}
		}
	}
	if len(others) > 0 {
		p.opts.logf("sink %v: left alone %d restored transaction(s) of another commit user than %s (%v...): the job that took the checkpoint commits or aborts them (P8)",
			info, len(others), p.user, others[0])
	}
	l.Clear()
	if la, ok := p.c.(LingeringAborter); ok && info.Attempt > 0 {
		if err := p.abortLingering(la, restored); err != nil {
			return err
		}
	}
	if sa, ok := p.c.(StaleAborter); ok && (restoredID > 0 || info.Attempt > 0) {
		s := Stale{CommitUser: p.user, Sink: info.UID, Restored: restoredID, Execution: info.Execution, Attempt: info.Attempt}
		what := "the stale transactions of " + info.String()
		if n, err := p.withRetry("abort", what, func() error { return sa.AbortStale(s) }); err != nil {
			return fmt.Errorf("sink: abort of %s (%+v) failed after %d attempt(s): %w", what, s, n, err)
		}
	}
	if ea, ok := p.c.(EndAborter); ok && env.onJobEnd != nil {
		user := p.user
		env.onJobEnd("sink.TwoPhaseCommit/"+info.UID, func(end graph.JobEnd) error {
			u := Uncovered{CommitUser: user, Sink: info.UID, Execution: end.Execution, Completed: end.Completed}
			what := fmt.Sprintf("the transactions of sink %q, execution %s, uncovered by checkpoint %d", info.UID, end.Execution, end.Completed)
			if n, err := p.withRetry("abort", what, func() error { return ea.AbortUncovered(u) }); err != nil {
				return fmt.Errorf("sink: abort of %s (%+v) failed after %d attempt(s): %w", what, u, n, err)
			}
			return nil
		})
	}
	return p.begin()
}

// abortLingering aborts the transactions earlier attempts of this
// execution began after the newest one of this subtask in the restored
// state (see Lingering).
func (p *twoPhase[T, H]) abortLingering(la LingeringAborter, restored []txnEntry[H]) error {
	l := Lingering{CommitUser: p.user, Execution: p.info.Execution, Sink: p.info.UID, Subtask: p.info.Subtask, Attempt: p.info.Attempt}
	for _, e := range restored {
		id := e.Txn
		if id.CommitUser == l.CommitUser && id.Execution == l.Execution && id.Sink == l.Sink && id.Subtask == l.Subtask &&
			(l.After == nil || id.after(*l.After)) {
			l.After = &id
		}
	}
	what := "the lingering transactions of " + p.info.String()
	if n, err := p.withRetry("abort", what, func() error { return la.AbortLingering(l) }); err != nil {
		return fmt.Errorf("sink: abort of %s (%+v) failed after %d attempt(s): %w", what, l, n, err)
	}
	return nil
}

// begin opens a new transaction.
func (p *twoPhase[T, H]) begin() error {
	id := TxnID{CommitUser: p.user, Execution: p.info.Execution, Sink: p.info.UID, Subtask: p.info.Subtask, Attempt: p.info.Attempt, Seq: p.seq}
	p.seq++
	h, err := p.c.Begin(id)
	if err != nil {
		return fmt.Errorf("sink: begin transaction %v: %w", id, err)
	}
	p.open, p.written = &txnEntry[H]{Txn: id, Open: true, Handle: h}, 0
	return nil
}

func (p *twoPhase[T, H]) ensureOpen() error {
	if p.open != nil {
		return nil
	}
	if p.ended {
		return fmt.Errorf("sink: %v: record after the end of input", p.info)
	}
	return p.begin()
}

func (p *twoPhase[T, H]) Write(_ *graph.Context, rec T) error {
	if err := p.ensureOpen(); err != nil {
		return err
	}
	if err := p.c.Write(p.open.Handle, rec); err != nil {
		return fmt.Errorf("sink: write to transaction %v: %w", p.open.Txn, err)
	}
	p.written++
	return nil
}

func (p *twoPhase[T, H]) WriteBatch(ctx *graph.Context, recs []T) error {
	if p.batch == nil {
		for _, r := range recs {
			if err := p.Write(ctx, r); err != nil {
				return err
			}
		}
		return nil
	}
	if len(recs) == 0 {
		return nil
	}
	if err := p.ensureOpen(); err != nil {
		return err
	}
	if err := p.batch.WriteBatch(p.open.Handle, recs); err != nil {
		return fmt.Errorf("sink: write to transaction %v: %w", p.open.Txn, err)
	}
	p.written += len(recs)
	return nil
}

// SnapshotState pre-commits the open transaction under the checkpoint id
// and begins the next one. An open transaction with no records stays open
// across the checkpoint (nothing to commit). The state then holds the
// pending transactions and the open one.
func (p *twoPhase[T, H]) SnapshotState(ctx *graph.SnapshotContext) error {
	if p.open != nil && p.written > 0 {
		e := *p.open
		if err := p.c.PreCommit(e.Handle, ctx.CheckpointID); err != nil {
			return &TxnError{Op: "pre-commit", Txn: e.Txn, Checkpoint: ctx.CheckpointID, Handle: e.Handle, Attempts: 1, Err: err}
		}
		e.Open, e.Checkpoint = false, ctx.CheckpointID
		p.pending = append(p.pending, e)
		p.open = nil
		if !p.ended {
			if err := p.begin(); err != nil {
				return err
			}
		}
	}
	entries := slices.Clip(p.pending)
	if p.open != nil {
		entries = append(entries, *p.open)
	}
	p.state.Update(entries)
	return nil
}

// NotifyCheckpointComplete commits every pending transaction up to id, in
// checkpoint order, each removed once committed (P3: completing id
// subsumes lost notifications). A commit that fails Retry's attempts fails
// the job with a TxnError; the transaction stays pending (P6).
func (p *twoPhase[T, H]) NotifyCheckpointComplete(id int64) error {
	for len(p.pending) > 0 && p.pending[0].Checkpoint <= id {
		if err := p.try("commit", p.pending[0], p.c.Commit); err != nil {
			return err
		}
		p.pending = p.pending[1:]
	}
	return nil
}

// NotifyCheckpointAborted keeps the pending transactions: a later
// checkpoint's completion commits them (subsumption).
func (p *twoPhase[T, H]) NotifyCheckpointAborted(int64) error { return nil }

// EndInput: no record follows. An open transaction with no records is
// aborted. With checkpointing the other one stays open: the final
// checkpoint pre-commits it and its completion commits it (P1). Without
// checkpointing it is pre-committed and committed now.
func (p *twoPhase[T, H]) EndInput(*graph.Context) error {
	p.ended = true
	if p.open == nil {
		return nil
	}
	e := *p.open
	if p.written == 0 {
		p.open = nil
		return p.try("abort", e, p.c.Abort)
	}
	if p.ckpt {
		return nil
	}
	if err := p.c.PreCommit(e.Handle, EndOfInput); err != nil {
		return &TxnError{Op: "pre-commit", Txn: e.Txn, Checkpoint: EndOfInput, Handle: e.Handle, Attempts: 1, Err: err}
	}
	p.open = nil
	return p.try("commit", e, p.c.Commit)
}

// Close aborts the open transaction, which no checkpoint pre-committed: a
// restore aborts it too. An error is logged: the transaction is an orphan
// then (see the package documentation).
func (p *twoPhase[T, H]) Close() error {
	if p.open == nil {
		return nil
	}
	e := *p.open
	p.open = nil
	if err := p.c.Abort(e.Handle); err != nil {
		p.opts.logf("sink %v: abort of open transaction %v (handle %+v) on close: %v", p.info, e.Txn, e.Handle, err)
	}
	return nil
}

// try runs f on e's handle with retries (withRetry); a failure for good
// is a TxnError naming the transaction.
func (p *twoPhase[T, H]) try(op string, e txnEntry[H], f func(H) error) error {
	n, err := p.withRetry(op, "transaction "+e.Txn.String(), func() error { return f(e.Handle) })
	if err != nil {
		return &TxnError{Op: op, Txn: e.Txn, Checkpoint: e.Checkpoint, Handle: e.Handle, Attempts: n, Err: err}
	}
	return nil
}

// withRetry runs f with p's Retry, logging each failure it retries, and
// returns the number of attempts and the last error.
func (p *twoPhase[T, H]) withRetry(op, what string, f func() error) (int, error) {
	return p.retry.do(f, func(attempt int, delay time.Duration, err error) {
		p.opts.logf("sink %v: %s of %s failed (attempt %d of %d), retrying in %v: %v",
			p.info, op, what, attempt, p.retry.Attempts, delay, err)
	})
}

// do runs f up to r.Attempts times with exponential backoff, calling
// onRetry before each retry, and returns the number of attempts and the
// last error. An error wrapping restore.ErrUnrecoverable is not retried.
func (r Retry) do(f func() error, onRetry func(attempt int, delay time.Duration, err error)) (int, error) {
	delay := r.Backoff
	for attempt := 1; ; attempt++ {
		err := f()
		if err == nil {
			return attempt, nil
		}
		if attempt >= r.Attempts || errors.Is(err, restore.ErrUnrecoverable) {
			return attempt, err
		}
		onRetry(attempt, delay, err)
		r.Sleep(delay)
		delay = min(2*delay, r.MaxBackoff)
	}
}
