package cluster

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

var epoch = time.Unix(0, 0).UTC()

// TestScheduler runs the scripts in testdata/scheduler. Each drives one
// Scheduler; times (t=...) are Go durations since the epoch. Commands:
//
//	init hb=D slots=D [rescale] [min-slots=N] [restarts=N delay=D] [latest=N]
//	    the input is the job's shape (parseShape); restarts: Config.Restart
//	    restarts N times after delay, then gives up
//	register t=D id=W slots=N
//	heartbeat t=D id=W session=N [attempt=N]
//	tick t=D
//	cut id=W session=N reason=S                   (ConnectionLost)
//	submit t=D
//	running attempt=N
//	finished attempt=N
//	failed attempt=N err=S
//	completed attempt=N id=N                      (CheckpointCompleted)
//	cancel-job reason=S                           (CancelRequested)
//	state                                         (Scheduler.String, NextDeadline)
//
// Every event prints the actions of its Step, one per line:
//
//	registered <worker> session=N
//	reject <worker> session=N: <reason>
//	lost <worker> session=N: <reason>
//	deploy attempt=N restore=N [parallelism=N] slots=(w/i ...) [network=N/M]
//	cancel attempt=N [on <worker>]: <reason>
//	wait needed=N offered=N until=D
//	finished
//	failed: <error>
//	cancelled latest=N: <reason>
//
// and every Step is checked against CL4-CL6 and CL9 (invariants).
func TestScheduler(t *testing.T) {
	datadriven.Walk(t, "testdata/scheduler", func(t *testing.T, path string) {
		var s *Scheduler
		var inv *invariants
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "init" {
				var err error
				cfg := scriptConfig(t, d)
				s, err = New(cfg)
				require.NoError(t, err)
				inv = newInvariants()
				inv.latest = cfg.Latest
				return ""
			}
			require.NotNil(t, s, "%s: init first", d.Pos)
			if d.Cmd == "state" {
				out := s.String() + "\n"
				if at, ok := s.NextDeadline(); ok {
					out += "next deadline " + at.Sub(epoch).String() + "\n"
				}
				return out
			}
			ev := scriptEvent(t, d)
			acts := s.Step(nil, ev)
			if err := inv.check(ev, acts); err != nil {
				t.Fatalf("%s: %v", d.Pos, err)
			}
			var b strings.Builder
			for _, a := range acts {
				b.WriteString(formatAction(a))
				b.WriteString("\n")
			}
			return b.String()
		})
	})
}

func scriptConfig(t *testing.T, d *datadriven.TestData) Config {
	var hb, slots string
	d.ScanArgs(t, "hb", &hb)
	d.ScanArgs(t, "slots", &slots)
	cfg := Config{Shape: parseShape(t, d.Input), Rescale: d.HasArg("rescale")}
	var err error
	cfg.HeartbeatTimeout, err = time.ParseDuration(hb)
	require.NoError(t, err)
	cfg.SlotTimeout, err = time.ParseDuration(slots)
	require.NoError(t, err)
	d.MaybeScanArgs(t, "min-slots", &cfg.MinSlots)
	d.MaybeScanArgs(t, "latest", &cfg.Latest)
	if d.HasArg("restarts") {
		var delay string
		var restarts int
		d.ScanArgs(t, "restarts", &restarts)
		d.ScanArgs(t, "delay", &delay)
		dur, err := time.ParseDuration(delay)
		require.NoError(t, err)
		cfg.Restart = restartAtMost(restarts, dur)
	}
	return cfg
}

// restartAtMost restarts n times after delay, then gives up.
func restartAtMost(n int, delay time.Duration) func(Failure) (time.Duration, bool) {
	return func(Failure) (time.Duration, bool) {
		n--
		return delay, n >= 0
	}
}

func scriptEvent(t *testing.T, d *datadriven.TestData) Event {
	now := func() time.Time {
		var s string
		d.ScanArgs(t, "t", &s)
		dur, err := time.ParseDuration(s)
		require.NoError(t, err)
		return epoch.Add(dur)
	}
	str := func(key string) string {
		var s string
		d.ScanArgs(t, key, &s)
		return s
	}
	num := func(key string) int {
		var n int
		d.ScanArgs(t, key, &n)
		return n
	}
	switch d.Cmd {
	case "register":
		return WorkerRegistered{Now: now(), Worker: Worker{ID: str("id"), Address: str("id") + ":7000", Slots: num("slots")}}
	case "heartbeat":
		var attempt int
		d.MaybeScanArgs(t, "attempt", &attempt)
		return Heartbeat{Now: now(), Worker: str("id"), Session: uint64(num("session")), Attempt: attempt}
	case "tick":
		return Tick{Now: now()}
	case "cut":
		return ConnectionLost{Worker: str("id"), Session: uint64(num("session")), Reason: str("reason")}
	case "submit":
		return JobSubmitted{Now: now()}
	case "running":
		return AttemptRunning{Attempt: num("attempt")}
	case "finished":
		return AttemptFinished{Attempt: num("attempt")}
	case "failed":
		return AttemptFailed{Attempt: num("attempt"), Err: str("err")}
	case "completed":
		return CheckpointCompleted{Attempt: num("attempt"), ID: int64(num("id"))}
	case "cancel-job":
		return CancelRequested{Reason: str("reason")}
	}
	t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	return nil
}

