package graph

import (
	"fmt"
	"reflect"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/channel/netchan"
)

// Partitioning says how records move from the subtasks of one operator to
// the subtasks of the next.
type Partitioning uint8

const (
	// Auto is Forward when both sides have the same parallelism and
	// Rebalance otherwise.
	Auto Partitioning = iota
	// Forward sends subtask i's records to subtask i (same parallelism).
	Forward
	// Rebalance sends records round-robin to every downstream subtask.
	Rebalance
	// Hash routes by key: key -> key group -> owning subtask.
	Hash
	// Broadcast sends every record to every downstream subtask.
	Broadcast
)

func (p Partitioning) String() string {
	return [...]string{"auto", "forward", "rebalance", "hash", "broadcast"}[p]
}

type vertexKind uint8

const (
	kindSource vertexKind = iota
	kindOperator
	kindSink
)

func (k vertexKind) String() string { return [...]string{"source", "operator", "sink"}[k] }

// vertex is one operator of the job graph, type-erased; the typed builder
// functions capture the element types in its closures.
type vertex struct {
	id             int
	kind           vertexKind
	uid, name      string
	parallelism    int  // the job default unless parallelismSet
	parallelismSet bool // set by the Parallelism option
	maxParallelism int  // 0: job default
	keyed          bool
	// loop is the loop the vertex belongs to (set by Validate): its
	// strongly connected component closed by feedback edges, from 1; 0
	// outside loops.
	loop    int
	inputs  []*edge
	outputs []*edge
	noChain bool
	// member builds subtask i's operator as a chain member; next is the
	// chained consumer's ProcessBatch (nil when v's output goes to
	// channels). It also returns what the chain loop needs from a head: the
	// operator's func([]IN) error ProcessBatch, or its task.SourceOperator.
	member memberFunc
	// run runs subtask i of a chain that v heads (see run.go).
	run runFunc
	// watermarks is a source's WatermarkStrategy[T] (the Watermarks
	// option), nil if none.
	watermarks any
	// sides are the side outputs the operator declares (SideOutputs);
	// sidesOK is set by the builders whose functions can emit them
	// (Process, ProcessKeyed).
	sides   []SideTag
	sidesOK bool
}

func (v *vertex) String() string {
	return fmt.Sprintf("%s %q (%s)", v.kind, v.uid, v.name)
}

// edge connects two vertices. Its channels are made per attempt (see
// attempt.chans).
type edge struct {
	from, to *vertex
	part     Partitioning
	// chained: both ends run in one subtask (set by Validate).
	chained bool
	// newChan creates a *channel.Chan[E] for the edge's element type E
	// (elem); newNet a network channel of E (netwire.go).
	newChan func(channel.Config) any
	newNet  func(n *netEnds, id netchan.ChannelID, attempt int64, cfg channel.Config) (any, error)
	// partitioner is a hash edge's hashPartitioner[T, K] (operators.go),
	// or a two-input operator's input's coEdge (coprocess.go): it makes
	// the edge's channels (of task.Keyed[K, T], or of the operator's
	// input type) and each upstream's output edge. Nil otherwise.
	partitioner any
	// elem is the type of the records the edge's channels carry (T, or
	// task.Keyed[K, T] on a hash edge).
	elem reflect.Type
	// feedback: the edge closes an iteration (Iteration.CloseWith). Its
	// channels are unbounded and it is never chained.
	feedback bool
	// side is the id of the side output the edge carries ("" for the main
	// output). A side edge is never chained.
	side string
}

// stream is one upstream of a Stream: a vertex and how to partition its
// output. A Stream made by Union has several.
type stream struct {
	v           *vertex
	part        Partitioning
	partitioner any // see edge.partitioner
	// side is the id of v's side output the stream is ("": v's main
	// output; see SideOutputOf).
	side string
	// iter, with v nil, stands for the feedback of an iteration that is
	// not closed yet (Iteration.Stream): connecting it registers the
	// consumer, and CloseWith adds the feedback edges.
	iter *iteration
}

// Stream is a typed stream of records produced by one or more operators.
type Stream[T any] struct {
	job   *Job
	parts []stream
}

// KeyedStream is a stream partitioned by key: every record with the same key
// reaches the same subtask of the next keyed operator, through the record's
// key group.
type KeyedStream[K comparable, T any] struct {
	s   *Stream[T]
	key func(T) K
}

// Option configures one operator.
type Option func(*vertex)

// Name sets the display name (default: the uid).
func Name(name string) Option { return func(v *vertex) { v.name = name } }

// DisableChaining keeps the operator out of operator chains: it runs on its
// own goroutine(s), connected to its neighbours by channels.
func DisableChaining() Option { return func(v *vertex) { v.noChain = true } }

// Parallelism sets the number of subtasks of the operator (at least 1).
func Parallelism(p int) Option {
	return func(v *vertex) { v.parallelism, v.parallelismSet = p, true }
}

// MaxParallelism sets the number of key groups (the upper bound for
// rescaling) of the operator.
func MaxParallelism(p int) Option { return func(v *vertex) { v.maxParallelism = p } }

