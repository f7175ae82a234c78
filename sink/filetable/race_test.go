//go:build race

package filetable_test

// raceEnabled: the race detector allocates on its own, so allocation tests
// skip.
const raceEnabled = true
