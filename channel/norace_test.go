//go:build !race

package channel

// raceEnabled reports whether the race detector is on: sync.Pool then
// drops items at random, so reuse cannot be counted.
const raceEnabled = false
