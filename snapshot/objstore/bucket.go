package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"

	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

// Bucket is a Store over a gocloud.dev/blob bucket (S3, GCS, Azure,
// fileblob, memblob). Create is a conditional write
// (blob.WriterOptions.IfNotExist: S3's If-None-Match: *, GCS's
// DoesNotExist precondition, Azure's If-None-Match; fileblob and memblob
// check under a lock), so an object is never overwritten (OS1); an
// upload is visible whole or not at all, and durable once Commit
// returned (the store's guarantee: fileblob does not sync, OS8).
type Bucket struct {
	b    *blob.Bucket
	name string
	own  bool
}

var _ Store = (*Bucket)(nil)

// NewBucket returns the Store of b, named name in errors (its URL,
// without credentials). Close does not close b.
func NewBucket(b *blob.Bucket, name string) *Bucket {
	return &Bucket{b: b, name: name}
}

func (s *Bucket) String() string { return s.name }

// Close closes the bucket if Open opened it.
func (s *Bucket) Close() error {
	if !s.own {
		return nil
	}
	if err := s.b.Close(); err != nil {
		return &Error{Op: "close", Store: s.name, Err: err}
	}
	return nil
}

// fail wraps err, mapping the driver's not-found and precondition
// codes to ErrNotExist and ErrExist.
func (s *Bucket) fail(op, key string, err error) error {
	switch gcerrors.Code(err) {
	case gcerrors.NotFound:
		err = fmt.Errorf("%w: %w", ErrNotExist, err)
	case gcerrors.FailedPrecondition:
		err = fmt.Errorf("%w: %w", ErrExist, err)
	}
	return &Error{Op: op, Store: s.name, Key: key, Err: err}
}

// Create implements Store.
func (s *Bucket) Create(ctx context.Context, key string) (Writer, error) {
	if err := checkKey(key); err != nil {
		return nil, &Error{Op: "create", Store: s.name, Key: key, Err: err}
	}
	// Cancelling the writer's context is how an upload is abandoned.
	wctx, cancel := context.WithCancel(ctx)
	w, err := s.b.NewWriter(wctx, key, &blob.WriterOptions{
		ContentType: "application/octet-stream",
		IfNotExist:  true,
	})
	if err != nil {
		cancel()
		return nil, s.fail("create", key, err)
	}
	return &bucketWriter{s: s, key: key, w: w, cancel: cancel}, nil
}

type bucketWriter struct {
	s      *Bucket
	key    string
	w      *blob.Writer
	cancel context.CancelFunc
	done   bool
}

func (w *bucketWriter) Write(p []byte) (int, error) {
	if w.done {
		return 0, &Error{Op: "create", Store: w.s.name, Key: w.key, Err: errors.New("write after Commit or Abort")}
	}
	n, err := w.w.Write(p)
	if err != nil {
		return n, w.s.fail("create", w.key, err)
	}
	return n, nil
}

func (w *bucketWriter) Commit() error {
	if w.done {
		return &Error{Op: "create", Store: w.s.name, Key: w.key, Err: errors.New("Commit after Commit or Abort")}
	}
	w.done = true
	defer w.cancel()
	if err := w.w.Close(); err != nil {
		return w.s.fail("create", w.key, err)
	}
	return nil
}

func (w *bucketWriter) Abort() error {
	if w.done {
		return nil
	}
	w.done = true
	w.cancel()
	_ = w.w.Close() // fails with the cancellation: nothing is created
	return nil
}

// Read implements Store.
func (s *Bucket) Read(ctx context.Context, key string, off, n int64) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, &Error{Op: "read", Store: s.name, Key: key, Err: err}
	}
	if n >= 0 {
		// Check the range: drivers clamp a range past the end.
		a, err := s.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		if off < 0 || off+n > a.Size {
			return nil, &Error{Op: "read", Store: s.name, Key: key,
				Err: fmt.Errorf("range [%d, +%d) outside the object's %d bytes", off, n, a.Size)}
		}
		if n == 0 {
			return io.NopCloser(eofReader{}), nil
		}
	}
	r, err := s.b.NewRangeReader(ctx, key, off, n, nil)
	if err != nil {
		return nil, s.fail("read", key, err)
	}
	return &bucketReader{r: r, s: s, key: key}, nil
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }

type bucketReader struct {
	r   *blob.Reader
	s   *Bucket
	key string
}

func (r *bucketReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	if err != nil && err != io.EOF {
		err = r.s.fail("read", r.key, err)
	}
	return n, err
}

func (r *bucketReader) Close() error { return r.r.Close() }

// Stat implements Store.
func (s *Bucket) Stat(ctx context.Context, key string) (Attrs, error) {
	if err := checkKey(key); err != nil {
		return Attrs{}, &Error{Op: "stat", Store: s.name, Key: key, Err: err}
	}
	a, err := s.b.Attributes(ctx, key)
	if err != nil {
		return Attrs{}, s.fail("stat", key, err)
	}
	return Attrs{Key: key, Size: a.Size, ModTime: a.ModTime}, nil
}

// List implements Store.
func (s *Bucket) List(ctx context.Context, prefix string) ([]Attrs, error) {
	var out []Attrs
	it := s.b.List(&blob.ListOptions{Prefix: prefix})
	for {
		o, err := it.Next(ctx)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, s.fail("list", prefix, err)
		}
		if o.IsDir {
			continue
		}
		out = append(out, Attrs{Key: o.Key, Size: o.Size, ModTime: o.ModTime})
	}
}

// Delete implements Store.
func (s *Bucket) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return &Error{Op: "delete", Store: s.name, Key: key, Err: err}
	}
	err := s.b.Delete(ctx, key)
	if err != nil && gcerrors.Code(err) != gcerrors.NotFound {
		return s.fail("delete", key, err)
	}
	return nil
}

// redact returns the URL location without its user info, for errors.
func redact(location string, u *url.URL) string {
	if u.User == nil {
		return location // as given: url.URL.String drops the "//" of mem://
	}
	c := *u
	c.User = nil
	return c.String()
}
