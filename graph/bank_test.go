package graph_test

// Chandy and Lamport's bank, as a conservation test of checkpoints of a
// cyclic graph.
//
// Chandy and Lamport ("Distributed Snapshots: Determining Global States of
// Distributed Systems", 1985) explain their algorithm with a bank: processes
// hold accounts and send money to each other in messages. A snapshot is
// consistent iff the money it finds, in the recorded state of every process
// plus in the messages recorded as in flight on every channel (sent before
// the sender's snapshot, received after the receiver's), equals the money
// the bank started with: a snapshot that missed a message in flight loses
// money, one that saw a message both in flight and received (or in its
// sender's state before sending and in flight) makes money.
//
// The job here is that bank. bankAccounts is a keyed operator in a loop
// (graph.Iterate), keyed by account: K accounts, each starting with
// bankInitial (an account without state yet holds bankInitial, so state
// appears lazily). The source emits transfer orders, which carry no money.
// An order, at its From account, debits its amount there and sends a credit
// carrying the money into the loop, over the feedback edge, to its To
// account. A credit that still has hops to go is credited, a third of it
// is kept and the rest is debited again and sent on to the next account
// (derived from the transfer id and the hop); a credit with no hops left is
// credited and a "settled" record for the transfer leaves the loop, to an
// exactly-once sink. So at any cut the money is in two places only: the
// balances in the accounts' keyed state and the credits in channels
// (records are never in flight between chained operators: a chain
// snapshots after flushing them). In a checkpoint the first is the keyed
// state of "accounts", the second its channel state: the in-flight buffers
// that unaligned barriers overtook (output channel state), those that
// arrived after a subtask's snapshot and before the channel's barrier
// (input channel state), and what the loop head recorded on its feedback
// channels, in aligned mode too (package align, "Feedback channels").
// The accounts' output has two consumers, the credits filter that closes
// the loop and settle, the exit, so each credit is also copied onto the
// edge to settle, which drops it: those copies are not money. settle is
// keyed by a string, so its channel elements (task.Keyed with a string key)
// differ in shape from every other channel's and the check can tell them
// apart without knowing the engine's edge numbering (bankElements).
//
// For every completed checkpoint of every run, in every checkpoint mode:
//
//	sum of balances in state + sum of the credits in channel state == K * bankInitial
//
// and no transfer has two credits in flight (each transfer has exactly one
// message in the system until it settles), each of them exactly the credit
// that transfer sends at that hop. The final checkpoint's balances equal
// the balances computed directly from the set of transfers (balances may
// go negative, so the result does not depend on the order in which the
// transfers arrive), and every transfer settled exactly once. Restoring any
// completed checkpoint and running on to the end keeps all of that, and so
// do runs with injected failures that restart from the latest checkpoint.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"github.com/snapflow/snapflow/graph"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/restore"
	"github.com/snapflow/snapflow/sink"
	"github.com/snapflow/snapflow/snapshot/inspect"
	"github.com/snapflow/snapflow/source"
	"github.com/snapflow/snapflow/state"
)

const (
	bankAccounts = 16
	bankInitial  = 1_000_000
	bankTotal    = bankAccounts * bankInitial
	// bankTransfers is the number of transfer orders per run. Each order
	// makes 2 to 5 records go through the accounts (1 + its hops).
	bankTransfers = 30_000
	// bankBalance is the name of the accounts' keyed value state.
	bankBalance = "balance"
)

// Record kinds.
const (
	bankOrder   int8 = 1 // a transfer order, at its From account; no money
	bankCredit  int8 = 2 // Amount of money on its way to account At
	bankSettled int8 = 3 // transfer ID is done; no money
)

// bankMsg is every record of the bank job. Its six fields make its msgpack
// encoding (an array of six) distinct from the three-field keyed wrapper of
// hash edges (see bankElements).
type bankMsg struct {
	Kind int8  `msgpack:"k"`
	ID   int64 `msgpack:"i"`
	// At is the account that handles the record: From for an order, the
	// credited account for a credit, the last one for a settled record.
	At     int64 `msgpack:"a"`
	To     int64 `msgpack:"t"` // orders: the account to credit
	Amount int64 `msgpack:"m"`
	Hops   int64 `msgpack:"h"` // hops left after the credit at At
}

