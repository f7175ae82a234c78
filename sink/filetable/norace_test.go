//go:build !race

package filetable_test

const raceEnabled = false