func formatAction(a Action) string {
	switch a := a.(type) {
	case Registered:
		return fmt.Sprintf("registered %s session=%d", a.Worker, a.Session)
	case Reject:
		return fmt.Sprintf("reject %s session=%d: %s", a.Worker, a.Session, a.Reason)
	case DeclareLost:
		return fmt.Sprintf("lost %s session=%d: %s", a.Worker, a.Session, a.Reason)
	case Deploy:
		var b strings.Builder
		fmt.Fprintf(&b, "deploy attempt=%d restore=%d", a.Attempt, a.Restore)
		if a.Parallelism > 0 {
			fmt.Fprintf(&b, " parallelism=%d", a.Parallelism)
		}
		slots := make([]string, len(a.Placement.Slots))
		for i, s := range a.Placement.Slots {
			slots[i] = s.String()
		}
		network := 0
		for _, c := range a.Placement.Channels {
			if c.Network {
				network++
			}
		}
		fmt.Fprintf(&b, " slots=(%s) network=%d/%d", strings.Join(slots, " "), network, len(a.Placement.Channels))
		return b.String()
	case Cancel:
		if a.Worker != "" {
			return fmt.Sprintf("cancel attempt=%d on %s: %s", a.Attempt, a.Worker, a.Reason)
		}
		return fmt.Sprintf("cancel attempt=%d: %s", a.Attempt, a.Reason)
	case WaitForSlots:
		return fmt.Sprintf("wait needed=%d offered=%d until=%s", a.Needed, a.Offered, a.Until.Sub(epoch))
	case Finished:
		return "finished"
	case Failed:
		return "failed: " + a.Err.Error()
	case Cancelled:
		return fmt.Sprintf("cancelled latest=%d: %s", a.Latest, a.Reason)
	}
	return fmt.Sprintf("unknown action %T", a)
}

// invariants follows a scheduler's events and actions and checks what it
// can see from outside: CL4 (one live attempt, attempts numbered without
// gaps, stale events change nothing, nothing after the end), CL5 (deploys
// only on registrations not lost, none kept by a live attempt), CL6
// (restore the newest checkpoint a live attempt completed) and CL9 (a
// cancel request cancels the live attempt and ends the job, naming the
// newest completed checkpoint).
type invariants struct {
	// alive are the registrations registered and not declared lost.
	alive map[string]uint64
	// live is the live attempt (0: none), placement its placement; last
	// the newest deployed.
	live, last int
	placement  *Placement
	// latest is the newest checkpoint completed by a live attempt.
	latest int64
	done   bool
}

func newInvariants() *invariants { return &invariants{alive: map[string]uint64{}} }

