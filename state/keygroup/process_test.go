package keygroup

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// envKeyGroupChild makes TestMain print the key groups of fixedKeys instead
// of running the tests.
const envKeyGroupChild = "SNAPFLOW_KEYGROUP_CHILD"

var update = flag.Bool("keygroup.update", false, "rewrite testdata/fixed-keys.golden")

func TestMain(m *testing.M) {
	if os.Getenv(envKeyGroupChild) != "" {
		fmt.Print(keyGroupsOfFixedKeys())
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type compositeKey struct {
	Device string
	Slot   int32
	Scale  float64
	Flags  [2]bool
}

// keyGroupsOfFixedKeys computes, for a fixed set of keys of every kind a
// KeyBy accepts, the hash and the key group at three max parallelisms, one
// line per key.
func keyGroupsOfFixedKeys() string {
	var b strings.Builder
	line := func(name string, h uint32) {
		fmt.Fprintf(&b, "%s %d %d %d %d\n", name, h, ForHash(h, 128), ForHash(h, 1000), ForHash(h, 32768))
	}
	for _, s := range []string{"", "D1", "device-42", "设备-7", strings.Repeat("x", 300)} {
		line(fmt.Sprintf("string:%q", s), Hash(s))
	}
	for _, v := range []int64{0, 1, -1, 12345, 1 << 40, -1 << 63} {
		line(fmt.Sprintf("int64:%d", v), Hash(v))
		line(fmt.Sprintf("int:%d", v), Hash(int(v)))
	}
	for _, v := range []uint32{0, 7, 1 << 31} {
		line(fmt.Sprintf("uint32:%d", v), Hash(v))
	}
	line("bool:true", Hash(true))
	line("float64:0.1", Hash(0.1))
	line("float32:-2.5", Hash(float32(-2.5)))
	line("struct:a", Hash(compositeKey{Device: "a", Slot: 3, Scale: 1.5, Flags: [2]bool{true, false}}))
	line("struct:zero", Hash(compositeKey{}))
	line("array", Hash([3]string{"x", "y", "z"}))
	return b.String()
}

// TestKeyGroupsAgreeAcrossProcesses computes the key groups of a fixed key
// set in a separate process (this test binary re-executed, so a new
// runtime with its own hash seeds and address layout) and compares them
// with this process's: the key group of a key must never depend on the
// process that computes it (the seed's "Key group X is not in
// KeyGroupRange" came from a hash that did).
func TestKeyGroupsAgreeAcrossProcesses(t *testing.T) {
	exe, err := os.Executable()
	require.NoError(t, err)
	for i := range 2 {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), envKeyGroupChild+"=1")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		require.NoError(t, err, "child: %s", stderr.String())
		require.Equal(t, keyGroupsOfFixedKeys(), string(out), "child %d computed other key groups", i)
	}
	// And pinned, so a change of the hash between versions (which would
	// move keys between key groups and break restores of old checkpoints)
	// fails here; -keygroup.update rewrites the file after a deliberate
	// change.
	const golden = "testdata/fixed-keys.golden"
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(keyGroupsOfFixedKeys()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), keyGroupsOfFixedKeys(), "key groups differ from %s", golden)
}
