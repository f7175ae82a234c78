//go:build !race

package bench

// raceEnabled reports whether the race detector is on: it makes jobs slow
// and allocation counts meaningless.
const raceEnabled = false
