package restore

import (
	"cmp"
	"errors"
	"fmt"
	"iter"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/marker"
	"github.com/snapflow/snapflow/snapshot"
	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/keygroup"
)

// Logf receives warnings and informational messages. A nil Logf discards
// them.
type Logf func(format string, args ...any)

func (l Logf) printf(format string, args ...any) {
	if l != nil {
		l(format, args...)
	}
}

// ErrUnrecoverable is wrapped by the restore errors that no retry can fix,
// because the same inputs fail the same way again: every Assign error (state
// for a uid that is not in the job, a changed max parallelism, ...), Load of
// a path that is missing or does not decode, and Latest when it refuses to
// fall back (ErrFallback), when none of the checkpoints decodes, or when the
// newest is of a newer format version. A restart strategy should fail the
// job at once on these (Flink's SuppressRestartsException). Other errors,
// IO errors in particular, may be transient.
var ErrUnrecoverable = errors.New("restore: unrecoverable")

// ErrFallback is wrapped by the error of Latest when restoring would fall
// back past a checkpoint that the completed-checkpoint log says completed,
// so that sinks may have committed its transactions: restoring an older
// checkpoint would publish their records again under new transaction ids.
// The error names the completed checkpoint, why it cannot be restored, the
// checkpoint that would be restored instead, and the checkpoints whose
// records would be published twice. errors.Is(ErrFallback, ErrUnrecoverable)
// holds.
var ErrFallback error = &subSentinel{msg: "restore: refusing to fall back past a completed checkpoint", parent: ErrUnrecoverable}

// subSentinel is a sentinel error that is also a case of a broader one.
type subSentinel struct {
	msg    string
	parent error
}

func (e *subSentinel) Error() string { return e.msg }
func (e *subSentinel) Unwrap() error { return e.parent }

// unrecoverable marks err as wrapping ErrUnrecoverable without changing its
// message.
func unrecoverable(err error) error {
	if err == nil || errors.Is(err, ErrUnrecoverable) {
		return err
	}
	return &unrecoverableError{err}
}

type unrecoverableError struct{ err error }

func (e *unrecoverableError) Error() string   { return e.err.Error() }
func (e *unrecoverableError) Unwrap() []error { return []error{e.err, ErrUnrecoverable} }

// candidate is a checkpoint Latest may restore.
type candidate struct {
	id   int64
	kind marker.Kind
	path string
}

func (c candidate) String() string { return fmt.Sprintf("%s %s", c.kind, c.path) }

// Latest returns the newest restorable checkpoint of st and its directory,
// and refuses by default to restore one older than the newest completion
// recorded in the completed-checkpoint log (see the package documentation).
//
// The candidates are the complete chk-N directories and the
// stop-with-savepoints that the log records. Newest first, each whose
// _metadata is corrupt, truncated, invalid or gone is skipped with a warning
// through logf naming its path, the error and the candidate tried next.
// If the one found is older than the committed horizon H (the highest id of
// a checkpoint or stop-with-savepoint in the log: a completion that may have
// been notified), Latest returns an error wrapping ErrFallback, unless
// allowFallback, with which it logs the same warning and returns it.
// It returns (nil, "", nil) when st has neither candidates nor a horizon,
// and when allowFallback is set and nothing is left to restore below the
// horizon. It fails when candidates exist but none is usable, and when
// reading one fails otherwise. A job directory without a log (written before
// it existed) has no horizon.
func Latest(st *snapshot.Storage, allowFallback bool, logf Logf) (*checkpoint.Metadata, string, error) {
	return latest(st, allowFallback, logf, nil)
}

// LatestID returns the id of the checkpoint (or stop-with-savepoint)
// that Latest would restore from the job jobID at location, a local
// directory or an object-store URL (snapshot.OpenStorage), or 0 if there
// is none: what a restarted coordinator gives its scheduler
// (cluster.Config.Latest). Its errors are Latest's, ErrFallback
// included. It opens the job's storage for the call, with its cleanup
// (ST5) and, on a local directory, its lock (ST17: it fails with
// snapshot.ErrLocked while another Storage holds the job); a coordinator
// that keeps the storage open calls Latest on it instead.
func LatestID(location, jobID string, allowFallback bool, logf Logf) (int64, error) {
	st, err := snapshot.OpenStorage(location, jobID, snapshot.StorageOptions{Logf: logf})
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	md, _, err := Latest(st, allowFallback, logf)
	if cerr := st.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("restore: %w", cerr)
	}
	if err != nil || md == nil {
		return 0, err
	}
	return md.CheckpointID, nil
}

// LatestPlan chooses the checkpoint as Latest does, assigns its state to
// ops as Assign does, and checks the keyed-state blocks that the plan's
// subtasks need (LoadKeyedState): reading only those blocks. A
// candidate whose keyed-state blocks are missing, truncated or damaged
// counts as corrupt in every respect: it is skipped with a warning
// naming the file, the checkpoint and the key group, subject to the
// committed horizon as Latest's candidates are. An Assign error fails
// LatestPlan as it fails Assign. It returns a nil Plan where Latest
// returns nil metadata.
func LatestPlan(st *snapshot.Storage, allowFallback bool, ops []Operator, allowNonRestored bool, logf Logf) (*Plan, error) {
	var plan *Plan
	_, _, err := latest(st, allowFallback, logf, func(md *checkpoint.Metadata, path string) error {
		p, err := Assign(md, path, ops, allowNonRestored, logf)
		if err != nil {
			return &fatalError{err}
		}
		if err := LoadKeyedState(st.FS(), p); err != nil {
			return err
		}
		plan = p
		return nil
	})
	if err != nil {
		return nil, err
	}
	return plan, nil
}