func (j *Job) addVertex(kind vertexKind, uid string, opts []Option) *vertex {
	v := &vertex{id: len(j.vertices), kind: kind, uid: uid, name: uid}
	for _, o := range opts {
		o(v)
	}
	if v.watermarks != nil && kind != kindSource {
		j.errorf("graph: %s: Watermarks applies to sources only", v)
	}
	j.vertices = append(j.vertices, v)
	return v
}

func (s *Stream[T]) with(p Partitioning) *Stream[T] {
	parts := make([]stream, len(s.parts))
	for i, st := range s.parts {
		st.part, st.partitioner = p, nil
		parts[i] = st
	}
	return &Stream[T]{job: s.job, parts: parts}
}

// Forward connects subtask i to subtask i of the next operator, which must
// have the same parallelism.
func (s *Stream[T]) Forward() *Stream[T] { return s.with(Forward) }

// Rebalance distributes records round-robin over the next operator's
// subtasks.
func (s *Stream[T]) Rebalance() *Stream[T] { return s.with(Rebalance) }

// Broadcast sends every record to every subtask of the next operator.
func (s *Stream[T]) Broadcast() *Stream[T] { return s.with(Broadcast) }

// Union merges streams of the same type; the next operator reads all of
// them, each with its own partitioning.
func Union[T any](s *Stream[T], others ...*Stream[T]) *Stream[T] {
	parts := append([]stream(nil), s.parts...)
	for _, o := range others {
		if o.job != s.job {
			s.job.errorf("graph: Union of streams from different jobs")
			continue
		}
		parts = append(parts, o.parts...)
	}
	return &Stream[T]{job: s.job, parts: parts}
}

// KeyBy partitions s by the key that key extracts. The key must be
// deterministic: the same record must always yield the same key, in every
// process, or keyed state cannot be found after a restore.
//
// key is called once per record, by the upstream subtask, which also hashes
// the key into its key group once; record, key and key group travel
// together to the keyed operator, which does not call key again. Set the
// environment variable SNAPFLOW_VERIFY_KEYS=1 to have keyed operators call
// key and hash again and fail on a non-deterministic key function (a
// debugging aid: it costs a second call and hash per record).
func KeyBy[T any, K comparable](s *Stream[T], key func(T) K) *KeyedStream[K, T] {
	if key == nil {
		s.job.errorf("graph: KeyBy with a nil key function")
	}
	if err := stableKey(reflect.TypeFor[K](), "the key"); err != nil {
		s.job.errorf("graph: KeyBy: %v: its key group and its identity in keyed state would differ between processes, so a restore would lose its state; key by a value (a string, a number, a struct of them)", err)
	}
	parts := make([]stream, len(s.parts))
	for i, st := range s.parts {
		st.part = Hash
		st.partitioner = hashPartitioner[T, K]{key: key}
		parts[i] = st
	}
	return &KeyedStream[K, T]{s: &Stream[T]{job: s.job, parts: parts}, key: key}
}

// stableKey reports why keys of type t have no identity that survives a
// process (nil if they do): a pointer, interface, channel or unsafe
// pointer, anywhere inside t, compares by address or dynamic type, and
// keygroup.Hash hashes what it points to, so two equal-looking keys are
// different keys and a restored key matches no live one.
func stableKey(t reflect.Type, path string) error {
	switch t.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Chan, reflect.UnsafePointer:
		return fmt.Errorf("%s has type %s, which compares by address or dynamic type", path, t)
	case reflect.Array:
		return stableKey(t.Elem(), path+"[]")
	case reflect.Struct:
		for i := range t.NumField() {
			if err := stableKey(t.Field(i).Type, path+"."+t.Field(i).Name); err != nil {
				return err
			}
		}
	}
	return nil
}

// connect adds the edges from every upstream of in to v.
func connect[T any](in *Stream[T], v *vertex) {
	for _, st := range in.parts {
		if st.v == nil {
			// The feedback of an open iteration: its edges come with
			// CloseWith, after v's other inputs.
			if st.iter.closed {
				in.job.errorf("graph: %s: %s reads its Stream after CloseWith; read it before closing the loop", st.iter, v)
				continue
			}
			st.iter.heads = append(st.iter.heads, feedbackHead{to: v, part: st.part, partitioner: st.partitioner})
			continue
		}
		e := newEdge[T](st.v, v, st.part, st.partitioner)
		e.side = st.side
		link(e)
	}
}

func newEdge[T any](from, to *vertex, part Partitioning, partitioner any) *edge {
	e := &edge{
		from: from, to: to, part: part, partitioner: partitioner,
		newChan: func(cfg channel.Config) any { return channel.New[T](cfg) },
		newNet:  newNetLink[T],
		elem:    reflect.TypeFor[T](),
	}
	if m, ok := partitioner.(chanMaker); ok {
		e.newChan, e.newNet, e.elem = m.newChan, m.newNet, m.elemType()
	}
	return e
}

// link adds e to the outputs of its producer and the inputs of its
// consumer.
func link(e *edge) {
	e.from.outputs = append(e.from.outputs, e)
	e.to.inputs = append(e.to.inputs, e)
}
