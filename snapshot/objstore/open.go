package objstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"

	"gocloud.dev/blob"
	// The drivers Open serves: s3://, file:// and mem://.
	_ "gocloud.dev/blob/fileblob"
	"gocloud.dev/blob/memblob"
	_ "gocloud.dev/blob/s3blob"
)

// Open opens the Store at location: a directory path (no scheme) is a
// Dir on the local filesystem, the default and the only local form that
// syncs (OS8); a URL (s3://bucket?region=..., file:///path, mem://) is
// a Bucket opened by blob.OpenBucket, with the URL's parameters
// (s3blob: region, endpoint, use_path_style, disable_https, anonymous;
// credentials from the environment, never from the URL). A URL's
// prefix parameter roots the store below a key prefix, as blob's
// PrefixedBucket. mem:// is one fresh, empty bucket per Open;
// mem://<name> (no parameters) is the in-memory bucket of that name in
// this process, the same for every Open, never freed: a job restarted
// in the process, or one restoring another's checkpoints, finds them
// there (tests, demos).
func Open(ctx context.Context, location string) (Store, error) {
	if !IsURL(location) {
		return NewDir(nil, location)
	}
	u, err := ParseURL(location)
	if err != nil {
		return nil, err
	}
	name := redact(location, u)
	if u.Scheme == memblob.Scheme && u.Host != "" {
		if u.RawQuery != "" || (u.Path != "" && u.Path != "/") {
			return nil, fmt.Errorf("objstore: open %s: a named in-memory bucket takes no path or parameters", name)
		}
		return &Bucket{b: namedMemBucket(u.Host), name: name}, nil
	}
	b, err := blob.OpenBucket(ctx, location)
	if err != nil {
		// The driver's message may repeat the URL: without its user info.
		msg := strings.ReplaceAll(err.Error(), location, name)
		return nil, fmt.Errorf("objstore: open %s: %w", name, &redactedError{msg: msg, err: err})
	}
	return &Bucket{b: b, name: name, own: true}, nil
}

// IsURL reports whether location names an object store (a URL with a
// scheme) rather than a local directory (a path).
func IsURL(location string) bool { return strings.Contains(location, "://") }

// ParseURL parses the URL of an object store, failing with an error
// that names it (without credentials) unless it has a scheme Open
// serves (s3, file, mem) and, but for mem, a bucket or path.
func ParseURL(location string) (*url.URL, error) {
	u, err := url.Parse(location)
	if err != nil {
		// url.Error repeats the URL, credentials and all: only its cause.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("objstore: checkpoint location is not a valid URL: %w", err)
	}
	name := redact(location, u)
	switch u.Scheme {
	case "s3":
		if u.Host == "" {
			return nil, fmt.Errorf("objstore: checkpoint location %s names no bucket (s3://bucket?region=...)", name)
		}
	case "file":
		if u.Path == "" {
			return nil, fmt.Errorf("objstore: checkpoint location %s names no directory (file:///path)", name)
		}
	case memblob.Scheme:
	default:
		return nil, fmt.Errorf("objstore: checkpoint location %s: scheme %q is not one of s3, file, mem", name, u.Scheme)
	}
	return u, nil
}

var memBuckets struct {
	sync.Mutex
	m map[string]*blob.Bucket
}

// namedMemBucket returns the in-memory bucket name of this process.
func namedMemBucket(name string) *blob.Bucket {
	memBuckets.Lock()
	defer memBuckets.Unlock()
	if memBuckets.m == nil {
		memBuckets.m = make(map[string]*blob.Bucket)
	}
	b := memBuckets.m[name]
	if b == nil {
		b = memblob.OpenBucket(nil)
		memBuckets.m[name] = b
	}
	return b
}

// Redact returns location without the user information a URL may hold.
func Redact(location string) string {
	u, err := url.Parse(location)
	if err != nil {
		return "(unparsable location)"
	}
	return redact(location, u)
}

// redactedError is a driver's error whose message had credentials
// removed; it still unwraps to the driver's error.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