// fatalError is an error of latest's use function that fails latest
// instead of skipping the candidate.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

// latest is Latest; use, if not nil, is called with each candidate whose
// metadata was read and that may be restored, and the candidate is
// skipped when it fails, as one whose metadata failed to read, unless the
// error is a *fatalError, which fails latest.
func latest(st *snapshot.Storage, allowFallback bool, logf Logf, use func(md *checkpoint.Metadata, path string) error) (*checkpoint.Metadata, string, error) {
	dirs, err := st.Checkpoints()
	if err != nil {
		return nil, "", fmt.Errorf("restore: %w", err)
	}
	logged, err := st.Completed()
	if err != nil {
		return nil, "", fmt.Errorf("restore: %w", err)
	}
	var horizon *snapshot.CompletedRef
	var cands []candidate
	for i := range logged {
		r := &logged[i]
		if r.Notified() && (horizon == nil || r.ID > horizon.ID) {
			horizon = r
		}
		if r.Stop {
			cands = append(cands, candidate{id: r.ID, kind: marker.Savepoint, path: r.Path})
		}
	}
	for _, d := range dirs {
		cands = append(cands, candidate{id: d.ID, kind: marker.Checkpoint, path: d.Path})
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(a.id, b.id) })
	if len(cands) == 0 && horizon == nil {
		return nil, "", nil
	}

	fs := st.FS()
	var newestErr error
	failed := make(map[int64]error) // the skipped candidates, by id
	for i := len(cands) - 1; i >= 0; i-- {
		c := cands[i]
		md, err := snapshot.ReadMetadata(fs, c.path)
		if err == nil && md.CheckpointID != c.id {
			err = fmt.Errorf("%w: %s holds checkpoint %d", checkpoint.ErrInvalid, c.path, md.CheckpointID)
		}
		below := horizon != nil && c.id < horizon.ID
		risk := func() string {
			return fallbackRisk(st, horizon, failed[horizon.ID], fmt.Sprintf("restoring %s %d at %s", c.kind, c.id, c.path), c.id)
		}
		if err == nil && below && !allowFallback {
			return nil, "", fmt.Errorf("%w: %s; set RestoreConfig.AllowFallback to accept duplicates", ErrFallback, risk())
		}
		if err == nil && use != nil {
			var fatal *fatalError
			if err = use(md, c.path); errors.As(err, &fatal) {
				return nil, "", fatal.err
			}
		}
		if err == nil {
			if below {
				logf.printf("restore: WARNING: %s; restoring it because AllowFallback is set", risk())
			}
			return md, c.path, nil
		}
		if !skippable(err) {
			err = fmt.Errorf("restore: %s: %w", c, err)
			if errors.Is(err, checkpoint.ErrUnsupportedVersion) {
				err = unrecoverable(err)
			}
			return nil, "", err
		}
		failed[c.id] = err
		if newestErr == nil {
			newestErr = err
		}
		next := "no older checkpoint"
		if i > 0 {
			next = "falling back to " + fs.PathBase(cands[i-1].path)
		}
		logf.printf("restore: skipping %s: %v; %s", c, cause(err), next)
	}
	if horizon != nil {
		risk := fallbackRisk(st, horizon, failed[horizon.ID], "starting without state", 0)
		if !allowFallback {
			return nil, "", fmt.Errorf("%w: %s; set RestoreConfig.AllowFallback to accept duplicates", ErrFallback, risk)
		}
		logf.printf("restore: WARNING: %s; starting without state because AllowFallback is set", risk)
		return nil, "", nil
	}
	return nil, "", unrecoverable(fmt.Errorf("restore: none of the %d checkpoints in %s is usable; the newest: %w",
		len(cands), st.JobDir(), newestErr))
}

// fallbackRisk says what restoring instead (checkpoint id, or 0 for no
// state) puts at risk, given the horizon h and why h itself cannot be
// restored (err, nil if it was no candidate: its directory is gone).
func fallbackRisk(st *snapshot.Storage, h *snapshot.CompletedRef, err error, instead string, id int64) string {
	state := "its metadata is missing"
	re := (*snapshot.ReadError)(nil)
	switch {
	case errors.As(err, &re) && stateFileKind(re) != "":
		state = fmt.Sprintf("its %s is corrupt: %v", stateFileKind(re), err)
	case err != nil && !errors.Is(err, os.ErrNotExist):
		state = fmt.Sprintf("its metadata is corrupt: %v", cause(err))
	}
	committed := fmt.Sprintf("checkpoints %d..%d", id+1, h.ID)
	switch {
	case id+1 == h.ID:
		committed = fmt.Sprintf("checkpoint %d", h.ID)
	case id == 0:
		committed = fmt.Sprintf("every checkpoint up to %d", h.ID)
	}
	return fmt.Sprintf("%s %d completed at %s (per %s), but %s; %s would publish again the records that sinks committed for %s",
		h.Kind, h.ID, h.Path, st.LogPath(), state, instead, committed)
}

