package objstore

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"gocloud.dev/blob"
	// The drivers Open serves: s3://, file:// and mem://.
	_ "gocloud.dev/blob/fileblob"
	_ "gocloud.dev/blob/memblob"
	_ "gocloud.dev/blob/s3blob"
)

// Open opens the Store at location: a directory path (no scheme) is a
// Dir on the local filesystem, the default and the only local form that
// syncs (OS8); a URL (s3://bucket?region=..., file:///path, mem://) is
// a Bucket opened by blob.OpenBucket, with the URL's parameters
// (s3blob: region, endpoint, use_path_style, disable_https, anonymous;
// credentials from the environment, never from the URL). A URL's
// prefix parameter roots the store below a key prefix, as blob's
// PrefixedBucket. mem:// is one fresh, empty bucket per Open.
func Open(ctx context.Context, location string) (Store, error) {
	if !strings.Contains(location, "://") {
		return NewDir(nil, location)
	}
	u, err := url.Parse(location)
	if err != nil {
		return nil, fmt.Errorf("objstore: open %q: %w", location, err)
	}
	name := redact(location, u)
	b, err := blob.OpenBucket(ctx, location)
	if err != nil {
		// The driver's message may repeat the URL: without its user info.
		msg := strings.ReplaceAll(err.Error(), location, name)
		return nil, fmt.Errorf("objstore: open %s: %w", name, &redactedError{msg: msg, err: err})
	}
	return &Bucket{b: b, name: name, own: true}, nil
}

// redactedError is a driver's error whose message had credentials
// removed; it still unwraps to the driver's error.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
