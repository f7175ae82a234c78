//go:build race

package state_test

// raceEnabled: the race detector is on (tests scale down).
const raceEnabled = true
