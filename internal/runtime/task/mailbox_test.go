package task

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMailbox(t *testing.T) {
	mb := NewMailbox()
	require.False(t, mb.Pending())
	require.Empty(t, mb.Drain(nil))
	select {
	case <-mb.Ready():
		t.Fatal("token without mail")
	default:
	}

	mb.Put(Mail{Kind: MailComplete, ID: 1})
	mb.Put(Mail{Kind: MailAborted, ID: 2})
	require.True(t, mb.Pending())
	select {
	case <-mb.Ready():
	default:
		t.Fatal("Put posted no token")
	}
	dst := make([]Mail, 0, 4)
	got := mb.Drain(dst)
	require.Equal(t, []Mail{{Kind: MailComplete, ID: 1}, {Kind: MailAborted, ID: 2}}, got)
	require.False(t, mb.Pending())
	require.Empty(t, mb.Drain(got[:0]))

	// Drain appends.
	mb.Put(Mail{Kind: MailFinish})
	got = mb.Drain([]Mail{{Kind: MailComplete, ID: 9}})
	require.Equal(t, []Mail{{Kind: MailComplete, ID: 9}, {Kind: MailFinish}}, got)
}

// TestMailboxConcurrentProducers: Put never blocks and every producer's
// mail is drained once, in that producer's order.
func TestMailboxConcurrentProducers(t *testing.T) {
	const producers, each = 4, 500
	mb := NewMailbox()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				mb.Put(Mail{Kind: MailComplete, ID: int64(p*each + i)})
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	next := make([]int64, producers)
	for p := range next {
		next[p] = int64(p * each)
	}
	var buf []Mail
	received := 0
	for received < producers*each {
		select {
		case <-mb.Ready():
		case <-done:
		}
		buf = mb.Drain(buf[:0])
		for _, m := range buf {
			p := m.ID / each
			require.Equal(t, next[p], m.ID, "producer %d out of order", p)
			next[p]++
			received++
		}
	}
	<-done
	require.False(t, mb.Pending())
	require.Empty(t, mb.Drain(nil))
}

// TestMailboxInterrupt: the interrupt is raised while mail is queued, while
// a flush is due and for good after Stop; each condition is lowered only
// by its own clearing.
func TestMailboxInterrupt(t *testing.T) {
	mb := NewMailbox()
	in := mb.Interrupt()
	require.False(t, in.Raised())
	mb.Put(Mail{Kind: MailComplete, ID: 1})
	require.True(t, in.Raised())
	mb.due()
	mb.Drain(nil)
	require.True(t, in.Raised(), "a due flush outlives the drain")
	require.False(t, mb.Pending())
	require.True(t, mb.flushDue())
	mb.flushed()
	require.False(t, in.Raised())
	mb.Stop()
	select {
	case <-mb.Ready():
	default:
		t.Fatal("Stop posted no token")
	}
	mb.Put(Mail{Kind: MailComplete, ID: 2})
	mb.Drain(nil)
	mb.flushed()
	require.True(t, in.Raised(), "Stop is for good")
	require.False(t, mb.Pending())
}
