package inject

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFaults(t *testing.T) {
	c := New(Fault{Site: "a", At: 2, Times: 2}, Fault{Site: "b", At: 1, Sticky: true}, Fault{Site: "c", At: 1, AfterFail: true})
	var got []bool
	for range 5 {
		got = append(got, c.Hit("a") != nil)
	}
	require.Equal(t, []bool{false, true, true, false, false}, got)
	require.ErrorIs(t, c.Hit("b"), ErrInjected)
	require.ErrorIs(t, c.Hit("b"), ErrInjected, "sticky until the job fails")
	require.NoError(t, c.Hit("c"), "an after-failure fault waits for a failure")
	c.JobFailed()
	require.NoError(t, c.Hit("b"), "disarmed by the failure")
	err := c.Hit("c")
	require.True(t, errors.Is(err, ErrInjected))
	require.Equal(t, []string{"a#2", "a#3", "b#1", "b#2", "c#1"}, c.Fired())
	require.Equal(t, 5, c.Count("a"))
	require.Equal(t, "b@1+", Fault{Site: "b", At: 1, Sticky: true}.String())
}