// bankMix is splitmix64's finalizer: every random choice of a transfer is
// a function of the seed and the transfer id, so every run of one seed has
// the same transfers whatever the scheduling.
func bankMix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func bankRand(seed uint64, id int64, salt uint64) uint64 {
	return bankMix(seed ^ bankMix(uint64(id)*8+salt))
}

// bankOrderOf is transfer order id: from a random account to another, a
// random amount, 0 to 3 more hops after the first credit.
func bankOrderOf(seed uint64, id int64) bankMsg {
	from := int64(bankRand(seed, id, 1) % bankAccounts)
	to := (from + 1 + int64(bankRand(seed, id, 2)%(bankAccounts-1))) % bankAccounts
	return bankMsg{Kind: bankOrder, ID: id, At: from, To: to,
		Amount: 1 + int64(bankRand(seed, id, 3)%10_000), Hops: int64(bankRand(seed, id, 4) % 4)}
}

// bankNext is the account a credit of transfer id goes to from a hop with
// hops left.
func bankNext(seed uint64, id, hops int64) int64 {
	return int64(bankRand(seed, id, 4+uint64(hops)) % bankAccounts)
}

// bankKeep is what a hop keeps of a credit.
func bankKeep(amount int64) int64 { return amount / 3 }

// bankCredits returns the credits transfer id sends, in order: the one
// with Hops h is at index Hops(order) - h.
func bankCredits(seed uint64, id int64) []bankMsg {
	o := bankOrderOf(seed, id)
	c := bankMsg{Kind: bankCredit, ID: id, At: o.To, Amount: o.Amount, Hops: o.Hops}
	out := []bankMsg{c}
	for c.Hops > 0 {
		c.At, c.Amount, c.Hops = bankNext(seed, id, c.Hops), c.Amount-bankKeep(c.Amount), c.Hops-1
		out = append(out, c)
	}
	return out
}

// bankExpected returns the balances after every transfer, computed
// directly.
func bankExpected(seed uint64, n int64) []int64 {
	bal := make([]int64, bankAccounts)
	for i := range bal {
		bal[i] = bankInitial
	}
	for id := int64(0); id < n; id++ {
		o := bankOrderOf(seed, id)
		bal[o.At] -= o.Amount
		cs := bankCredits(seed, id)
		for i, c := range cs {
			bal[c.At] += c.Amount
			if i+1 < len(cs) {
				bal[c.At] -= cs[i+1].Amount
			}
		}
	}
	return bal
}

// bankAccount is the accounts operator (see the file comment). It pauses
// now and then (random scheduling: channels fill, barriers overtake data),
// and fails like runningSum: attempt a fails at the first record, from the
// failAt[a]-th its attempt's subtasks saw, that a subtask sees after it was
// notified of a completed checkpoint of the attempt.
type bankAccount struct {
	seed      uint64
	balance   *state.ValueState[int64, int64]
	rng       *rand.Rand
	failAt    []int64
	counters  []atomic.Int64
	fired     []atomic.Bool
	completed bool
}

func (a *bankAccount) InitializeState(ctx *graph.Context) error {
	info := ctx.Task()
	a.rng = rand.New(rand.NewPCG(a.seed, uint64(info.Subtask)<<16|uint64(info.Attempt)))
	v, err := state.Value[int64, int64](graph.KeyedState[int64](ctx), bankBalance)
	a.balance = v
	return err
}

func (a *bankAccount) NotifyCheckpointComplete(int64) error {
	a.completed = true
	return nil
}

func (a *bankAccount) NotifyCheckpointAborted(int64) error { return nil }

func (a *bankAccount) Process(ctx *graph.KeyedContext[int64], m bankMsg, out graph.Collector[bankMsg]) error {
	if at := ctx.Task().Attempt; at < len(a.failAt) && a.failAt[at] > 0 {
		if seen := a.counters[at].Add(1); seen >= a.failAt[at] && a.completed && a.fired[at].CompareAndSwap(false, true) {
			return fmt.Errorf("injected failure at record %d of attempt %d", seen, at)
		}
	}
	if a.rng.IntN(3000) == 0 {
		time.Sleep(time.Duration(a.rng.IntN(1000)) * time.Microsecond)
	}
	if m.At != ctx.CurrentKey() {
		return fmt.Errorf("record %+v at account %d", m, ctx.CurrentKey())
	}
	b, ok := a.balance.Value()
	if !ok {
		b = bankInitial
	}
	switch m.Kind {
	case bankOrder:
		b -= m.Amount
		out.Collect(bankMsg{Kind: bankCredit, ID: m.ID, At: m.To, Amount: m.Amount, Hops: m.Hops})
	case bankCredit:
		b += m.Amount
		if m.Hops == 0 {
			out.Collect(bankMsg{Kind: bankSettled, ID: m.ID, At: m.At})
			break
		}
		fwd := m.Amount - bankKeep(m.Amount)
		b -= fwd
		out.Collect(bankMsg{Kind: bankCredit, ID: m.ID, At: bankNext(a.seed, m.ID, m.Hops), Amount: fwd, Hops: m.Hops - 1})
	default:
		return fmt.Errorf("accounts: unexpected record %+v", m)
	}
	a.balance.Update(b)
	return nil
}

