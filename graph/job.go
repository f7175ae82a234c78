package graph

import (
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/state"
	"github.com/snapflow/snapflow/state/keygroup"
	"github.com/vmihailenco/msgpack/v5"
)

// CheckpointConfig configures checkpointing. Checkpointing is enabled when
// Interval > 0; Dir must then be set.
type CheckpointConfig struct {
	// Interval between periodic checkpoints; 0 disables them.
	Interval time.Duration
	// Mode is the barrier mode: marker.Aligned (exactly-once, the default),
	// marker.Unaligned (exactly-once; barriers overtake in-flight data,
	// which is persisted as channel state) or marker.AtLeastOnce.
	// Savepoints are always aligned.
	Mode marker.Mode
	// AlignedTimeout, with Mode marker.Aligned and > 0, starts every
	// checkpoint aligned and switches it to unaligned at each subtask
	// whose alignment has not finished AlignedTimeout after the checkpoint
	// was triggered (Flink's execution.checkpointing.aligned-checkpoint-
	// timeout). Unaligned from the start is Mode marker.Unaligned.
	AlignedTimeout time.Duration
	// InputSlice, for checkpoints that may be unaligned, is the most
	// records a subtask processes before it looks for an unaligned barrier
	// again (default 256).
	InputSlice int
	// InlineKeyedEntries: a subtask's keyed state of at most this many
	// entries goes inline into the checkpoint's _metadata, larger into a
	// file of its own (0: 1024; negative: always a file).
	InlineKeyedEntries int
	// MaxInflightBytes caps the channel state (persisted in-flight data) of
	// one unaligned checkpoint over all subtasks; a checkpoint above it
	// fails (not counted against TolerableFailures) and the job goes on.
	// 0: no cap.
	MaxInflightBytes int64
	// Timeout after which a pending checkpoint expires (default 10m).
	Timeout time.Duration
	// MinPause is the least time between the completion of one checkpoint
	// and the trigger of the next.
	MinPause time.Duration
	// MaxConcurrent pending checkpoints (default 1).
	MaxConcurrent int
	// TolerableFailures is the number of consecutive failed checkpoints the
	// job tolerates; one more fails the job (and may restart it).
	TolerableFailures int
	// Dir is the checkpoint root: checkpoints go to Dir/<job-id>/chk-N.
	// It is a local directory (the default), or the URL of an object
	// store: s3://bucket?region=...&prefix=... (endpoint, use_path_style
	// for S3-compatible servers; credentials from the environment),
	// file:///path, mem://name (in this process). Restore.Path then names
	// a snapshot in that store, as TriggerSavepoint and Stop return it
	// (<job-id>/savepoint-N). On object storage, SavepointDir must be
	// empty and a Pebble backend needs State.FullCheckpoints (its
	// incremental checkpoints are not stored there yet).
	Dir string
	// Retain is the number of completed checkpoints kept (default 1).
	// Cancelling a job never deletes checkpoints; Job.DiscardCheckpoints
	// does.
	Retain int
	// SavepointDir is where savepoints go (default Dir/<job-id>).
	SavepointDir string
	// FS is the filesystem for checkpoints (default the OS filesystem).
	FS vfs.FS
}

// RestoreConfig says where the first attempt of an execution starts from.
// A restart after a failure restores the execution's own newest completed
// checkpoint, or else what its first attempt started from.
type RestoreConfig struct {
	// Latest restores the newest completed checkpoint (or
	// stop-with-savepoint) in the job's checkpoint directory, if any; it
	// takes precedence over Path.
	Latest bool
	// Path restores an explicit checkpoint or savepoint (its directory or
	// its _metadata file).
	Path string
	// AllowNonRestoredState skips state of operators that no longer exist
	// instead of failing the restore.
	AllowNonRestoredState bool
	// AllowFallback lets Latest restore an older checkpoint when the
	// newest completed one (per the job directory's completed log) is
	// missing or corrupt. Sinks may then publish the records between the
	// two again: by default such a restore fails with an error wrapping
	// restore.ErrFallback that names the checkpoints at stake.
	AllowFallback bool
	// AllowRepublish lets a sink restore a checkpoint or savepoint older
	// than what its commit user committed (an old savepoint restored into
	// a new checkpoint directory, a fork that keeps the commit user): the
	// records committed after the restored checkpoint are published
	// again. By default such a restore fails with an error wrapping
	// sink.ErrCommittedAhead that names the sink, its commit user and both
	// checkpoints (sinks whose committer reports its horizon:
	// sink.HorizonReporter). AllowFallback implies it: a fallback
	// publishes again by design.
	AllowRepublish bool
}