func (v *invariants) check(ev Event, acts []Action) error {
	// CL6: what the scheduler may restore, from the events alone.
	if c, ok := ev.(CheckpointCompleted); ok && c.Attempt == v.live && v.live > 0 && c.ID > v.latest {
		v.latest = c.ID
	}
	stale := false
	switch e := ev.(type) {
	case AttemptRunning:
		stale = e.Attempt != v.live
	case AttemptFinished:
		stale = e.Attempt != v.live
	case AttemptFailed:
		stale = e.Attempt != v.live
	case CheckpointCompleted:
		stale = e.Attempt != v.live
	case ConnectionLost:
		stale = v.alive[e.Worker] != e.Session || e.Session == 0
	case CancelRequested:
		stale = v.done
	}
	if stale && len(acts) > 0 {
		return fmt.Errorf("CL4/CL5: a stale %T gave %v", ev, acts)
	}
	lostSlot := "" // a worker with slots of the live attempt declared lost
	for _, a := range acts {
		switch a.(type) {
		case Deploy, Finished, Failed, Cancelled:
			if v.done {
				return fmt.Errorf("CL4: %s after the job ended", formatAction(a))
			}
		}
		switch a := a.(type) {
		case Registered:
			if _, dup := v.alive[a.Worker]; dup {
				return fmt.Errorf("CL5: %s registered while its session %d is alive", a.Worker, v.alive[a.Worker])
			}
			v.alive[a.Worker] = a.Session
		case DeclareLost:
			if v.placement != nil && v.placement.Session(a.Worker) == a.Session &&
				slices.ContainsFunc(v.placement.Slots, func(s Slot) bool { return s.Worker == a.Worker }) {
				lostSlot = a.Worker
			}
			if v.alive[a.Worker] != a.Session {
				return fmt.Errorf("CL5: %s session %d declared lost, alive is %d", a.Worker, a.Session, v.alive[a.Worker])
			}
			delete(v.alive, a.Worker)
		case Deploy:
			if v.live != 0 {
				return fmt.Errorf("CL4: attempt %d deployed while attempt %d is live", a.Attempt, v.live)
			}
			if a.Attempt != v.last+1 {
				return fmt.Errorf("CL4: attempt %d deployed after attempt %d", a.Attempt, v.last)
			}
			if a.Restore != v.latest {
				return fmt.Errorf("CL6: attempt %d restores checkpoint %d, the newest completed is %d", a.Attempt, a.Restore, v.latest)
			}
			for _, s := range a.Placement.Slots {
				if v.alive[s.Worker] == 0 || a.Placement.Session(s.Worker) != v.alive[s.Worker] {
					return fmt.Errorf("CL5: attempt %d deployed on slot %s of session %d, alive is %d", a.Attempt, s, a.Placement.Session(s.Worker), v.alive[s.Worker])
				}
			}
			v.live, v.last, v.placement = a.Attempt, a.Attempt, a.Placement
		case Cancel:
			if a.Worker == "" {
				if a.Attempt != v.live {
					return fmt.Errorf("CL4: cancel of attempt %d, live is %d", a.Attempt, v.live)
				}
				_, cancelJob := ev.(CancelRequested)
				if f, ok := ev.(AttemptFailed); (!ok || f.Attempt != v.live) && !cancelJob {
					if lostSlot == "" {
						return fmt.Errorf("CL5: attempt %d cancelled, neither failed nor on a lost worker's slots", a.Attempt)
					}
				}
				v.live, v.placement = 0, nil
			} else if a.Attempt == v.live {
				return fmt.Errorf("CL4: the live attempt %d cancelled on %s", a.Attempt, a.Worker)
			}
		case Finished:
			if v.live == 0 {
				return fmt.Errorf("CL4: finished without a live attempt")
			}
			v.done, v.live, v.placement = true, 0, nil
		case Failed:
			if v.live != 0 {
				return fmt.Errorf("CL4: failed while attempt %d is live", v.live)
			}
			v.done = true
		case Cancelled:
			if _, ok := ev.(CancelRequested); !ok {
				return fmt.Errorf("CL9: cancelled at a %T", ev)
			}
			if v.live != 0 {
				return fmt.Errorf("CL9: cancelled while attempt %d is live", v.live)
			}
			if a.Latest != v.latest {
				return fmt.Errorf("CL9: cancelled naming checkpoint %d, the newest completed is %d", a.Latest, v.latest)
			}
			v.done = true
		}
	}
	if _, ok := ev.(CancelRequested); ok && !v.done {
		return fmt.Errorf("CL9: the job goes on after a cancel request (%v)", acts)
	}
	// CL5: the live attempt keeps no lost registration.
	if v.placement != nil {
		for _, s := range v.placement.Slots {
			if v.alive[s.Worker] != v.placement.Session(s.Worker) {
				return fmt.Errorf("CL5: live attempt %d keeps slot %s of a lost registration", v.live, s)
			}
		}
	}
	return nil
}

var (
	seedFlag  = flag.Uint64("cluster.seed", 0, "TestSchedulerRandom: replay this seed (0: new seeds)")
	stepsFlag = flag.Int("cluster.steps", 3000, "TestSchedulerRandom: events per run")
)

// TestSchedulerRandom drives schedulers with random events (workers
// registering again, heartbeats of current and stale registrations and
// attempts, time jumps past the timeouts, cut connections, attempts
// failing, checkpoints of live and stale attempts, cancel requests) and
// checks CL4-CL6 and CL9 after every Step, and CL8: a second scheduler fed the same events gives
// the same actions. A failure prints the seed; -cluster.seed replays it.
func TestSchedulerRandom(t *testing.T) {
	seeds := []uint64{*seedFlag}
	if *seedFlag == 0 {
		seeds = seeds[:0]
		for range 20 {
			seeds = append(seeds, rand.Uint64())
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d (replay: go test -run TestSchedulerRandom -cluster.seed=%d)", seed, seed)
			runRandom(t, seed, *stepsFlag)
		})
	}
}

