//go:build race

package state

// raceEnabled: sync.Pool drops items at random under the race detector,
// so Pebble allocates on paths that otherwise reuse pooled objects.
const raceEnabled = true