// Config configures a job.
type Config struct {
	// JobID names the job's checkpoint directory; default
	// snapshot.JobIDFromName(job name), so a restarted job finds its
	// checkpoints.
	JobID string
	// Parallelism is the default parallelism of operators (default 1).
	Parallelism int
	// MaxParallelism is the default number of key groups (default 128, or
	// more for parallelism above 128). Changing it makes keyed state
	// unrestorable.
	MaxParallelism int
	Checkpoint     CheckpointConfig
	// State selects where keyed state lives (default: Pebble).
	State StateConfig
	// Restart decides whether and when the job restarts after a failure
	// (see Unrecoverable for the failures that never restart). Default:
	// with checkpoints DefaultRestart (exponential delay with jitter, 1s
	// up to 1m, unlimited: Flink's default), without NoRestart.
	Restart RestartStrategy
	Restore RestoreConfig
	// ChannelCapacity is the number of buffers a channel queues before its
	// writer blocks (default 8).
	ChannelCapacity int
	// BufferSize is the number of records per buffer (default 256).
	BufferSize int
	// FlushInterval bounds how long a record waits in a partly filled
	// buffer while its subtask is busy (default 5ms); a subtask whose
	// input runs dry passes its partly filled buffers on at once.
	FlushInterval time.Duration
	// DisableChaining runs every operator on goroutines of its own (see
	// the DisableChaining option for one operator).
	DisableChaining bool
	// CancelTimeout bounds how long an attempt waits for its subtasks to
	// stop once it ends (failure, cancel); subtasks still running then are
	// named in an error and the job is not restarted (default 30s).
	CancelTimeout time.Duration
	// Logf receives warnings and progress (default log.Printf).
	Logf func(format string, args ...any)
	// OnEvent, when set, is called for job events (checkpoints completed or
	// failed, failures, restarts, restores, the end), in order, from the
	// execution's goroutine (never concurrently). It must not block long:
	// the job master waits for it.
	OnEvent func(Event)
	// Fault, when set, makes one operator fail once after a checkpoint,
	// to watch the job restart (see Fault).
	Fault *Fault
}

// StateBackend names a keyed-state backend.
type StateBackend uint8

const (
	// DefaultState, the zero value, is PebbleState: a job's state may
	// outgrow memory without the job knowing in advance, and Pebble's
	// checkpoints are incremental and asynchronous.
	DefaultState StateBackend = iota
	// HeapState keeps keyed state on the heap: the fastest, for state
	// that fits in memory.
	HeapState
	// PebbleState keeps keyed state in one Pebble instance per keyed
	// subtask, under StateConfig.Pebble.Dir, for state larger than memory:
	// memory is bounded by the cache sizes whatever the state size. The
	// default.
	PebbleState
)

func (b StateBackend) String() string {
	switch b {
	case DefaultState:
		return "default (pebble)"
	case HeapState:
		return "heap"
	case PebbleState:
		return "pebble"
	}
	return fmt.Sprintf("StateBackend(%d)", uint8(b))
}

// StateConfig configures the keyed-state backend of a job. Checkpoints
// and savepoints restore into either backend, whichever took them.
type StateConfig struct {
	Backend StateBackend
	// Pebble configures the Pebble instances (Backend PebbleState). Its Dir
	// is where each keyed subtask gets a fresh working directory (default
	// os.TempDir()); it must not be the checkpoint directory.
	Pebble state.PebbleEngine
	// FullCheckpoints makes the checkpoints of a Pebble backend full
	// snapshots in the canonical format, as savepoints always are, instead
	// of incremental ones (the sstables no earlier checkpoint stored). The
	// heap backend's checkpoints are always full.
	FullCheckpoints bool
}

// Job is a dataflow graph under construction. Build it with Source, Map,
// KeyBy, ProcessKeyed, Sink and friends, then Run it.
type Job struct {
	name     string
	cfg      Config
	vertices []*vertex
	chains   [][]*vertex // set by Validate: the operators each subtask runs
	// iterations are the loops started with Iterate.
	iterations []*iteration
	errs       []error
}