// bankSettle takes the settled records out of the loop: the transfer ids,
// for the sink. It is keyed by a string, so that its hash edge's channel
// elements (keyed records with string keys) tell its copies of the credits
// apart from the credits on their way to the accounts (see bankElements).
// It pauses now and then, which backs up the accounts' output.
type bankSettle struct {
	seed uint64 // of the pauses
	rng  *rand.Rand
}

func (s *bankSettle) InitializeState(ctx *graph.Context) error {
	info := ctx.Task()
	s.rng = rand.New(rand.NewPCG(s.seed^0x5e771e, uint64(info.Subtask)<<16|uint64(info.Attempt)))
	return nil
}

func (s *bankSettle) Process(_ *graph.KeyedContext[string], m bankMsg, out graph.Collector[int64]) error {
	if s.rng.IntN(2000) == 0 {
		time.Sleep(time.Duration(s.rng.IntN(2000)) * time.Microsecond) // backpressure into the loop
	}
	if m.Kind == bankSettled {
		out.Collect(m.ID)
	}
	return nil
}

// bankCase is a checkpoint mode and the channel set-up it runs with.
type bankCase struct {
	name      string
	cc        graph.CheckpointConfig
	accountsP int  // parallelism of the accounts (the rest runs at 2)
	unchained bool // DisableChaining: every edge has channels
	capacity  int  // ChannelCapacity
	bufSize   int  // BufferSize
}

var bankCases = []bankCase{
	{name: "aligned", cc: graph.CheckpointConfig{Mode: marker.Aligned}, accountsP: 2, capacity: 4, bufSize: 64},
	{name: "unaligned", cc: graph.CheckpointConfig{Mode: marker.Unaligned, InputSlice: 5}, accountsP: 2, unchained: true, capacity: 2, bufSize: 32},
	{name: "aligned-timeout", cc: graph.CheckpointConfig{Mode: marker.Aligned, AlignedTimeout: time.Millisecond, InputSlice: 3},
		accountsP: 3, capacity: 3, bufSize: 16},
	{name: "unaligned-concurrent", cc: graph.CheckpointConfig{Mode: marker.Unaligned, MaxConcurrent: 3, InputSlice: 20},
		accountsP: 2, unchained: true, capacity: 4, bufSize: 128},
}

// bankCommit is one transaction the committer published for the first
// time.
type bankCommit struct {
	txn sink.Txn
	ids []int64
}

// bankRun is what one execution of the bank job left.
type bankRun struct {
	exec      *graph.Execution
	committer *sink.Memory[int64]
	mu        sync.Mutex
	completed []graph.Event // CheckpointCompleted events, in order
	commits   []bankCommit  // first commits, in order
	fired     []atomic.Bool
}

func (r *bankRun) checkpoints() []graph.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.completed)
}