func runRandom(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	shape := &Shape{Job: "random", Operators: []Operator{
		{UID: "src", Kind: "source", Parallelism: 4, MaxParallelism: 128},
		{UID: "sum", Kind: "operator", Parallelism: 1 + rng.IntN(6), MaxParallelism: 128, Keyed: true},
		{UID: "out", Kind: "sink", Parallelism: 1, MaxParallelism: 128},
	}, Edges: []Edge{{From: "src", To: "sum", Part: checkpoint.PartHash}, {From: "sum", To: "out", Part: checkpoint.PartRebalance}}}
	cfg := Config{Shape: shape, HeartbeatTimeout: 3 * time.Second, SlotTimeout: 10 * time.Second, Rescale: rng.IntN(2) == 0, MinSlots: rng.IntN(3)}
	// Half the runs restart at once, always; the others after a delay, at
	// most some times per job.
	restarts, delay := -1, time.Duration(rng.Int64N(int64(5*time.Second)))
	if rng.IntN(2) == 0 {
		restarts = 5 + rng.IntN(50)
	}
	newScheduler := func() *Scheduler {
		c := cfg
		if restarts >= 0 {
			c.Restart = restartAtMost(restarts, delay)
		}
		s, err := New(c)
		require.NoError(t, err)
		return s
	}
	s, twin := newScheduler(), newScheduler()
	inv := newInvariants()
	now := epoch
	sessions := map[string]uint64{} // newest registration of each worker
	var nextID int64
	attempt := 0 // newest attempt deployed
	var acts, twinActs []Action
	deployed, lost, jobs := 0, 0, 1
	var ended time.Time // when the last attempt ended
	for i := range steps {
		w := fmt.Sprintf("w%d", 1+rng.IntN(4))
		// An attempt near the newest: the live one, an older or a newer one.
		near := max(0, attempt+rng.IntN(3)-1-rng.IntN(2))
		var ev Event
		switch r := rng.IntN(100); {
		case i == 5 || r < 3:
			ev = JobSubmitted{Now: now}
		case r < 15:
			ev = WorkerRegistered{Now: now, Worker: Worker{ID: w, Slots: rng.IntN(4)}}
		case r < 50:
			session := sessions[w]
			if rng.IntN(5) == 0 {
				session = uint64(rng.IntN(int(session) + 2))
			}
			ev = Heartbeat{Now: now, Worker: w, Session: session, Attempt: near}
		case r < 65:
			now = now.Add(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
			ev = Tick{Now: now}
		case r < 70:
			session := sessions[w]
			if rng.IntN(3) == 0 {
				session = uint64(rng.IntN(int(session) + 2))
			}
			ev = ConnectionLost{Worker: w, Session: session, Reason: "cut"}
		case r < 75:
			ev = AttemptRunning{Attempt: near}
		case r < 80:
			ev = AttemptFailed{Attempt: near, Err: "boom"}
		case r < 81:
			ev = AttemptFinished{Attempt: near}
		case r < 82:
			ev = CancelRequested{Reason: "by the user"}
		default:
			nextID++
			ev = CheckpointCompleted{Attempt: near, ID: nextID}
		}
		acts = s.Step(acts[:0], ev)
		if err := inv.check(ev, acts); err != nil {
			t.Fatalf("seed %d, step %d, %#v: %v\nactions: %v\nstate: %s", seed, i, ev, err, acts, s)
		}
		twinActs = twin.Step(twinActs[:0], ev)
		require.Equal(t, len(acts), len(twinActs), "CL8: seed %d step %d", seed, i)
		for k := range acts {
			require.Equal(t, formatAction(acts[k]), formatAction(twinActs[k]), "CL8: seed %d step %d", seed, i)
		}
		for _, a := range acts {
			switch a := a.(type) {
			case Registered:
				sessions[a.Worker] = a.Session
			case Cancel:
				if a.Worker == "" {
					ended = now
				}
			case Deploy:
				if restarts >= 0 && a.Attempt > 1 && now.Before(ended.Add(delay)) {
					t.Fatalf("CL7: seed %d step %d: attempt %d deployed at %v, %v after the last ended, before the restart delay %v", seed, i, a.Attempt, now, now.Sub(ended), delay)
				}
				attempt = a.Attempt
				deployed++
			case DeclareLost:
				lost++
			}
		}
		if inv.done && rng.IntN(20) == 0 {
			// The job ended: a fresh one.
			inv.done = false
			s, twin = newScheduler(), newScheduler()
			inv, sessions, attempt = newInvariants(), map[string]uint64{}, 0
			jobs++
		}
	}
	t.Logf("%d jobs, %d deploys, %d workers lost", jobs, deployed, lost)
}
