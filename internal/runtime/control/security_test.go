package control

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"strings"
	"testing"

	"github.com/snapflow/snapflow/internal/rpcutil/rpctest"
	"github.com/snapflow/snapflow/internal/runtime/cluster"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// runRefused runs a worker that must be refused and returns its error.
func runRefused(t *testing.T, cfg WorkerConfig) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	err := RunWorker(ctx, cfg)
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("worker %s: %v, want refused", cfg.ID, err)
	}
	return err
}

// TestDifferentJobRefused: a worker whose job differs is refused with the
// difference named (CP2), and is not registered.
func TestDifferentJobRefused(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), nil)
	other := pipeline(4)
	other.Operators[2].Parallelism = 3
	err := runRefused(t, r.workerConfig("w9", 2, other))
	want := `control: worker w9 refused: cluster: job "pipeline" differs from the one at worker w9: operator uid "sum": parallelism 4 here, 3 at worker w9`
	if !strings.Contains(err.Error(), want) {
		t.Errorf("refused with %v, want %s", err, want)
	}
	renamed := pipeline(4)
	renamed.Edges[1].Records = "string"
	if err := runRefused(t, r.workerConfig("w8", 2, renamed)); !strings.Contains(err.Error(), `"parse"->"sum"`) {
		t.Errorf("a different edge refused with %v", err)
	}
	if n := r.count(func(a cluster.Action) bool { _, ok := a.(cluster.Registered); return ok }); n != 0 {
		t.Errorf("%d workers registered", n)
	}
}

// TestSecretRefused: a worker with a wrong or missing secret is refused,
// naming which without showing a secret; the right one registers (CP6).
func TestSecretRefused(t *testing.T) {
	noLeaks(t)
	r := newRig(t, pipeline(4), func(c *CoordinatorConfig) { c.Secret = []byte("opensesame") })
	cfg := r.workerConfig("w1", 2, pipeline(4))
	cfg.Secret = []byte("letmein")
	err := runRefused(t, cfg)
	if msg := err.Error(); !strings.Contains(msg, "control: wrong shared secret") || strings.Contains(msg, "opensesame") || strings.Contains(msg, "letmein") {
		t.Errorf("a wrong secret refused with %q", msg)
	}
	cfg.Secret = nil
	if err := runRefused(t, cfg); !strings.Contains(err.Error(), "control: missing shared secret") {
		t.Errorf("no secret refused with %v", err)
	}
	cfg.Secret = []byte("opensesame")
	r.start(cfg)
	r.action(0, "w1 registered with the secret", isRegistered("w1"))
}

// TestMutualTLS: with mutual TLS, a worker with a certificate of the CA
// registers; one without a certificate never does: its sessions fail in
// the handshake (CP6).
func TestMutualTLS(t *testing.T) {
	noLeaks(t)
	ca := rpctest.NewCA(t)
	r := newRig(t, pipeline(4), func(c *CoordinatorConfig) {
		c.Options = []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
			Certificates: []tls.Certificate{ca.Issue(t, 2, x509.ExtKeyUsageServerAuth)},
			ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
		}))}
	})
	withTLS := func(id string, certs []tls.Certificate) WorkerConfig {
		cfg := r.workerConfig(id, 2, pipeline(4))
		cfg.Options = []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
			Certificates: certs, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13,
		}))}
		return cfg
	}
	stranger := r.start(withTLS("stranger", nil))
	r.start(withTLS("w1", []tls.Certificate{ca.Issue(t, 3, x509.ExtKeyUsageClientAuth)}))
	r.action(0, "w1 registered over mutual TLS", isRegistered("w1"))
	waitFor(t, "the stranger's session to fail", func() bool { return stranger.logs.has("control: worker stranger: session ended") })
	if n := r.count(isRegistered("stranger")); n != 0 {
		t.Errorf("the stranger registered %d times", n)
	}
}
