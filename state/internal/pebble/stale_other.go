//go:build !unix

package pebble

// removeStaleWorkDirs is a no-op where processes cannot be probed (S14).
func removeStaleWorkDirs(string) {}
