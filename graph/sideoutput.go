package graph

import (
	"context"
	"fmt"
	"reflect"

	"github.com/snapflow/snapflow/internal/runtime/task"
)

// OutputTag names a side output of records T (Flink's OutputTag): a
// Process or ProcessKeyed function declares it with the SideOutputs
// option, emits to it with Emit, and SideOutputOf makes the stream of
// what it emitted. The id tells an operator's side outputs apart; it must
// be unique among them and not empty. A tag is a value to share between
// the function and the job's builder; it holds no records.
type OutputTag[T any] struct{ id string }

// NewOutputTag returns the tag of side output id with records T.
func NewOutputTag[T any](id string) *OutputTag[T] { return &OutputTag[T]{id: id} }

// ID is the tag's id.
func (t *OutputTag[T]) ID() string { return t.id }

func (t *OutputTag[T]) String() string {
	return fmt.Sprintf("side output %q (%v)", t.id, reflect.TypeFor[T]())
}

// Emit emits v to the side output t of the operator whose function ctx
// belongs to (a *Context, *KeyedContext or *SnapshotContext), from
// Process, OnTimer, EndInput or PrepareBarrier. Side records are
// exactly-once like the main ones: every event of the operator's output
// (barriers, watermarks, end of input) goes out on the side edges too. A
// side output nobody reads (no SideOutputOf) drops its records, as Flink
// does. Emitting to a tag the operator did not declare with SideOutputs
// fails the subtask once the current call returns, naming operator and
// tag.
func (t *OutputTag[T]) Emit(ctx AnyContext, v T) {
	c := ctx.base()
	for i := range c.sides {
		s := &c.sides[i]
		if s.id != t.id {
			continue
		}
		if o, ok := s.out.(*task.Output[T]); ok {
			o.Collect(v)
			return
		}
		break
	}
	c.undeclaredSide(t)
}

//go:noinline
func (c *Context) undeclaredSide(t SideTag) {
	if c.sideErr != nil {
		return
	}
	for _, s := range c.sides {
		if s.id == t.tagID() {
			c.sideErr = fmt.Errorf("graph: operator %q emitted to %v, but it declares side output %q for records of type %v", c.info.UID, t, s.id, s.elem)
			return
		}
	}
	c.sideErr = fmt.Errorf("graph: operator %q emitted to %v, which it does not declare (add graph.SideOutputs(tag) to its options)", c.info.UID, t)
}

func (t *OutputTag[T]) tagID() string         { return t.id }
func (t *OutputTag[T]) tagType() reflect.Type { return reflect.TypeFor[T]() }

func (t *OutputTag[T]) newOutput(ctx context.Context, a *attempt, v *vertex, i int) (any, task.Emitter) {
	o := outputFor[T](ctx, a, v, i, t.id)
	return o, o
}

// SideTag is an *OutputTag of any record type, for SideOutputs.
type SideTag interface {
	fmt.Stringer
	tagID() string
	tagType() reflect.Type
	// newOutput returns subtask i's *task.Output[T] over v's edges of the
	// side output, as itself and as an Emitter.
	newOutput(ctx context.Context, a *attempt, v *vertex, i int) (any, task.Emitter)
}

// AnyContext is a function's context of any kind: *Context,
// *KeyedContext[K] or *SnapshotContext.
type AnyContext interface{ base() *Context }

func (c *Context) base() *Context { return c }

// SideOutputs declares the side outputs a Process or ProcessKeyed
// operator emits to (OutputTag.Emit). Validation rejects it on other
// operators, and duplicate or empty ids.
func SideOutputs(tags ...SideTag) Option {
	return func(v *vertex) { v.sides = append(v.sides, tags...) }
}

// SideOutputOf is the stream of the records that the operator producing
// main emitted to tag. main must be the output of one Process or
// ProcessKeyed operator (not a Union, a side output or an iteration) that
// declared tag with SideOutputs; otherwise validation fails naming the
// operator and the tag. Side edges are never chained: the operator runs
// as the last of its chain, its side and main records going to channels.
func SideOutputOf[T, S any](main *Stream[T], tag *OutputTag[S]) *Stream[S] {
	j := main.job
	out := &Stream[S]{job: j}
	if tag == nil {
		j.errorf("graph: SideOutputOf with a nil tag")
		return out
	}
	if len(main.parts) != 1 || main.parts[0].v == nil || main.parts[0].side != "" {
		j.errorf("graph: SideOutputOf(%v): the stream is not the main output of one operator", tag)
		return out
	}
	v := main.parts[0].v
	declared := false
	for _, t := range v.sides {
		if t.tagID() == tag.id && t.tagType() == tag.tagType() {
			declared = true
		}
	}
	if !declared {
		j.errorf("graph: %s does not declare %v, so it cannot emit to it (add graph.SideOutputs(tag) to its options)", v, tag)
	}
	out.parts = []stream{{v: v, side: tag.id}}
	return out
}

// validateSides checks v's side output declarations.
func validateSides(v *vertex) []error {
	if len(v.sides) == 0 {
		return nil
	}
	if !v.sidesOK {
		return []error{fmt.Errorf("graph: %s: SideOutputs applies to Process and ProcessKeyed operators only", v)}
	}
	var errs []error
	seen := map[string]bool{}
	for _, t := range v.sides {
		switch id := t.tagID(); {
		case id == "":
			errs = append(errs, fmt.Errorf("graph: %s: %v has an empty id", v, t))
		case seen[id]:
			errs = append(errs, fmt.Errorf("graph: %s: side output id %q declared twice", v, id))
		default:
			seen[id] = true
		}
	}
	return errs
}

// sideSlot is one declared side output of a subtask: its id, record type
// and *task.Output[T].
type sideSlot struct {
	id   string
	elem reflect.Type
	out  any
}

// withSides returns subtask i's side outputs of v and the member's
// Emitter: main alone when no side output has edges, else a task.Outputs
// of main and the side outputs with edges (a side edge is never chained,
// so v is then the tail of its chain and main writes channels too).
func withSides(ctx context.Context, a *attempt, v *vertex, i int, main task.Emitter) ([]sideSlot, task.Emitter) {
	if len(v.sides) == 0 {
		return nil, main
	}
	edgesOf := func(side string) []int {
		var ix []int
		for k, e := range v.outputs {
			if e.side == side {
				ix = append(ix, k)
			}
		}
		return ix
	}
	slots := make([]sideSlot, len(v.sides))
	outs, edges := []task.Emitter{main}, [][]int{edgesOf("")}
	for k, t := range v.sides {
		out, em := t.newOutput(ctx, a, v, i)
		slots[k] = sideSlot{id: t.tagID(), elem: t.tagType(), out: out}
		if ix := edgesOf(t.tagID()); len(ix) > 0 {
			outs, edges = append(outs, em), append(edges, ix)
		}
	}
	if len(outs) == 1 {
		return slots, main
	}
	return slots, task.NewOutputs(outs, edges)
}