// startBank starts the bank job of case bc: n transfers of seed, checkpoints
// in dir (all kept), restoring restorePath if not empty, publishing into a
// committer that has first committed the transactions of preCommitted,
// failures injected per failAt.
func startBank(t *testing.T, ctx context.Context, seed uint64, n int64, bc bankCase, dir, restorePath string,
	preCommitted []bankCommit, failAt []int64) *bankRun {
	t.Helper()
	r := &bankRun{committer: sink.NewMemory[int64](), fired: make([]atomic.Bool, len(failAt))}
	for _, c := range preCommitted {
		require.NoError(t, r.committer.Commit(c.txn, c.ids))
	}
	r.committer.OnCommit = func(txn sink.Txn, ids []int64) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.commits = append(r.commits, bankCommit{txn: txn, ids: slices.Clone(ids)})
	}
	cc := bc.cc
	cc.Interval, cc.Dir, cc.Retain, cc.TolerableFailures = 3*time.Millisecond, dir, 1_000_000, -1
	restart := graph.NoRestart()
	if len(failAt) > 0 {
		restart = graph.FixedDelay(len(failAt)+1, time.Millisecond)
	}
	cfg := graph.Config{
		Parallelism:     2,
		Checkpoint:      cc,
		Restart:         restart,
		Restore:         graph.RestoreConfig{Path: restorePath},
		ChannelCapacity: bc.capacity,
		BufferSize:      bc.bufSize,
		DisableChaining: bc.unchained,
		Logf:            t.Logf,
		OnEvent: func(e graph.Event) {
			if e.Kind == graph.CheckpointCompleted && !e.Savepoint {
				r.mu.Lock()
				r.completed = append(r.completed, e)
				r.mu.Unlock()
			}
		},
	}
	job := graph.NewJob("bank", cfg)
	orders := graph.Source(job, "orders", source.Generate(n, func(i int64) bankMsg { return bankOrderOf(seed, i) }))
	it := graph.Iterate(orders)
	counters := make([]atomic.Int64, len(failAt))
	accounts := graph.ProcessKeyed(graph.KeyBy(it.Stream(), func(m bankMsg) int64 { return m.At }), "accounts",
		func() graph.KeyedProcessFunc[int64, bankMsg, bankMsg] {
			return &bankAccount{seed: seed, failAt: failAt, counters: counters, fired: r.fired}
		}, graph.Parallelism(bc.accountsP))
	var pauses atomic.Uint64
	it.CloseWith(graph.Filter(accounts, "credits", func(m bankMsg) bool {
		if k := bankMix(seed ^ pauses.Add(1)); k%4000 == 0 {
			time.Sleep(time.Duration(k>>40%500) * time.Microsecond)
		}
		return m.Kind == bankCredit
	}))
	settled := graph.ProcessKeyed(graph.KeyBy(accounts, func(m bankMsg) string { return strconv.FormatInt(m.ID%61, 10) }), "settle",
		func() graph.KeyedProcessFunc[string, bankMsg, int64] { return &bankSettle{seed: seed} })
	graph.Sink(settled, "sink", sink.Publishing[int64](r.committer, sink.WithLogf(t.Logf)))
	e, err := job.Start(ctx)
	require.NoError(t, err)
	r.exec = e
	return r
}

// wait waits for the run; a run that does not end in time is reported as a
// hang with what it takes to replay it.
func (r *bankRun) wait(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	err := r.exec.Wait()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || ctx.Err() != nil {
		t.Fatalf("%s: the bank job did not end in time (hang?): %v; %d checkpoints completed", what, err, len(r.checkpoints()))
	}
	require.NoError(t, err, what)
}

// bankKeyed is task.Keyed[K, bankMsg], the element type of a hash edge's
// channels, as msgpack encodes it (structs as arrays of their fields, in
// field order: see internal/runtime/task/output.go and channelstate.go).
type bankKeyed[K any] struct {
	Rec      bankMsg
	Key      K
	KeyGroup uint16
}

// Where a channel element was found, by its type.
const (
	elemPlain    = iota // bankMsg: a forward or rebalance edge (accounts -> credits)
	elemKeyedInt        // task.Keyed[int64, bankMsg]: into the accounts (orders, and credits on the feedback edge)
	elemKeyedStr        // task.Keyed[string, bankMsg]: into settle, copies of what the accounts emitted
	elemID              // int64: settle -> sink, unchained
	elemKinds
)

