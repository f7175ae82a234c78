package graph

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/snapflow/snapflow/snapshot/checkpoint"
)

type emptySource struct{}

func (emptySource) Next(*Context) (int64, error) { return 0, io.EOF }

// TestAlignmentMembersPerAttempt: every subtask of every source naming a
// group is a member, sources of different operators (and record types)
// in one group align together, other groups apart, and every attempt
// gets a fresh registry: what a member did in one attempt does not pause
// its successor.
func TestAlignmentMembersPerAttempt(t *testing.T) {
	j := NewJob("alignment-members", Config{})
	newSrc := func() SourceFunc[int64] { return emptySource{} }
	ws := func(group string, drift time.Duration) Option {
		return Watermarks(WatermarkStrategy[int64]{Timestamp: func(v int64) int64 { return v }, Alignment: WatermarkAlignment{Group: group, MaxDrift: drift}})
	}
	a := Source(j, "a", newSrc, ws("g", 10), Parallelism(2))
	b := Source(j, "b", newSrc, ws("g", 20))
	c := Source(j, "c", newSrc, ws("h", 10))
	d := Source(j, "d", newSrc)
	Sink(Union(a, b, c, d), "sink", func() SinkFunc[int64] { return nil })
	require.NoError(t, j.Validate())

	first := j.alignmentMembers()
	require.Len(t, first, 4)
	id := func(op string, i int) checkpoint.TaskID { return checkpoint.TaskID{Operator: op, Subtask: i} }
	require.NotContains(t, first, id("d", 0))
	// a/1 and b/0 have no watermark yet: a/0 ahead of them pauses; c, in
	// another group, alone, does not.
	first[id("a", 0)].Report(100)
	first[id("c", 0)].Report(1000)
	require.True(t, first[id("a", 0)].Paused())
	require.False(t, first[id("c", 0)].Paused())
	first[id("a", 1)].Report(85)
	first[id("b", 0)].Report(80)
	require.True(t, first[id("a", 0)].Paused(), "100 is beyond b's 80 + a's drift 10")
	require.False(t, first[id("a", 1)].Paused())
	require.False(t, first[id("b", 0)].Paused())
	require.Equal(t, int64(90), first[id("a", 0)].MaxAllowed())
	require.Equal(t, int64(100), first[id("b", 0)].MaxAllowed(), "each source keeps its own drift")

	second := j.alignmentMembers()
	require.Len(t, second, 4)
	for k, m := range second {
		require.NotSame(t, first[k], m, "%v", k)
		require.False(t, m.Paused(), "%v", k)
	}
	second[id("a", 1)].Report(5)
	require.True(t, second[id("a", 1)].Paused(), "a fresh group's members have no watermark yet")
	second[id("b", 0)].Report(95)
	second[id("a", 1)].Report(95)
	second[id("a", 0)].Report(100)
	for _, k := range []checkpoint.TaskID{id("a", 0), id("a", 1), id("b", 0)} {
		require.False(t, second[k].Paused(), "%v: a fresh group knows nothing of the first attempt's 80", k)
	}
	require.True(t, first[id("a", 0)].Paused())
}
