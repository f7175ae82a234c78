//go:build !race

package state_test

const raceEnabled = false
