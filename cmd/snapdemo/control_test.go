package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeExec counts the savepoints and stops it is asked for.
type fakeExec struct{ savepoints, stops atomic.Int64 }

func (f *fakeExec) ID() string { return "exec-1" }
func (f *fakeExec) TriggerSavepoint(context.Context) (string, error) {
	f.savepoints.Add(1)
	return "savepoint-1", nil
}
func (f *fakeExec) Stop(context.Context) (string, error) {
	f.stops.Add(1)
	return "savepoint-2", nil
}

// TestControlAuth: the control file is readable by its owner only and
// holds a 32-byte token; a request without it or with another is refused
// (401), a cross-site one (Origin, Sec-Fetch-Site, another Host) too (403)
// even with the token, a POST that is not JSON (a form) too (415); none of
// them takes a savepoint. The client (snapdemo savepoint's call) passes.
func TestControlAuth(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "job")
	fe := &fakeExec{}
	c, err := startControl(dir, fe, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	defer c.close()

	fi, err := os.Stat(c.file)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the control file is its owner's only")
	raw, err := os.ReadFile(c.file)
	require.NoError(t, err)
	var info controlInfo
	require.NoError(t, json.Unmarshal(raw, &info))
	require.Len(t, info.Token, 64, "32 random bytes, hex")

	send := func(method, path string, hdr map[string]string) int {
		t.Helper()
		var body io.Reader
		if method == http.MethodPost {
			body = strings.NewReader("{}")
		}
		req, err := http.NewRequest(method, "http://"+info.Addr+path, body)
		require.NoError(t, err)
		for k, v := range hdr {
			if k == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	auth := "Bearer " + info.Token
	for _, path := range []string{"/savepoint", "/stop"} {
		for _, tc := range []struct {
			name string
			hdr  map[string]string
			want int
		}{
			{"no token", map[string]string{"Content-Type": "application/json"}, http.StatusUnauthorized},
			{"wrong token", map[string]string{"Content-Type": "application/json", "Authorization": "Bearer " + strings.Repeat("0", 64)}, http.StatusUnauthorized},
			{"token without scheme", map[string]string{"Content-Type": "application/json", "Authorization": info.Token}, http.StatusUnauthorized},
			{"cross-site origin", map[string]string{"Content-Type": "application/json", "Authorization": auth, "Origin": "https://evil.example"}, http.StatusForbidden},
			{"cross-site fetch", map[string]string{"Content-Type": "application/json", "Authorization": auth, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
			{"rebound host", map[string]string{"Content-Type": "application/json", "Authorization": auth, "Host": "evil.example"}, http.StatusForbidden},
			{"form post", map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Authorization": auth}, http.StatusUnsupportedMediaType},
			{"text post", map[string]string{"Content-Type": "text/plain", "Authorization": auth}, http.StatusUnsupportedMediaType},
		} {
			require.Equal(t, tc.want, send(http.MethodPost, path, tc.hdr), "%s %s", path, tc.name)
		}
	}
	require.Equal(t, http.StatusUnauthorized, send(http.MethodGet, "/status", nil))
	require.Zero(t, fe.savepoints.Load()+fe.stops.Load(), "no refused request acts")

	require.Equal(t, http.StatusOK, send(http.MethodPost, "/savepoint", map[string]string{"Content-Type": "application/json", "Authorization": auth, "Sec-Fetch-Site": "none"}))
	ctx := context.Background()
	got, err := readControl(ctx, c.file)
	require.NoError(t, err)
	rep, err := call(ctx, http.MethodPost, got, "/stop", 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, savepointReply{Path: "savepoint-2", Stopped: true, Execution: "exec-1"}, rep)
	require.EqualValues(t, 1, fe.savepoints.Load())
	require.EqualValues(t, 1, fe.stops.Load())
}