// NewJob returns an empty job.
func NewJob(name string, cfg Config) *Job {
	return &Job{name: name, cfg: cfg}
}

// Name is the job's name.
func (j *Job) Name() string { return j.name }

// ID is the job id: the configured one, or derived from the name.
func (j *Job) ID() string {
	if j.cfg.JobID != "" {
		return j.cfg.JobID
	}
	return snapshot.JobIDFromName(j.name)
}

func (j *Job) errorf(format string, args ...any) {
	j.errs = append(j.errs, fmt.Errorf(format, args...))
}

func (j *Job) logf(format string, args ...any) {
	if j.cfg.Logf != nil {
		j.cfg.Logf(format, args...)
		return
	}
	log.Printf(format, args...)
}

// Validate checks the graph and the configuration and resolves defaults.
// Run calls it; it is exported so a graph can be checked without running.
func (j *Job) Validate() error {
	c := &j.cfg
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	errs = append(errs, j.errs...)
	if c.Parallelism == 0 {
		c.Parallelism = 1 // the zero Config means parallelism 1
	}
	if c.Parallelism < 0 {
		add("graph: job parallelism %d must be positive", c.Parallelism)
	}
	if c.ChannelCapacity <= 0 {
		c.ChannelCapacity = 8
	}
	if c.BufferSize <= 0 {
		c.BufferSize = 256
	}
	if c.FlushInterval <= 0 {
		c.FlushInterval = 5 * time.Millisecond
	}
	if c.CancelTimeout <= 0 {
		c.CancelTimeout = 30 * time.Second
	}
	if c.Restart == nil {
		c.Restart = NoRestart()
		if c.Checkpoint.Interval > 0 {
			c.Restart = DefaultRestart()
		}
	}
	if c.Checkpoint.FS == nil {
		c.Checkpoint.FS = vfs.Default
	}
	if c.Checkpoint.Interval < 0 {
		add("graph: checkpoint interval %v must not be negative", c.Checkpoint.Interval)
	}
	if c.Checkpoint.Interval > 0 && c.Checkpoint.Dir == "" {
		add("graph: checkpointing is enabled (interval %v) but Checkpoint.Dir is empty", c.Checkpoint.Interval)
	}
	if c.State.Backend == DefaultState {
		c.State.Backend = PebbleState
	}
	if d := c.Checkpoint.Dir; snapshot.IsObjectStoreLocation(d) {
		if err := snapshot.CheckLocation(d); err != nil {
			add("graph: Checkpoint.Dir: %v", err)
		}
		if c.State.Backend == PebbleState && !c.State.FullCheckpoints {
			add("graph: the Pebble backend's incremental checkpoints on object storage (Checkpoint.Dir %s) are not supported yet: set State.FullCheckpoints, use the heap backend, or a local Checkpoint.Dir", snapshot.RedactLocation(d))
		}
		if c.Checkpoint.SavepointDir != "" {
			add("graph: Checkpoint.SavepointDir %q with checkpoints on object storage (Checkpoint.Dir %s): savepoints go to the same store; leave it empty", c.Checkpoint.SavepointDir, snapshot.RedactLocation(d))
		}
	}
	switch c.State.Backend {
	case HeapState:
	case PebbleState:
		if d := c.State.Pebble.Dir; d != "" && c.Checkpoint.Dir != "" && filepath.Clean(d) == filepath.Clean(c.Checkpoint.Dir) {
			add("graph: the Pebble working directory %q must not be the checkpoint directory", d)
		}
	default:
		add("graph: unknown state backend %v", c.State.Backend)
	}
	if c.Checkpoint.MaxInflightBytes < 0 {
		add("graph: MaxInflightBytes %d must not be negative", c.Checkpoint.MaxInflightBytes)
	}
	if c.Checkpoint.AlignedTimeout < 0 {
		add("graph: aligned checkpoint timeout %v must not be negative", c.Checkpoint.AlignedTimeout)
	}
	if c.Checkpoint.InputSlice < 0 {
		add("graph: checkpoint input slice %d must not be negative", c.Checkpoint.InputSlice)
	} else if c.Checkpoint.InputSlice == 0 {
		c.Checkpoint.InputSlice = 256
	}
	switch {
	case c.Checkpoint.InlineKeyedEntries == 0:
		c.Checkpoint.InlineKeyedEntries = DefaultInlineKeyedEntries
	case c.Checkpoint.InlineKeyedEntries < 0:
		c.Checkpoint.InlineKeyedEntries = -1
	}
	if c.Checkpoint.AlignedTimeout > 0 && c.Checkpoint.Mode != marker.Aligned {
		add("graph: an aligned checkpoint timeout (%v) needs Mode aligned, not %s", c.Checkpoint.AlignedTimeout, c.Checkpoint.Mode)
	}
	if c.Restore.Latest && c.Checkpoint.Dir == "" {
		add("graph: Restore.Latest needs Checkpoint.Dir")
	}
	if len(j.vertices) == 0 {
		add("graph: job %q has no operators", j.name)
	}
	uids := map[string]*vertex{}
	sources := 0
	for _, v := range j.vertices {
		if v.parallelismSet && v.parallelism < 1 {
			add("graph: %s: Parallelism(%d) must be at least 1", v, v.parallelism)
		}
		if !v.parallelismSet {
			v.parallelism = c.Parallelism
		}
		if v.maxParallelism == 0 {
			v.maxParallelism = c.MaxParallelism
		}
		if v.maxParallelism == 0 {
			v.maxParallelism = keygroup.DefaultMaxParallelism(v.parallelism)
		}
		if v.uid == "" {
			add("graph: %s %q has no uid; every operator needs a stable uid so its state can be restored", v.kind, v.name)
		} else if o, dup := uids[v.uid]; dup {
			add("graph: duplicate uid %q: %s and %s", v.uid, o, v)
		} else {
			uids[v.uid] = v
		}
		if v.parallelism >= 1 && keygroup.CheckParallelism(v.parallelism, v.maxParallelism) != nil {
			add("graph: %s: parallelism %d is above its max parallelism %d", v, v.parallelism, v.maxParallelism)
		}
		if v.kind == kindSource {
			sources++
		}
		if v.kind != kindSink && !slices.ContainsFunc(v.outputs, func(e *edge) bool { return e.side == "" }) {
			add("graph: %s is not connected: nothing consumes its output (add a sink or remove it)", v)
		}
		errs = append(errs, validateSides(v)...)
		for _, e := range v.inputs {
			if e.part == Auto {
				if e.from.parallelism == v.parallelism {
					e.part = Forward
				} else {
					e.part = Rebalance
				}
			}
		}
	}
	for _, v := range j.vertices {
		for _, e := range v.inputs {
			if e.part == Forward && e.from.parallelism != v.parallelism {
				add("graph: forward edge from %s (parallelism %d) to %s (parallelism %d) needs equal parallelism; use Rebalance", e.from, e.from.parallelism, v, v.parallelism)
			}
		}
	}
	if len(j.vertices) > 0 && sources == 0 {
		add("graph: job %q has no source", j.name)
	}
	errs = append(errs, j.validateLoops()...)
	if c.Fault != nil {
		f := *c.Fault // the caller's stays as it was
		if err := f.validate(j); err != nil {
			errs = append(errs, err)
		}
		c.Fault = &f
	}
	if len(errs) == 0 {
		j.buildChains()
		// With loops, aligned checkpoints persist channel state too: what
		// comes back on feedback edges, and, where a loop head switches a
		// checkpoint (a barrier back on a feedback edge first, see
		// align's doc), what is in flight on its other edges.
		unaligned := c.Checkpoint.Mode == marker.Unaligned || c.Checkpoint.AlignedTimeout > 0 || j.hasLoops()
		for _, v := range j.vertices {
			for _, e := range v.inputs {
				if e.chained || (!unaligned && !e.feedback) {
					continue
				}
				err := persistable(e.elem, e.elem.String())
				switch {
				case err == nil:
				case e.feedback || v.loop != 0 || e.from.loop != 0:
					add("graph: edge %s -> %s: checkpoints of a loop persist its in-flight records with msgpack, but %v", e.from, v, err)
				default:
					add("graph: edge %s -> %s: unaligned checkpoints persist its in-flight records with msgpack, but %v", e.from, v, err)
				}
			}
		}
	}
	return errors.Join(errs...)
}

