package state

import (
	"fmt"
	"slices"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
	"github.com/snapflow/snapflow/state/internal/engine"
)

// OperatorStore holds the operator (non-keyed) state of one subtask: named
// lists of elements. It is owned by one goroutine.
type OperatorStore struct {
	restoring bool
	// restored holds the restored lists whose names are not registered yet
	// (S3). An entry moves to lists when its name is registered.
	restored map[string]checkpoint.NamedList
	lists    map[string]operatorList
}

// operatorList is a registered *List[T] as the store sees it.
type operatorList interface {
	describe() string
	snapshot(e *engine.Encoder) (checkpoint.NamedList, error)
}

// NewOperatorStore returns the operator state of one subtask. restoring says
// whether the subtask starts from a checkpoint or savepoint, which Restored
// reports. It holds even if restored is empty, because a subtask can restore
// with no operator state of its own. restored holds the lists that the restore
// assignment gave this subtask. Lists that share a name are merged in order.
// restored must be empty on a fresh start, and lists that share a name must
// have the same distribution.
func NewOperatorStore(restored []checkpoint.NamedList, restoring bool) (*OperatorStore, error) {
	if !restoring && len(restored) > 0 {
		return nil, fmt.Errorf("state: %d restored operator lists given for a fresh start", len(restored))
	}
	s := &OperatorStore{
		restoring: restoring,
		restored:  make(map[string]checkpoint.NamedList, len(restored)),
		lists:     make(map[string]operatorList),
	}
	for _, l := range restored {
		prev, ok := s.restored[l.Name]
		if !ok {
			s.restored[l.Name] = l
			continue
		}
		if prev.Distribution != l.Distribution {
			return nil, fmt.Errorf("state: restored list state %q is both %s and %s list state", l.Name, prev.Distribution, l.Distribution)
		}
		prev.Items = append(slices.Clip(prev.Items), l.Items...)
		s.restored[l.Name] = prev
	}
	return s, nil
}

// Restored reports whether the subtask started from a checkpoint or savepoint
// (Flink's isRestored).
func (s *OperatorStore) Restored() bool { return s.restoring }

// ListState registers the split-distributed list state name with elements
// of type T, or returns it if it is already registered. On first
// registration it decodes the restored elements of that name. With unchanged
// parallelism those are exactly the elements this subtask snapshotted.
// Otherwise they are this subtask's share of the elements of all old subtasks.
func ListState[T any](s *OperatorStore, name string) (*List[T], error) {
	return registerList[T](s, name, checkpoint.Split)
}

// UnionListState registers the union-distributed list state name with
// elements of type T, or returns it if it is already registered. On restore
// every subtask gets the elements of all old subtasks.
func UnionListState[T any](s *OperatorStore, name string) (*List[T], error) {
	return registerList[T](s, name, checkpoint.Union)
}

func registerList[T any](s *OperatorStore, name string, d checkpoint.Distribution) (*List[T], error) {
	want := describeList[T](d)
	if l, ok := s.lists[name]; ok {
		if tl, ok := l.(*List[T]); ok && tl.dist == d {
			return tl, nil
		}
		return nil, fmt.Errorf("state: list state %q already registered as %s; requested %s", name, l.describe(), want)
	}
	l := &List[T]{name: name, dist: d}
	if r, ok := s.restored[name]; ok {
		if r.Distribution != d {
			// As Flink: the distribution of a state cannot change (S4).
			return nil, fmt.Errorf("state: list state %q was restored as %s list state; cannot register it as %s", name, r.Distribution, want)
		}
		if len(r.Items) > 0 {
			l.items = make([]T, len(r.Items))
		}
		dec := engine.NewDecoder()
		for i, b := range r.Items {
			if err := engine.DecodeInto(dec, b, &l.items[i]); err != nil {
				return nil, fmt.Errorf("state: decoding element %d of restored list state %q as %s: %w", i, name, engine.TypeName[T](), err)
			}
		}
		delete(s.restored, name)
	}
	s.lists[name] = l
	return l, nil
}

func describeList[T any](d checkpoint.Distribution) string {
	return fmt.Sprintf("%s list state of %s", d, engine.TypeName[T]())
}

// Snapshot encodes every registered list, and every restored list that was
// never registered (carried over unchanged, S3), sorted by name (S1). The
// result shares no memory that later calls on s change.
func (s *OperatorStore) Snapshot() ([]checkpoint.NamedList, error) {
	if len(s.lists)+len(s.restored) == 0 {
		return nil, nil
	}
	out := make([]checkpoint.NamedList, 0, len(s.lists)+len(s.restored))
	e := engine.NewEncoder()
	for name, l := range s.lists {
		nl, err := l.snapshot(e)
		if err != nil {
			return nil, fmt.Errorf("state: snapshotting list state %q: %w", name, err)
		}
		out = append(out, nl)
	}
	for _, r := range s.restored {
		// Restored bytes are never written, so sharing them is safe.
		r.Items = slices.Clip(r.Items)
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b checkpoint.NamedList) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out, nil
}

// List is an operator list state with elements of type T.
type List[T any] struct {
	name  string
	dist  checkpoint.Distribution
	items []T
}

// Name returns the name the list was registered under.
func (l *List[T]) Name() string { return l.name }

// Distribution returns how the list is redistributed on restore.
func (l *List[T]) Distribution() checkpoint.Distribution { return l.dist }

// Get returns the elements in order. Later calls on l do not change the
// returned slice. Callers must not modify its elements in place, because
// those elements are the state.
func (l *List[T]) Get() []T { return slices.Clip(l.items) }

// Add appends v.
func (l *List[T]) Add(v T) { l.items = append(l.items, v) }

// AddAll appends vs in order.
func (l *List[T]) AddAll(vs ...T) { l.items = append(l.items, vs...) }

// Update replaces the elements with a copy of vs.
func (l *List[T]) Update(vs []T) {
	if len(vs) == 0 {
		l.items = nil
		return
	}
	l.items = slices.Clone(vs)
}

// Clear removes all elements.
func (l *List[T]) Clear() { l.items = nil }

// Len returns the number of elements.
func (l *List[T]) Len() int { return len(l.items) }

func (l *List[T]) describe() string { return describeList[T](l.dist) }

func (l *List[T]) snapshot(e *engine.Encoder) (checkpoint.NamedList, error) {
	nl := checkpoint.NamedList{Name: l.name, Distribution: l.dist}
	if len(l.items) == 0 {
		return nl, nil
	}
	nl.Items = make([][]byte, len(l.items))
	for i := range l.items {
		b, err := e.Encode(&l.items[i])
		if err != nil {
			return nl, fmt.Errorf("encoding element %d: %w", i, err)
		}
		nl.Items[i] = b
	}
	return nl, nil
}
