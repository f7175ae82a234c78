package restore

import (
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/snapflow/snapflow/snapshot"
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

// Latest returns the newest completed checkpoint in st whose _metadata
// decodes, and its directory. Each newer checkpoint that is corrupt,
// truncated, invalid or gone is skipped with a warning through logf naming
// its path, the error and the checkpoint tried next (R5). It returns
// (nil, "", nil) when st has no completed checkpoint, and an error when it
// has some but none is usable, or when reading one fails otherwise.
func Latest(st *snapshot.Storage, logf Logf) (*snapshot.Metadata, string, error) {
	refs, err := st.Checkpoints()
	if err != nil {
		return nil, "", fmt.Errorf("restore: %w", err)
	}
	if len(refs) == 0 {
		return nil, "", nil
	}
	fs := st.FS()
	var newestErr error
	for i := len(refs) - 1; i >= 0; i-- {
		ref := refs[i]
		md, err := snapshot.ReadMetadata(fs, ref.Path)
		if err == nil && md.CheckpointID != ref.ID {
			err = fmt.Errorf("%w: %s holds checkpoint %d", snapshot.ErrInvalid, ref.Path, md.CheckpointID)
		}
		if err == nil {
			return md, ref.Path, nil
		}
		if !skippable(err) {
			return nil, "", fmt.Errorf("restore: checkpoint %s: %w", ref.Path, err)
		}
		if newestErr == nil {
			newestErr = err
		}
		next := "no older checkpoint"
		if i > 0 {
			next = "falling back to " + fs.PathBase(refs[i-1].Path)
		}
		logf.printf("restore: skipping checkpoint %s: %v; %s", ref.Path, cause(err), next)
	}
	return nil, "", fmt.Errorf("restore: none of the %d checkpoints in %s is usable; the newest: %w",
		len(refs), st.JobDir(), newestErr)
}

// skippable reports whether Latest may fall back past a checkpoint that
// failed with err (R5).
func skippable(err error) bool {
	return errors.Is(err, snapshot.ErrCorrupt) || errors.Is(err, snapshot.ErrInvalid) || errors.Is(err, os.ErrNotExist)
}

// cause strips the *snapshot.ReadError around err when the message already
// names the checkpoint.
func cause(err error) error {
	if re := (*snapshot.ReadError)(nil); errors.As(err, &re) {
		return re.Err
	}
	return err
}

// Load reads the checkpoint or savepoint at path: its directory or its
// _metadata file. Unlike Latest it never falls back.
func Load(fs vfs.FS, path string) (*snapshot.Metadata, error) {
	md, err := snapshot.ReadMetadata(fs, path)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return md, nil
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
}

// Plan is the state handed to each subtask of the new job.
type Plan struct {
	CheckpointID int64
	// Path is the checkpoint or savepoint directory; SubtaskState.Files are
	// relative to its parent, the job directory of that checkpoint.
	Path string
	// Tasks holds the state of every subtask of every restored operator
	// (R4); a subtask without an entry starts empty. KeyGroupStart and
	// KeyGroupEnd are the subtask's new key-group range for keyed operators
	// and -1 otherwise.
	Tasks map[snapshot.TaskID]*snapshot.SubtaskState
}

// Assign matches the state in md (read from path) to the operators of the
// new job by uid and redistributes it to the new parallelism (see the
// package documentation). State of an operator that is not in ops is an
// error unless allowNonRestored, in which case it is skipped and logged.
func Assign(md *snapshot.Metadata, path string, ops []Operator, allowNonRestored bool, logf Logf) (*Plan, error) {
	if md == nil {
		return nil, fmt.Errorf("restore: %s: no metadata", path)
	}
	where := fmt.Sprintf("checkpoint %d (%s)", md.CheckpointID, path)
	if err := snapshot.ValidateMetadata(md); err != nil {
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
	plan := &Plan{
		CheckpointID: md.CheckpointID,
		Path:         path,
		Tasks:        make(map[snapshot.TaskID]*snapshot.SubtaskState),
	}
	for i := range md.Operators {
		old := &md.Operators[i]
		op, ok := byUID[old.UID]
		switch {
		case ok:
			if err := assignOperator(plan.Tasks, old, op, where); err != nil {
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

// hasState reports whether any subtask of op recorded list, keyed or file
// state.
func hasState(op *snapshot.OperatorState) bool {
	for i := range op.Subtasks {
		s := &op.Subtasks[i]
		if len(s.Lists) > 0 || len(s.KeyGroups) > 0 || len(s.Files) > 0 {
			return true
		}
	}
	return false
}

// assignOperator adds the new subtask states of one restored operator to
// tasks.
func assignOperator(tasks map[snapshot.TaskID]*snapshot.SubtaskState, old *snapshot.OperatorState, op *Operator, where string) error {
	newP := op.Parallelism
	olds := make([]*snapshot.SubtaskState, len(old.Subtasks))
	oldKeyed := false
	for i := range old.Subtasks {
		olds[i] = &old.Subtasks[i]
		oldKeyed = oldKeyed || olds[i].KeyGroupStart >= 0
	}
	slices.SortFunc(olds, func(a, b *snapshot.SubtaskState) int { return a.Subtask - b.Subtask })

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

	news := make([]*snapshot.SubtaskState, newP)
	for i := range news {
		s := &snapshot.SubtaskState{Subtask: i, KeyGroupStart: -1, KeyGroupEnd: -1}
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
	}
	for _, s := range news {
		slices.SortStableFunc(s.KeyGroups, func(a, b snapshot.KeyGroupState) int { return a.KeyGroup - b.KeyGroup })
	}

	if err := assignFiles(olds, news, samePar, old.Parallelism, where, op.UID); err != nil {
		return err
	}
	for _, s := range news {
		tasks[snapshot.TaskID{Operator: op.UID, Subtask: s.Subtask}] = s
	}
	return nil
}

// assignLists redistributes operator list state (reference §5): Split lists
// unchanged with unchanged parallelism, otherwise pooled and cut into even
// contiguous chunks; Union lists concatenated for every subtask.
func assignLists(olds, news []*snapshot.SubtaskState, samePar bool) {
	type list struct {
		dist  snapshot.Distribution
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
		if acc.dist == snapshot.Union || !samePar {
			pooled = make([][]byte, 0, acc.total)
			for _, s := range olds {
				if l := findList(s, name); l != nil {
					pooled = append(pooled, l.Items...)
				}
			}
		}
		switch {
		case acc.dist == snapshot.Union:
			for _, s := range news {
				s.Lists = append(s.Lists, snapshot.NamedList{Name: name, Distribution: snapshot.Union, Items: cloneItems(pooled)})
			}
		case samePar:
			own := make([][][]byte, len(news))
			for _, s := range olds {
				if l := findList(s, name); l != nil {
					own[s.Subtask] = l.Items
				}
			}
			for i, s := range news {
				s.Lists = append(s.Lists, snapshot.NamedList{Name: name, Distribution: snapshot.Split, Items: cloneItems(own[i])})
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
				s.Lists = append(s.Lists, snapshot.NamedList{Name: name, Distribution: snapshot.Split, Items: cloneItems(pooled[off : off+n])})
				off += n
			}
		}
	}
}

func findList(s *snapshot.SubtaskState, name string) *snapshot.NamedList {
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
func assignFiles(olds, news []*snapshot.SubtaskState, samePar bool, oldP int, where, uid string) error {
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