// persistable reports why records of type t would not come back from
// msgpack as they were (nil if they would): unexported struct fields are
// dropped, and interfaces, channels and functions have no encoding to
// decode into. A type with its own msgpack encoding (CustomEncoder and
// CustomDecoder, or msgpack.Marshaler and Unmarshaler) is trusted.
func persistable(t reflect.Type, path string) error {
	return persistableSeen(t, path, map[reflect.Type]bool{})
}

func persistableSeen(t reflect.Type, path string, seen map[reflect.Type]bool) error {
	if seen[t] {
		return nil
	}
	seen[t] = true
	pt := reflect.PointerTo(t)
	custom := func(enc, dec reflect.Type) bool {
		return (t.Implements(enc) || pt.Implements(enc)) && pt.Implements(dec)
	}
	if custom(customEncoder, customDecoder) || custom(msgpackMarshaler, msgpackUnmarshaler) || t == timeType {
		return nil
	}
	switch t.Kind() {
	case reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return fmt.Errorf("%s is a %s, which cannot be decoded", path, t.Kind())
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return persistableSeen(t.Elem(), path, seen)
	case reflect.Map:
		if err := persistableSeen(t.Key(), path, seen); err != nil {
			return err
		}
		return persistableSeen(t.Elem(), path, seen)
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				return fmt.Errorf("field %s of %s is unexported, so msgpack drops it (export it, tag it msgpack:\"-\" and accept the loss, or give %s its own msgpack encoding)", f.Name, path, t)
			}
			if f.Tag.Get("msgpack") == "-" {
				continue
			}
			if err := persistableSeen(f.Type, path+"."+f.Name, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

var (
	customEncoder      = reflect.TypeFor[msgpack.CustomEncoder]()
	customDecoder      = reflect.TypeFor[msgpack.CustomDecoder]()
	msgpackMarshaler   = reflect.TypeFor[msgpack.Marshaler]()
	msgpackUnmarshaler = reflect.TypeFor[msgpack.Unmarshaler]()
	timeType           = reflect.TypeFor[time.Time]()
)

// chainable reports whether v can run in the subtask of its only
// producer: a forward edge of its main output (side outputs are never
// chained), equal parallelism, the producer has no other consumer, and
// neither side opted out.
func (j *Job) chainable(v *vertex) bool {
	if j.cfg.DisableChaining || v.noChain || len(v.inputs) != 1 {
		return false
	}
	e := v.inputs[0]
	return !e.feedback && e.side == "" && e.part == Forward && len(e.from.outputs) == 1 && !e.from.noChain && e.from.parallelism == v.parallelism
}

// buildChains groups the vertices into chains (Flink's operator chaining):
// each chain runs as one goroutine per subtask, its operators calling each
// other directly.
func (j *Job) buildChains() {
	j.chains = nil
	for _, v := range j.vertices {
		for _, e := range v.inputs {
			e.chained = false
		}
	}
	for _, v := range j.vertices {
		if j.chainable(v) {
			continue // not a head
		}
		chain := []*vertex{v}
		for cur := v; len(cur.outputs) == 1 && j.chainable(cur.outputs[0].to); {
			cur.outputs[0].chained = true
			cur = cur.outputs[0].to
			chain = append(chain, cur)
		}
		j.chains = append(j.chains, chain)
	}
}

// storageOptions configure the job's checkpoint storage (Validate has
// run).
func (j *Job) storageOptions() snapshot.StorageOptions {
	cc := j.cfg.Checkpoint
	return snapshot.StorageOptions{FS: cc.FS, Retain: cc.Retain, SavepointDir: cc.SavepointDir, Logf: j.logf}
}

// DiscardCheckpoints deletes the job's checkpoints and its completed log
// (not its savepoints): the explicit "discard this job" that cancelling
// never does. A later run starts from scratch. It must not be called while
// the job runs.
func (j *Job) DiscardCheckpoints() error {
	if err := j.Validate(); err != nil {
		return err
	}
	if j.cfg.Checkpoint.Dir == "" {
		return errors.New("graph: DiscardCheckpoints needs Checkpoint.Dir")
	}
	st, err := snapshot.OpenStorage(j.cfg.Checkpoint.Dir, j.ID(), j.storageOptions())
	if err != nil {
		return err
	}
	err = st.Discard()
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	return err
}
