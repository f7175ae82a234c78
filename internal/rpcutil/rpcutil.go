// Package rpcutil holds what the gRPC services of snapflow share (the data
// plane, channel/netchan, and the control plane,
// internal/runtime/control): the shared secret every stream presents in
// its metadata, checked in constant time before anything of the stream is
// read.
package rpcutil

import (
	"context"
	"crypto/subtle"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// SecretKey is the metadata key of the shared secret.
const SecretKey = "snapflow-secret"

// WithSecret returns ctx carrying secret in its outgoing metadata (ctx
// itself when secret is empty).
func WithSecret(ctx context.Context, secret []byte) context.Context {
	if len(secret) == 0 {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, SecretKey, string(secret))
}

// CheckSecret checks the secret a stream's incoming metadata carries
// against secret (nothing to check when it is empty), in constant time. A
// missing or wrong one is an Unauthenticated status naming which, prefixed
// with service, never showing either secret.
func CheckSecret(ctx context.Context, secret []byte, service string) error {
	if len(secret) == 0 {
		return nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	got := md.Get(SecretKey)
	switch {
	case len(got) == 0:
		return status.Errorf(codes.Unauthenticated, "%s: missing shared secret (metadata %q)", service, SecretKey)
	case len(got) > 1:
		return status.Errorf(codes.Unauthenticated, "%s: %d shared secrets presented, want one", service, len(got))
	case subtle.ConstantTimeCompare([]byte(got[0]), secret) != 1:
		return status.Errorf(codes.Unauthenticated, "%s: wrong shared secret", service)
	}
	return nil
}