// bankElements decodes one channel-state buffer, a msgpack array of the
// channel's elements, and calls f with each. The element types of the
// job's channels tell themselves apart by their msgpack shape: bankMsg is
// an array of six, task.Keyed an array of three whose key is an integer
// (into the accounts) or a string (into settle), and what settle sends to
// an unchained sink an integer. Any other shape is an error.
func bankElements(buf []byte, f func(m bankMsg, kind int)) error {
	rd := bytes.NewReader(buf)
	dec := msgpack.NewDecoder(rd)
	n, err := dec.DecodeArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		c, err := dec.PeekCode()
		if err != nil {
			return err
		}
		switch {
		case c == msgpcode.FixedArrayLow|6:
			var m bankMsg
			if err := dec.Decode(&m); err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
			f(m, elemPlain)
		case c == msgpcode.FixedArrayLow|3:
			var k bankKeyed[int64]
			kind := elemKeyedInt
			_, err := dec.DecodeArrayLen()
			if err == nil {
				err = dec.Decode(&k.Rec)
			}
			if err == nil {
				c, err = dec.PeekCode()
			}
			if err == nil {
				if msgpcode.IsString(c) {
					kind = elemKeyedStr
					_, err = dec.DecodeString()
				} else {
					k.Key, err = dec.DecodeInt64()
				}
			}
			if err == nil {
				k.KeyGroup, err = dec.DecodeUint16()
			}
			if err != nil {
				return fmt.Errorf("element %d: a keyed record: %w", i, err)
			}
			f(k.Rec, kind)
		case msgpcode.IsFixedNum(c) || (c >= msgpcode.Uint8 && c <= msgpcode.Int64):
			id, err := dec.DecodeInt64()
			if err != nil {
				return fmt.Errorf("element %d: %w", i, err)
			}
			f(bankMsg{Kind: bankSettled, ID: id}, elemID)
		default:
			return fmt.Errorf("element %d: unexpected msgpack code %#x", i, c)
		}
	}
	if rest := rd.Len(); rest > 0 {
		return fmt.Errorf("%d bytes after the elements", rest)
	}
	return nil
}

// bankCut is what one checkpoint holds.
type bankCut struct {
	id       int64
	balances []int64 // per account; bankInitial where there is no state
	inFlight int64   // money in credits in channel state
	credits  int     // credits in channel state (on their way to an account)
	elements [elemKinds]int
	bytes    int64 // channel state payload
}

// loadBankCut reads checkpoint path and checks it: Chandy and Lamport's
// conservation of money over the cut (balances plus credits in flight),
// and at most one credit in flight per transfer, each the one that
// transfer sends at its hop.
func loadBankCut(t *testing.T, seed uint64, path string, what string) bankCut {
	t.Helper()
	md, err := restore.Load(vfs.Default, path)
	require.NoError(t, err, "%s: %s", what, path)
	cut := bankCut{id: md.CheckpointID, balances: make([]int64, bankAccounts)}
	in, out := md.InFlightBytes()
	cut.bytes = in + out
	where := fmt.Sprintf("%s: checkpoint %d (%s)", what, md.CheckpointID, path)

	// The process states: the accounts' balances, read as a restore reads
	// them whatever the backend (inline, keyed-state files, native).
	require.NotNil(t, md.Operator("accounts"), "%s: no state of the accounts", where)
	c, err := inspect.Open(vfs.Default, path)
	require.NoError(t, err, where)
	o, err := c.Operator("accounts")
	require.NoError(t, err, where)
	bals := func(func(int64, int64) bool) {} // an early checkpoint may hold no balance yet
	for _, k := range o.Keyed {
		if k.Name == bankBalance {
			bals, err = inspect.Values[int64, int64](c, "accounts", bankBalance)
			require.NoError(t, err, where)
		}
	}
	seen := make([]bool, bankAccounts)
	for acct, b := range bals {
		require.True(t, acct >= 0 && acct < bankAccounts, "%s: state of account %d", where, acct)
		require.False(t, seen[acct], "%s: two subtasks hold account %d", where, acct)
		seen[acct] = true
		cut.balances[acct] = b
	}
	for acct := range cut.balances {
		if !seen[acct] {
			cut.balances[acct] = bankInitial
		}
	}

	// The channel states: the credits in flight on the way to an account
	// (on the accounts -> credits edge, and on the feedback and input edges
	// into the accounts). The copies of the accounts' output on their way
	// to settle (keyed by a string) are dropped there: they are not money.
	inFlight := map[int64]bankMsg{}
	for _, op := range md.Operators {
		for _, sub := range op.Subtasks {
			if sub.Channels == nil {
				continue
			}
			for _, ch := range sub.Channels.Channels {
				for _, buf := range ch.Buffers {
					err := bankElements(buf, func(m bankMsg, kind int) {
						cut.elements[kind]++
						if m.Kind != bankCredit || kind == elemKeyedStr {
							return
						}
						if prev, dup := inFlight[m.ID]; dup {
							t.Fatalf("%s: transfer %d has two credits in flight: %+v and %+v (%s channel %d/%d of %s[%d]): a duplicate in channel state",
								where, m.ID, prev, m, ch.Kind, ch.Edge, ch.Channel, op.UID, sub.Subtask)
						}
						inFlight[m.ID] = m
						cs := bankCredits(seed, m.ID)
						if m.Hops < 0 || int(m.Hops) >= len(cs) || cs[len(cs)-1-int(m.Hops)] != m {
							t.Fatalf("%s: credit %+v in flight is none that transfer %d sends (%+v)", where, m, m.ID, cs)
						}
						cut.inFlight += m.Amount
						cut.credits++
					})
					require.NoError(t, err, "%s: a %s buffer of %s[%d]", where, ch.Kind, op.UID, sub.Subtask)
				}
			}
		}
	}

	var inState int64
	for _, b := range cut.balances {
		inState += b
	}
	if inState+cut.inFlight != bankTotal {
		t.Fatalf("%s: money is not conserved: %d in the accounts' state + %d in %d credits in channel state = %d, want %d (off by %d); balances %v",
			where, inState, cut.inFlight, cut.credits, inState+cut.inFlight, bankTotal, inState+cut.inFlight-bankTotal, cut.balances)
	}
	return cut
}

