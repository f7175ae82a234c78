// Package s3test serves S3 in process for tests: gofakes3 on loopback,
// the in-process fake of S3 that the checkpoint-storage tests run
// against (snapshot/objstore's suite, snapshot's storage tests, graph's
// jobs on object storage).
package s3test

import (
	"net/http/httptest"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
)

// URL starts gofakes3 on loopback with an empty bucket of that name,
// stopped when t ends, and returns the bucket's gocloud.dev s3blob URL
// (path-style, anonymous). Add "&prefix=..." to keep objects below a key
// prefix.
func URL(t testing.TB, bucket string) string {
	t.Helper()
	be := s3mem.New()
	if err := be.CreateBucket(bucket); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(be, gofakes3.WithLogger(gofakes3.DiscardLog())).Server())
	t.Cleanup(srv.Close)
	return "s3://" + bucket + "?endpoint=" + srv.URL + "&region=us-east-1&use_path_style=true&anonymous=true"
}
