//go:build race

package window_test

// raceEnabled reports whether the race detector is on: the randomized
// tests then run on a quarter of the records, to stay within the test
// timeout on a loaded machine.
const raceEnabled = true