// bankStats sums up the cuts of a run.
type bankStats struct {
	checkpoints, withChannelState, withCredits, credits int
	bytes                                               int64
	maxInFlight                                         int64
	elements                                            [elemKinds]int
}

func (s *bankStats) add(c bankCut) {
	s.checkpoints++
	if c.bytes > 0 {
		s.withChannelState++
	}
	if c.credits > 0 {
		s.withCredits++
	}
	s.credits += c.credits
	s.bytes += c.bytes
	s.maxInFlight = max(s.maxInFlight, c.inFlight)
	for i, n := range c.elements {
		s.elements[i] += n
	}
}

func (s bankStats) String() string {
	return fmt.Sprintf("%d checkpoints conserve the money, %d with channel state (%d bytes), %d with credits in it (%d credits, at most %d money in flight); "+
		"channel elements: %d plain, %d keyed into accounts, %d keyed into settle, %d ids",
		s.checkpoints, s.withChannelState, s.bytes, s.withCredits, s.credits, s.maxInFlight,
		s.elements[elemPlain], s.elements[elemKeyedInt], s.elements[elemKeyedStr], s.elements[elemID])
}

// checkBankRun checks every completed checkpoint of r, that the last one is
// the end (the expected balances, nothing in flight) and that the
// committer published every transfer id exactly once.
func checkBankRun(t *testing.T, seed uint64, n int64, r *bankRun, want []int64, what string) (bankStats, []bankCut) {
	t.Helper()
	cps := r.checkpoints()
	require.NotEmpty(t, cps, "%s: no checkpoint completed", what)
	var st bankStats
	cuts := make([]bankCut, len(cps))
	for i, e := range cps {
		if i > 0 {
			require.Greater(t, e.CheckpointID, cps[i-1].CheckpointID, "%s: completed checkpoint ids increase", what)
		}
		cuts[i] = loadBankCut(t, seed, e.Path, what)
		st.add(cuts[i])
	}
	last := cuts[len(cuts)-1]
	require.Equal(t, want, last.balances, "%s: balances in the final checkpoint %d", what, last.id)
	require.Zero(t, last.credits, "%s: credits in flight in the final checkpoint %d", what, last.id)
	requireEachOnce(t, n, r.committer.Published())
	return st, cuts
}