// skippable reports whether Latest may fall back past a checkpoint that
// failed with err (R5).
func skippable(err error) bool {
	return errors.Is(err, checkpoint.ErrCorrupt) || errors.Is(err, checkpoint.ErrInvalid) || errors.Is(err, os.ErrNotExist)
}

// cause strips the *snapshot.ReadError around err when the message already
// names the checkpoint, that is when the error is about its _metadata. An
// error about one of its channel-state or keyed-state files keeps the
// file's path (R9, R11).
func cause(err error) error {
	if re := (*snapshot.ReadError)(nil); errors.As(err, &re) && stateFileKind(re) == "" {
		return re.Err
	}
	return err
}

// stateFileKind says whether re is about a channel-state file ("channel
// state"), a keyed-state file ("keyed state"), a file of native keyed
// state in the checkpoint directory or in shared/ ("native keyed state")
// or neither (""), rather than
// the _metadata file or the directory: ReadMetadata and ReadKeyedState name
// the failing file, and those files, unlike _metadata, always start with
// their prefixes (checkpoint F6, F9).
func stateFileKind(re *snapshot.ReadError) string {
	base := re.Path[strings.LastIndexAny(re.Path, `/\`)+1:]
	switch {
	case strings.HasPrefix(base, checkpoint.ChannelStateFilePrefix):
		return "channel state"
	case strings.HasPrefix(base, checkpoint.KeyedStateFilePrefix):
		return "keyed state"
	case strings.HasPrefix(base, checkpoint.NativeStateFilePrefix) ||
		strings.HasSuffix(re.Path[:len(re.Path)-len(base)], "/"+snapshot.SharedStateDir+"/"):
		return "native keyed state"
	}
	return ""
}

// Load reads the checkpoint or savepoint at path, its directory or its
// _metadata file, whole: its metadata, its channel state, and the keyed
// state of every subtask, read from its keyed-state file into KeyGroups
// (KeyedState is then nil), so that the result is self-contained, for
// tools and tests that inspect a checkpoint. Restoring a job uses LoadPlan
// instead, which reads only the keyed state the new subtasks need. Unlike
// Latest it never falls back. An error for a path that is missing or does
// not decode, or for a keyed-state file that is missing or damaged, wraps
// ErrUnrecoverable.
func Load(fs vfs.FS, path string) (*checkpoint.Metadata, error) {
	if fs == nil {
		fs = vfs.Default
	}
	md, err := snapshot.ReadMetadata(fs, path)
	if err == nil {
		err = readAllKeyedState(fs, checkpointDir(fs, path), md)
	}
	if err != nil {
		return nil, loadError(err)
	}
	return md, nil
}

// LoadPlan reads the metadata of the checkpoint or savepoint at path, its
// directory or its _metadata file, assigns its state to ops as Assign does
// and checks the keyed-state blocks that the plan's subtasks need
// (LoadKeyedState). It never falls back: an error for a path that is
// missing or does not decode, or for a keyed-state block that is missing or
// damaged, wraps ErrUnrecoverable, as every Assign error does.
func LoadPlan(fs vfs.FS, path string, ops []Operator, allowNonRestored bool, logf Logf) (*Plan, error) {
	md, err := snapshot.ReadMetadata(fs, path)
	if err != nil {
		return nil, loadError(err)
	}
	plan, err := Assign(md, path, ops, allowNonRestored, logf)
	if err != nil {
		return nil, err
	}
	if err := LoadKeyedState(fs, plan); err != nil {
		return nil, loadError(err)
	}
	return plan, nil
}

// loadError prefixes an error of Load or LoadPlan and marks it
// unrecoverable when the checkpoint is missing, corrupt or of another
// version.
func loadError(err error) error {
	err = fmt.Errorf("restore: %w", err)
	if skippable(err) || errors.Is(err, checkpoint.ErrUnsupportedVersion) {
		err = unrecoverable(err)
	}
	return err
}

// checkpointDir returns the directory of the checkpoint at path, its
// directory or its _metadata file.
func checkpointDir(fs vfs.FS, path string) string {
	if fs.PathBase(path) == snapshot.MetadataFileName {
		return fs.PathDir(path)
	}
	return path
}

// readAllKeyedState reads the keyed-state file of every subtask of md, in
// dir, into its KeyGroups and clears its KeyedState.
func readAllKeyedState(fs vfs.FS, dir string, md *checkpoint.Metadata) error {
	for i := range md.Operators {
		op := &md.Operators[i]
		for j := range op.Subtasks {
			st := &op.Subtasks[j]
			if st.KeyedState == nil {
				continue
			}
			kgs, err := snapshot.ReadKeyedState(fs, dir, md.CheckpointID, md.Options.Kind, op.UID, st.KeyedState)
			if err != nil {
				return err
			}
			st.KeyGroups, st.KeyedState = kgs, nil
		}
	}
	return nil
}

// maxParallelReads bounds the keyed-state files LoadKeyedState reads at
// once.
const maxParallelReads = 4

// LoadKeyedState checks the keyed state that Assign handed to the subtasks
// of plan by reference (SubtaskState.RestoredKeyedState) and copies their
// native keyed state (RestoredNative) into directories of their own. It
// reads only the referenced blocks, from files in the checkpoint
// directory plan.Path (or its parent, if plan.Path is a _metadata file),
// up to four subtasks' at a time, checks each block's length and CRC-32C
// and decodes it, and keeps nothing: each subtask reads its blocks again
// as it builds its keyed-state backend (Plan.KeyedState), one at a time,
// so that no subtask holds all of its state's records and the restore
// holds none of them. Reading them first here is what lets a
// damaged block fail the plan, and LatestPlan fall back, like damaged
// metadata. The error, for the first failing subtask in task order,
// is a *snapshot.ReadError naming the file, the checkpoint, the operator
// and the key group; for a missing, truncated or damaged block it wraps
// checkpoint.ErrCorrupt. On error, plan must not be used.
func LoadKeyedState(fs vfs.FS, plan *Plan) error {
	if fs == nil {
		fs = vfs.Default
	}
	var ids []checkpoint.TaskID
	for id, s := range plan.Tasks {
		if len(s.RestoredKeyedState) > 0 || len(s.RestoredNative) > 0 {
			ids = append(ids, id)
		}
	}
	slices.SortFunc(ids, func(a, b checkpoint.TaskID) int {
		return cmp.Or(strings.Compare(a.Operator, b.Operator), cmp.Compare(a.Subtask, b.Subtask))
	})
	dir := checkpointDir(fs, plan.Path)
	errs := make([]error, len(ids))
	sem := make(chan struct{}, maxParallelReads)
	var wg sync.WaitGroup
	for i, id := range ids {
		s := plan.Tasks[id]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			for k := range s.RestoredKeyedState {
				for _, err := range snapshot.KeyedStateGroups(fs, dir, plan.CheckpointID, plan.Kind, id.Operator, &s.RestoredKeyedState[k]) {
					if err != nil {
						errs[i] = err
						return
					}
				}
			}
			for k := range s.RestoredNative {
				nr := &s.RestoredNative[k]
				to := fs.PathJoin(fs.PathDir(dir), snapshot.RestoreDir, fmt.Sprintf("%d-%d-%d", os.Getpid(), restoreSeq.Add(1), k))
				// A subtask that needs only some of the old instance's key
				// groups reads only the files that may hold them (R13).
				first, last := 0, 1<<16
				if nr.KeyGroupStart < s.KeyGroupStart || nr.KeyGroupEnd > s.KeyGroupEnd {
					first, last = s.KeyGroupStart, s.KeyGroupEnd
				}
				partial, err := snapshot.CopyNativeStateFor(fs, fs.PathDir(dir), dir, plan.CheckpointID, id.Operator, nr.Ref, to, first, last)
				if err != nil {
					_ = fs.RemoveAll(to)
					errs[i] = err
					return
				}
				nr.Dir, nr.Partial = to, partial
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			RemoveNativeCopies(fs, plan)
			return err
		}
	}
	return nil
}

// KeyedState yields the keyed state that the plan gives subtask s of the
// operator uid: its records in memory (s.KeyGroups, from checkpoints that
// held them inline), then those of the blocks it references
// (s.RestoredKeyedState), read from their files on fs one read of
// adjacent blocks at a time (snapshot.KeyedStateGroups). The key groups
// come in no particular order. It is nil when s has neither. An error,
// naming the file, the checkpoint, the operator and the key group, ends
// the sequence.
func (p *Plan) KeyedState(fs vfs.FS, uid string, s *checkpoint.SubtaskState) iter.Seq2[checkpoint.KeyGroupState, error] {
	if s == nil || len(s.KeyGroups) == 0 && len(s.RestoredKeyedState) == 0 {
		return nil
	}
	if fs == nil {
		fs = vfs.Default
	}
	dir := checkpointDir(fs, p.Path)
	return func(yield func(checkpoint.KeyGroupState, error) bool) {
		for _, g := range s.KeyGroups {
			if !yield(g, nil) {
				return
			}
		}
		for k := range s.RestoredKeyedState {
			for g, err := range snapshot.KeyedStateGroups(fs, dir, p.CheckpointID, p.Kind, uid, &s.RestoredKeyedState[k]) {
				if !yield(g, err) || err != nil {
					return
				}
			}
		}
	}
}

// restoreSeq numbers the directories LoadKeyedState copies native keyed
// state into.
var restoreSeq atomic.Uint64

// RemoveNativeCopies removes the directories into which LoadKeyedState
// copied native keyed state (SubtaskState.RestoredNative), for a plan that
// will not run. The subtasks of a plan that runs remove their own.
func RemoveNativeCopies(fs vfs.FS, plan *Plan) {
	if fs == nil {
		fs = vfs.Default
	}
	for _, s := range plan.Tasks {
		for k := range s.RestoredNative {
			if d := s.RestoredNative[k].Dir; d != "" {
				_ = fs.RemoveAll(d)
				s.RestoredNative[k].Dir = ""
			}
		}
	}
}

// Operator describes an operator of the job being started.
type Operator struct {
	UID  string
	Name string
	// Parallelism is the new number of subtasks.
	Parallelism int
	// MaxParallelism is the number of key groups; required if Keyed.
	MaxParallelism int
	// Keyed is set for operators with keyed state.
	Keyed bool
	// Inputs and Outputs are the operator's edges in the job: its channel
	// state is in-flight data on them (input channel state on an input
	// edge, output channel state on an output edge), named by edge
	// (checkpoint.ChannelBuffers), so it is found whatever the chaining.
	Inputs, Outputs []Edge
}

// Edge is an edge of the job being started, as channel state names it.
type Edge struct {
	// From and To are the uids of the operators it connects; Index is its
	// index among the edges from From to To (in From's output order).
	From, To string
	Index    int
	// Part is its partitioning.
	Part checkpoint.Partitioning
	// Chained: From and To run in one subtask (no channels; the runtime
	// hands the records in flight on the edge to To directly).
	Chained bool
}

func (e *Edge) names(c *checkpoint.ChannelBuffers) bool {
	return e.From == c.From && e.To == c.To && e.Index == c.Edge
}

// Plan is the state handed to each subtask of the new job.
type Plan struct {
	CheckpointID int64
	// Kind says whether the plan restores a checkpoint or a savepoint.
	Kind marker.Kind
	// Stop is set when it restores a stop-with-savepoint (the job that
	// took it ended there).
	Stop bool
	// Path is the checkpoint or savepoint directory; SubtaskState.Files are
	// relative to its parent, the job directory of that checkpoint.
	Path string
	// Tasks holds the state of every subtask of every restored operator;
	// a subtask without an entry starts empty. KeyGroupStart and
	// KeyGroupEnd are the subtask's new key-group range for keyed operators
	// and -1 otherwise. ChannelState and Channels are the subtask's own
	// channel state: the in-flight data to replay, output channels
	// first, then operator state, then input channels before any new input.
	// Keyed state in keyed-state files is handed over by reference
	// (RestoredKeyedState: only the blocks of the subtask's key groups),
	// checked by LoadKeyedState and read by the subtask through
	// KeyedState.
	Tasks map[checkpoint.TaskID]*checkpoint.SubtaskState
}

// Assign matches the state in md (read from path) to the operators of the
// new job by uid and redistributes it to the new parallelism (see the
// package documentation). State of an operator that is not in ops is an
// error unless allowNonRestored, in which case it is skipped and logged.
// Assign is pure, so every error it returns wraps ErrUnrecoverable.
func Assign(md *checkpoint.Metadata, path string, ops []Operator, allowNonRestored bool, logf Logf) (*Plan, error) {
	plan, err := assign(md, path, ops, allowNonRestored, logf)
	if err != nil {
		return nil, unrecoverable(err)
	}
	return plan, nil
}

func assign(md *checkpoint.Metadata, path string, ops []Operator, allowNonRestored bool, logf Logf) (*Plan, error) {
	if md == nil {
		return nil, fmt.Errorf("restore: %s: no metadata", path)
	}
	where := fmt.Sprintf("checkpoint %d (%s)", md.CheckpointID, path)
	if err := checkpoint.ValidateMetadata(md); err != nil {
		return nil, fmt.Errorf("restore: %s: %w", where, err)
	}
	byUID := make(map[string]*Operator, len(ops))
	for i := range ops {
		op := &ops[i]
		if err := validateOperator(op); err != nil {
			return nil, err
		}
		if _, dup := byUID[op.UID]; dup {
			return nil, fmt.Errorf("restore: operator uid %q appears twice in the job", op.UID)
		}
		byUID[op.UID] = op
	}
	moved, drop, err := checkChannels(md, byUID, where, allowNonRestored, logf)
	if err != nil {
		return nil, err
	}
	plan := &Plan{
		CheckpointID: md.CheckpointID,
		Kind:         md.Options.Kind,
		Stop:         md.Options.Stop,
		Path:         path,
		Tasks:        make(map[checkpoint.TaskID]*checkpoint.SubtaskState),
	}
	for i := range md.Operators {
		old := &md.Operators[i]
		op, ok := byUID[old.UID]
		switch {
		case ok:
			if err := assignOperator(plan.Tasks, old, op, moved[old.UID], drop, where); err != nil {
				return nil, err
			}
		case !hasState(old):
			logf.printf("restore: skipping empty state of operator uid %q in %s: not in the job", old.UID, where)
		case allowNonRestored:
			logf.printf("restore: skipping state of operator uid %q in %s: not in the job (AllowNonRestoredState)",
				old.UID, where)
		default:
			return nil, fmt.Errorf("restore: %s has state for operator uid %q which is not in the job; "+
				"remove it or set AllowNonRestoredState", where, old.UID)
		}
	}
	return plan, nil
}

func validateOperator(op *Operator) error {
	if op.UID == "" {
		return fmt.Errorf("restore: operator %q has an empty uid", op.Name)
	}
	if op.Parallelism < 1 || op.Parallelism > keygroup.UpperMaxParallelism {
		return fmt.Errorf("restore: operator uid %q: parallelism %d out of range (1..%d)",
			op.UID, op.Parallelism, keygroup.UpperMaxParallelism)
	}
	if op.Keyed {
		if err := keygroup.CheckParallelism(op.Parallelism, op.MaxParallelism); err != nil {
			return fmt.Errorf("restore: operator uid %q: %w", op.UID, err)
		}
	}
	return nil
}

// hasState reports whether any subtask of op recorded list, keyed (inline or
// in a file), file or channel state.
func hasState(op *checkpoint.OperatorState) bool {
	for i := range op.Subtasks {
		s := &op.Subtasks[i]
		if len(s.Lists) > 0 || len(s.KeyGroups) > 0 || s.KeyedState != nil || len(s.Files) > 0 || s.HasChannelState() {
			return true
		}
	}
	return false
}

// checkChannels checks that the channel state of every restored operator
// can be placed in the new job (R8) and returns the operators whose
// channel state must move to other channels (their parallelism changes, or
// that of an operator at the other end of an edge they hold in-flight data
// of: channels are indexed by subtasks) and the channels to drop (of edges
// the job no longer has, with allowNonRestored). In-flight data is
// refused, naming the edge, where the job no longer has its edge (unless
// allowNonRestored), where the edge's partitioning changed the records'
// encoding (to or from a hash edge) or their meaning (a broadcast edge,
// whose copies belong to one reader each, which cannot follow a changed
// parallelism either), and where it is in format version 1 and cannot be
// placed once the chaining may have changed (output channel state, and
// input channel state of an operator that is chained now).
func checkChannels(md *checkpoint.Metadata, byUID map[string]*Operator, where string, allowNonRestored bool,
	logf Logf) (map[string]bool, map[*checkpoint.ChannelBuffers]bool, error) {
	oldP := make(map[string]int, len(md.Operators))
	for i := range md.Operators {
		oldP[md.Operators[i].UID] = md.Operators[i].Parallelism
	}
	changed := func(uid string) bool {
		p, ok := oldP[uid]
		op := byUID[uid]
		return !ok || op == nil || p != op.Parallelism
	}
	moved := map[string]bool{}
	drop := map[*checkpoint.ChannelBuffers]bool{}
	for i := range md.Operators {
		old := &md.Operators[i]
		op, ok := byUID[old.UID]
		if !ok {
			continue // not restored (AllowNonRestoredState, or an error later)
		}
		for j := range old.Subtasks {
			s := &old.Subtasks[j]
			if !s.HasChannelState() {
				continue
			}
			if s.Channels == nil {
				return nil, nil, fmt.Errorf("restore: %s: operator uid %q subtask %d: channel state %v not loaded", where, op.UID, s.Subtask, s.ChannelState)
			}
			file := "in memory"
			if s.ChannelState != nil {
				file = s.ChannelState.File
			}
			at := fmt.Sprintf("restore: %s: operator uid %q subtask %d holds in-flight records (channel state, %s)", where, old.UID, s.Subtask, file)
			if changed(old.UID) {
				moved[old.UID] = true
			}
			for k := range s.Channels.Channels {
				c := &s.Channels.Channels[k]
				if len(c.Buffers) == 0 {
					continue
				}
				if s.Channels.Legacy {
					if err := checkLegacy(c, op, at); err != nil {
						return nil, nil, err
					}
					for _, e := range op.Inputs {
						if changed(e.From) {
							moved[old.UID] = true
						}
					}
					continue
				}
				edges, self, peer := op.Outputs, c.From, c.To
				if c.Kind == checkpoint.InputChannel {
					edges, self, peer = op.Inputs, c.To, c.From
				}
				if self != old.UID {
					return nil, nil, fmt.Errorf("%s of %s, but it is not an end of that edge", at, c.EdgeName())
				}
				e := slices.IndexFunc(edges, func(e Edge) bool { return e.names(c) })
				if e < 0 {
					if allowNonRestored {
						logf.printf("%s of %s, which the job no longer has: dropped (AllowNonRestoredState)", at, c.EdgeName())
						drop[c] = true
						continue
					}
					return nil, nil, fmt.Errorf("%s of %s, which the job no longer has; restore a job with that edge, "+
						"or an aligned checkpoint or savepoint, or set AllowNonRestoredState to drop them", at, c.EdgeName())
				}
				now := edges[e].Part
				if !c.Part.SameEncoding(now) {
					return nil, nil, fmt.Errorf("%s of %s, which was a %s edge and is a %s edge now: its in-flight records cannot "+
						"be placed on it; restore with the edge's old partitioning, or from an aligned checkpoint or savepoint",
						at, c.EdgeName(), c.Part, now)
				}
				if c.Part == checkpoint.PartBroadcast && (changed(c.From) || changed(c.To)) {
					return nil, nil, fmt.Errorf("%s of %s, a broadcast edge, whose in-flight records are copies for one receiver "+
						"each and cannot be redistributed to a new parallelism; restore at the checkpoint's parallelism, or from "+
						"an aligned checkpoint or savepoint", at, c.EdgeName())
				}
				if changed(peer) {
					moved[old.UID] = true
				}
			}
		}
	}
	return moved, drop, nil
}

// checkLegacy refuses channel c of format version 1 (no operators named)
// where it cannot be placed safely: output channel state was stored under
// the chain's head and indexed by the outputs of the chain's tail, which
// the metadata does not name; input channel state is its reader's, which
// must still read its own gate (not be chained to its writer).
func checkLegacy(c *checkpoint.ChannelBuffers, op *Operator, at string) error {
	const how = "restore the checkpoint with the version that wrote it and take a savepoint, or restore an aligned checkpoint or savepoint"
	if c.Kind == checkpoint.OutputChannel {
		return fmt.Errorf("%s in channel-state format version 1, which names output channels by their place in the old "+
			"operator chain, not by operator and edge: they cannot be placed once the chaining may have changed; %s", at, how)
	}
	for _, e := range op.Inputs {
		if e.Chained {
			return fmt.Errorf("%s in channel-state format version 1, of an input that is chained now (edge %q -> %q); %s",
				at, e.From, e.To, how)
		}
	}
	return nil
}

// cloneChannelState copies the channel state of s into n (R6, R8): the
// reference, and the in-memory channel state down to the buffer slices,
// without the channels in drop.
func cloneChannelState(n, s *checkpoint.SubtaskState, drop map[*checkpoint.ChannelBuffers]bool) {
	if s.ChannelState != nil {
		ref := *s.ChannelState
		n.ChannelState = &ref
	}
	if s.Channels != nil {
		cs := &checkpoint.ChannelState{Legacy: s.Channels.Legacy}
		for i := range s.Channels.Channels {
			c := &s.Channels.Channels[i]
			if drop[c] {
				continue
			}
			cs.Channels = append(cs.Channels, *c)
			cs.Channels[len(cs.Channels)-1].Buffers = slices.Clone(c.Buffers)
		}
		n.Channels = cs
	}
}

// assignOperator adds the new subtask states of one restored operator to
// tasks.
func assignOperator(tasks map[checkpoint.TaskID]*checkpoint.SubtaskState, old *checkpoint.OperatorState, op *Operator, moved bool,
	drop map[*checkpoint.ChannelBuffers]bool, where string) error {
	newP := op.Parallelism
	olds := make([]*checkpoint.SubtaskState, len(old.Subtasks))
	oldKeyed := false
	for i := range old.Subtasks {
		olds[i] = &old.Subtasks[i]
		oldKeyed = oldKeyed || olds[i].KeyGroupStart >= 0
	}
	slices.SortFunc(olds, func(a, b *checkpoint.SubtaskState) int { return a.Subtask - b.Subtask })

	if oldKeyed {
		if !op.Keyed {
			return fmt.Errorf("restore: %s: operator uid %q has keyed state but is not keyed in the job", where, op.UID)
		}
		if old.MaxParallelism < newP {
			return fmt.Errorf("restore: %s: operator uid %q: the max parallelism (%d) of the restored state is lower "+
				"than the configured parallelism (%d); reduce the parallelism to at most %d",
				where, op.UID, old.MaxParallelism, newP, old.MaxParallelism)
		}
		if old.MaxParallelism != op.MaxParallelism {
			return fmt.Errorf("restore: %s: operator uid %q: the max parallelism (%d) with which the state was taken "+
				"and the current max parallelism (%d) changed; this is currently not supported",
				where, op.UID, old.MaxParallelism, op.MaxParallelism)
		}
	}

	news := make([]*checkpoint.SubtaskState, newP)
	for i := range news {
		s := &checkpoint.SubtaskState{Subtask: i, KeyGroupStart: -1, KeyGroupEnd: -1}
		if op.Keyed {
			r := keygroup.RangeFor(op.MaxParallelism, newP, i)
			s.KeyGroupStart, s.KeyGroupEnd = r.Start, r.End
		}
		news[i] = s
	}
	samePar := old.Parallelism == newP
	assignLists(olds, news, samePar)

	// Keyed state follows its key group (R3). With unchanged parallelism
	// this is the identity for ranges made by keygroup.RangeFor.
	for _, s := range olds {
		for _, kg := range s.KeyGroups {
			j := keygroup.Owner(op.MaxParallelism, newP, kg.KeyGroup)
			news[j].KeyGroups = append(news[j].KeyGroups, kg)
		}
		assignKeyedBlocks(news, s.KeyedState, op.MaxParallelism)
		assignNative(news, s)
	}
	for _, s := range news {
		slices.SortStableFunc(s.KeyGroups, func(a, b checkpoint.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
	}

	if err := assignFiles(olds, news, samePar, old.Parallelism, where, op.UID); err != nil {
		return err
	}
	// Channel state stays with its subtask, unless its channels changed:
	// then every new subtask gets all of it and takes its share (R8).
	if moved {
		all := make([]*checkpoint.ChannelState, old.Parallelism)
		for _, s := range olds {
			if s.Subtask >= 0 && s.Subtask < len(all) && s.Channels != nil {
				var c checkpoint.SubtaskState
				cloneChannelState(&c, s, drop)
				all[s.Subtask] = c.Channels
			}
		}
		for _, s := range news {
			s.RescaledChannels = all
		}
	} else if samePar {
		for _, s := range olds {
			cloneChannelState(news[s.Subtask], s, drop)
		}
	}
	for _, s := range news {
		tasks[checkpoint.TaskID{Operator: op.UID, Subtask: s.Subtask}] = s
	}
	return nil
}

// assignKeyedBlocks hands the blocks of the keyed-state file ref (nil:
// none) to the new subtasks that own their key groups (R10): each new
// subtask gets one ref to the file, listing only its blocks, if it owns
// any.
func assignKeyedBlocks(news []*checkpoint.SubtaskState, ref *checkpoint.KeyedStateRef, maxP int) {
	if ref == nil {
		return
	}
	for _, g := range ref.Groups {
		n := news[keygroup.Owner(maxP, len(news), g.KeyGroup)]
		k := len(n.RestoredKeyedState) - 1
		if k < 0 || n.RestoredKeyedState[k].File != ref.File {
			n.RestoredKeyedState = append(n.RestoredKeyedState, checkpoint.KeyedStateRef{File: ref.File, Size: ref.Size})
			k++
		}
		n.RestoredKeyedState[k].Groups = append(n.RestoredKeyedState[k].Groups, g)
	}
}

// assignNative hands the native keyed state of old subtask s (if any) to
// every new subtask whose key-group range overlaps s's (R12).
func assignNative(news []*checkpoint.SubtaskState, s *checkpoint.SubtaskState) {
	if s.Native == nil {
		return
	}
	for _, n := range news {
		if n.KeyGroupStart <= s.KeyGroupEnd && s.KeyGroupStart <= n.KeyGroupEnd {
			n.RestoredNative = append(n.RestoredNative, checkpoint.NativeRestore{
				KeyGroupStart: s.KeyGroupStart, KeyGroupEnd: s.KeyGroupEnd, Ref: s.Native})
		}
	}
}

// assignLists redistributes operator list state (reference §5): Split lists
// unchanged with unchanged parallelism, otherwise pooled and cut into even
// contiguous chunks; Union lists concatenated for every subtask.
func assignLists(olds, news []*checkpoint.SubtaskState, samePar bool) {
	type list struct {
		dist  checkpoint.Distribution
		total int
	}
	var names []string
	lists := make(map[string]*list)
	for _, s := range olds {
		for _, l := range s.Lists {
			acc, ok := lists[l.Name]
			if !ok {
				acc = &list{dist: l.Distribution}
				lists[l.Name] = acc
				names = append(names, l.Name)
			}
			acc.total += len(l.Items)
		}
	}
	for _, name := range names {
		acc := lists[name]
		// pooled holds the elements of all old subtasks in subtask order.
		var pooled [][]byte
		if acc.dist == checkpoint.Union || !samePar {
			pooled = make([][]byte, 0, acc.total)
			for _, s := range olds {
				if l := findList(s, name); l != nil {
					pooled = append(pooled, l.Items...)
				}
			}
		}
		switch {
		case acc.dist == checkpoint.Union:
			for _, s := range news {
				s.Lists = append(s.Lists, checkpoint.NamedList{Name: name, Distribution: checkpoint.Union, Items: cloneItems(pooled)})
			}
		case samePar:
			own := make([][][]byte, len(news))
			for _, s := range olds {
				if l := findList(s, name); l != nil {
					own[s.Subtask] = l.Items
				}
			}
			for i, s := range news {
				s.Lists = append(s.Lists, checkpoint.NamedList{Name: name, Distribution: checkpoint.Split, Items: cloneItems(own[i])})
			}
		default:
			p := len(news)
			base, extra := acc.total/p, acc.total%p
			off := 0
			for i, s := range news {
				n := base
				if i < extra {
					n++
				}
				s.Lists = append(s.Lists, checkpoint.NamedList{Name: name, Distribution: checkpoint.Split, Items: cloneItems(pooled[off : off+n])})
				off += n
			}
		}
	}
}

func findList(s *checkpoint.SubtaskState, name string) *checkpoint.NamedList {
	for i := range s.Lists {
		if s.Lists[i].Name == name {
			return &s.Lists[i]
		}
	}
	return nil
}

// cloneItems copies the outer slice (R6); nil when empty.
func cloneItems(items [][]byte) [][]byte {
	if len(items) == 0 {
		return nil
	}
	return slices.Clone(items)
}

// assignFiles hands state files to the new subtasks: unchanged with
// unchanged parallelism, otherwise to every new subtask whose key-group range
// intersects the old subtask's.
func assignFiles(olds, news []*checkpoint.SubtaskState, samePar bool, oldP int, where, uid string) error {
	if samePar {
		for _, s := range olds {
			if len(s.Files) > 0 {
				news[s.Subtask].Files = slices.Clone(s.Files)
			}
		}
		return nil
	}
	for _, s := range olds {
		if len(s.Files) == 0 {
			continue
		}
		if s.KeyGroupStart < 0 {
			return fmt.Errorf("restore: %s: operator uid %q: subtask %d has state files but no key-group range; "+
				"they cannot be redistributed from parallelism %d to %d", where, uid, s.Subtask, oldP, len(news))
		}
		oldRange := keygroup.Range{Start: s.KeyGroupStart, End: s.KeyGroupEnd}
		for _, n := range news {
			if n.KeyGroupStart < 0 || oldRange.Intersect(keygroup.Range{Start: n.KeyGroupStart, End: n.KeyGroupEnd}).Len() == 0 {
				continue
			}
			for _, f := range s.Files {
				if !slices.Contains(n.Files, f) {
					n.Files = append(n.Files, f)
				}
			}
		}
	}
	return nil
}
