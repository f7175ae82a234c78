package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strings"
	"time"
)

// Store is what checkpoint code needs of the place checkpoints live: a
// flat namespace of immutable objects named by keys ("a/b/c"), created
// once and never overwritten (OS1). Dir implements it over a local
// directory, Bucket over a gocloud.dev/blob bucket. Its methods are safe
// for concurrent use.
type Store interface {
	// Create starts writing the object key. The object becomes visible,
	// whole, when the Writer's Commit returns nil, and only if no object
	// named key exists then: otherwise Commit fails with an error
	// wrapping ErrExist and the existing object stays as it was. A Commit
	// that fails otherwise leaves the object absent or whole (its
	// outcome may be unknown: a caller that must know reads it back,
	// as Put does).
	Create(ctx context.Context, key string) (Writer, error)
	// Read reads n bytes of the object key from byte offset off, or
	// the rest of it if n < 0. A missing object fails with an error
	// wrapping ErrNotExist.
	Read(ctx context.Context, key string, off, n int64) (io.ReadCloser, error)
	// Stat returns the attributes of the object key, or an error
	// wrapping ErrNotExist.
	Stat(ctx context.Context, key string) (Attrs, error)
	// List returns the objects whose keys begin with prefix, by key.
	List(ctx context.Context, prefix string) ([]Attrs, error)
	// Delete removes the object key; a missing object is not an error.
	// Once Delete returned nil, the removal is durable.
	Delete(ctx context.Context, key string) error
	// Close releases the store (a bucket it opened).
	Close() error
	// String names the store in errors: the directory or the bucket URL
	// (without credentials).
	String() string
}

// Writer writes one object. Exactly one of Commit and Abort ends it.
type Writer interface {
	io.Writer
	// Commit makes the object visible and durable (see Store.Create).
	Commit() error
	// Abort discards what was written; the object is not created.
	Abort() error
}

// Attrs are an object's attributes.
type Attrs struct {
	Key  string
	Size int64
	// ModTime is when the object was created (the store's clock).
	ModTime time.Time
}

var (
	// ErrExist is wrapped by the failure of a create whose key exists.
	ErrExist = fs.ErrExist
	// ErrNotExist is wrapped by the failure to read or stat a missing
	// object.
	ErrNotExist = fs.ErrNotExist
)

// Error is the error of a Store operation: it names the store, the
// operation and the key.
type Error struct {
	Op    string // create, read, stat, list, delete
	Store string // Store.String
	Key   string // the key, or the prefix of a list
	Err   error
}

func (e *Error) Error() string {
	return fmt.Sprintf("objstore: %s %s in %s: %v", e.Op, e.Key, e.Store, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// checkKey reports whether key is a valid object key: non-empty
// elements separated by "/", none of them "." or "..", none beginning
// with "." (reserved for temporary files in a Dir) or holding a NUL or
// a backslash. Keys mean the same in every Store.
func checkKey(key string) error {
	if key == "" {
		return errors.New("empty key")
	}
	for _, el := range strings.Split(key, "/") {
		switch {
		case el == "":
			return fmt.Errorf("key %q has an empty element", key)
		case el[0] == '.':
			return fmt.Errorf("key %q has an element beginning with '.'", key)
		case strings.ContainsAny(el, "\x00\\"):
			return fmt.Errorf("key %q holds a NUL or a backslash", key)
		}
	}
	return nil
}

// ReadAll reads the whole object key.
func ReadAll(ctx context.Context, s Store, key string) ([]byte, error) {
	r, err := s.Read(ctx, key, 0, -1)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(r)
	if cerr := r.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, &Error{Op: "read", Store: s.String(), Key: key, Err: err}
	}
	return b, nil
}

// ErrConflict is wrapped by Put when the key holds other bytes than
// those it was to write: another writer created the object first (OS5).
var ErrConflict = errors.New("objstore: the object exists with other contents")

// ErrUnknownOutcome is wrapped by Put when the create failed and reading
// the object back found nothing: the object may still appear (a request
// that outlived its response), or never (OS1).
var ErrUnknownOutcome = errors.New("objstore: the create failed and may or may not take effect")

// Put creates the object key holding b, write-once (OS1). It returns nil
// once the object holds b: created by this call, or found holding b
// after the create failed (a retried request whose first attempt took
// effect, a lost response, ErrExist from an earlier Put of the same
// bytes). It fails with ErrConflict if the object holds other bytes,
// and with ErrUnknownOutcome if the create failed and the object is not
// there when read back.
func Put(ctx context.Context, s Store, key string, b []byte) error {
	cerr := create(ctx, s, key, b)
	if cerr == nil {
		return nil
	}
	got, rerr := ReadAll(ctx, s, key)
	switch {
	case rerr == nil && string(got) == string(b):
		return nil
	case rerr == nil:
		return fmt.Errorf("%w: %w (%d bytes there, %d to write)", ErrConflict, cerr, len(got), len(b))
	case errors.Is(cerr, ErrExist):
		// It existed and cannot be read: report the create's error.
		return fmt.Errorf("%w; reading it back: %w", cerr, rerr)
	case errors.Is(rerr, ErrNotExist):
		return fmt.Errorf("%w: %w", ErrUnknownOutcome, cerr)
	default:
		return fmt.Errorf("%w: %w; reading it back: %w", ErrUnknownOutcome, cerr, rerr)
	}
}

func create(ctx context.Context, s Store, key string, b []byte) error {
	w, err := s.Create(ctx, key)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		_ = w.Abort()
		return &Error{Op: "create", Store: s.String(), Key: key, Err: err}
	}
	return w.Commit()
}