// TestBankConservation is Chandy and Lamport's bank (see the file comment)
// in every checkpoint mode: every completed checkpoint conserves the money,
// and restoring any of them (the first, a random one, the last before the
// end) and running on loses and duplicates no transfer and ends with the
// balances of the failure-free computation.
func TestBankConservation(t *testing.T) {
	seed := testSeed(t)
	const n = bankTransfers
	for ci, bc := range bankCases {
		t.Run(bc.name, func(t *testing.T) {
			seed := bankMix(seed + uint64(ci))
			want := bankExpected(seed, n)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			start := time.Now()
			r := startBank(t, ctx, seed, n, bc, t.TempDir(), "", nil, nil)
			r.wait(t, ctx, bc.name)
			ran := time.Since(start)
			st, cuts := checkBankRun(t, seed, n, r, want, bc.name)
			t.Logf("%s: ran %v; %s", bc.name, ran.Round(time.Millisecond), st)
			require.Positive(t, st.withCredits, "%s: no checkpoint had credits in its channel state: the test proves nothing about channel state", bc.name)

			// Restores. What the committer published up to checkpoint N is
			// what an external system holds when the job is restored from
			// N after a crash: the transactions of checkpoints <= N (those
			// below N it may not have committed yet are pending in N's sink
			// state, and the restored sink commits them again under their
			// original Txn; the commit of N itself is left out every other
			// restore, so that its recommit is exercised too). The new
			// committer starts with those, and after the restored run it
			// must hold every transfer id exactly once.
			// The first checkpoint, a random one with credits in its
			// channel state (so that the restore replays money in flight),
			// and the last before the final one.
			cps := r.checkpoints()
			rng := rand.New(rand.NewPCG(seed, 3))
			var inFlight []int
			for i, c := range cuts[:len(cuts)-1] {
				if c.credits > 0 {
					inFlight = append(inFlight, i)
				}
			}
			picks := []int{0, max(0, len(cps)-2)}
			if len(inFlight) > 0 {
				picks = append(picks, inFlight[rng.IntN(len(inFlight))])
			}
			slices.Sort(picks)
			picks = slices.Compact(picks)
			r.mu.Lock()
			commits := slices.Clone(r.commits)
			r.mu.Unlock()
			for k, p := range picks {
				from := cps[p]
				t.Run(fmt.Sprintf("restore-%d", from.CheckpointID), func(t *testing.T) {
					var pre []bankCommit
					for _, c := range commits {
						if c.txn.CheckpointID < from.CheckpointID || (c.txn.CheckpointID == from.CheckpointID && k%2 == 0) {
							pre = append(pre, c)
						}
					}
					what := fmt.Sprintf("%s restored from checkpoint %d (%d of %d completed, %d credits in flight)",
						bc.name, from.CheckpointID, p+1, len(cps), cuts[p].credits)
					start := time.Now()
					rr := startBank(t, ctx, seed, n, bc, t.TempDir(), from.Path, pre, nil)
					rr.wait(t, ctx, what)
					ran := time.Since(start)
					rs := rr.exec.Stats().LatestRestored
					require.NotNil(t, rs, "%s: restored nothing", what)
					require.Equal(t, from.CheckpointID, rs.ID, what)
					rst, _ := checkBankRun(t, seed, n, rr, want, what)
					t.Logf("%s: ran %v, %d transactions committed before; %s", what, ran.Round(time.Millisecond), len(pre), rst)
				})
			}
		})
	}
}

// TestBankFailures is the bank with failures injected after a checkpoint
// completed, once or twice per run, restarting from the latest completed
// checkpoint, in every mode: every checkpoint conserves the money, every
// transfer settles exactly once, the final balances are the failure-free
// ones, and every failure restored a checkpoint.
func TestBankFailures(t *testing.T) {
	seed := testSeed(t)
	const n = bankTransfers
	// Records through the accounts per attempt: about 3.5 per transfer.
	const records = 3 * n
	for ci, bc := range bankCases {
		seed := bankMix(seed + 100 + uint64(ci))
		rng := rand.New(rand.NewPCG(seed, 4))
		failAt := []int64{1 + rng.Int64N(records/2)}
		if ci%2 == 1 {
			failAt = append(failAt, 1+rng.Int64N(records/4))
		}
		t.Run(fmt.Sprintf("%s/fail-at=%v", bc.name, failAt), func(t *testing.T) {
			want := bankExpected(seed, n)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			what := fmt.Sprintf("%s with failures at %v", bc.name, failAt)
			r := startBank(t, ctx, seed, n, bc, t.TempDir(), "", nil, failAt)
			r.wait(t, ctx, what)
			st, _ := checkBankRun(t, seed, n, r, want, what)
			failures := 0
			for i := range r.fired {
				if r.fired[i].Load() {
					failures++
				}
			}
			require.True(t, r.fired[0].Load(), "%s: the first attempt failed", what)
			es := r.exec.Stats()
			require.Equal(t, failures, es.Counts.Restored, "%s: every failure restored a checkpoint", what)
			require.NotNil(t, es.LatestRestored)
			t.Logf("%s: %d failures, restored checkpoint %d last; %s", what, failures, es.LatestRestored.ID, st)
		})
	}
}
