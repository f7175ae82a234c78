package channel

// ring is a FIFO deque backed by a power-of-two circular slice. It grows by
// doubling and never shrinks, so a channel that has reached its steady-state
// depth pushes and pops without allocating. It is not safe for concurrent
// use; Chan guards it with its mutex.
type ring[E any] struct {
	buf  []E
	head int // index of the first element
	n    int // number of elements
}

func (r *ring[E]) len() int { return r.n }

// pushBack appends e at the tail.
func (r *ring[E]) pushBack(e E) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = e
	r.n++
}

// popFront removes and returns the head element. It panics if the ring is
// empty.
func (r *ring[E]) popFront() E {
	if r.n == 0 {
		panic("channel: pop of empty ring")
	}
	var zero E
	e := r.buf[r.head]
	r.buf[r.head] = zero // drop references for the GC
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	return e
}

// at returns the i-th element from the head (0 <= i < len).
func (r *ring[E]) at(i int) *E {
	if i < 0 || i >= r.n {
		panic("channel: ring index out of range")
	}
	return &r.buf[(r.head+i)&(len(r.buf)-1)]
}

// removeAt removes the i-th element from the head, moving the ones before
// it back by one (0 <= i < len).
func (r *ring[E]) removeAt(i int) E {
	e := *r.at(i)
	for j := i; j > 0; j-- {
		*r.at(j) = *r.at(j - 1)
	}
	r.popFront()
	return e
}

func (r *ring[E]) grow() {
	size := 2 * len(r.buf)
	if size == 0 {
		size = 8
	}
	buf := make([]E, size)
	for i := 0; i < r.n; i++ {
		buf[i] = r.buf[(r.head+i)&(len(r.buf)-1)]
	}
	r.buf = buf
	r.head = 0
}

// reserve grows the ring so that it can hold n elements without allocating.
func (r *ring[E]) reserve(n int) {
	for len(r.buf) < n {
		r.grow()
	}
}
