package netchan

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/snapflow/snapflow/internal/rpcutil/rpctest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestLoopbackMutualTLS runs a channel over mutual TLS (the server's
// grpc.ServerOptions carry the credentials) with a shared secret, and
// refuses a client without a certificate (N7).
func TestLoopbackMutualTLS(t *testing.T) {
	ca := rpctest.NewCA(t)
	srv, addr := serve(t, ServerConfig{Secret: []byte("s"), Options: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, 2, x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}))}}, nil)
	dialTLS := func(certs []tls.Certificate) *Conn {
		return dial(t, addr, DialConfig{Secret: []byte("s"), Options: []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: certs, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})),
		}})
	}
	ctx := context.Background()

	r := listenReceiver(t, srv, chanID(0), 1)
	s := dialSender(t, ctx, dialTLS([]tls.Certificate{ca.Issue(t, 3, x509.ExtKeyUsageClientAuth)}), chanID(0), 1)
	send(t, s, 5)
	it, err := r.Poll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := item(r, it); got != "[5]" {
		t.Errorf("over mutual TLS: %s", got)
	}

	listenReceiver(t, srv, chanID(1), 1)
	// Opening the stream may fail at once or once the handshake fails.
	if stranger, err := DialSender[int](ctx, dialTLS(nil), chanID(1), 1, Config{}, MsgpackCodec[int]{}); err == nil {
		waitFor(t, "the stranger to be refused", func() bool { return stranger.Err() != nil })
	}
}
