//go:build !unix

package state

// removeStaleWorkDirs is a no-op where processes cannot be probed (S14).
func removeStaleWorkDirs(string) {}
