package netchan

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{Secret: []byte("s"), Options: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, 2, x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}))}})
	go srv.Serve(l)
	defer srv.Stop()
	dial := func(certs []tls.Certificate) *Conn {
		conn, err := Dial(l.Addr().String(), DialConfig{Secret: []byte("s"), Options: []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: certs, RootCAs: ca.Pool, MinVersion: tls.VersionTLS13})),
		}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	ctx := context.Background()

	r, err := ListenReceiver[int](srv, chanID(0), 1, Config{}, MsgpackCodec[int]{})
	if err != nil {
		t.Fatal(err)
	}
	s, err := DialSender[int](ctx, dial([]tls.Certificate{ca.Issue(t, 3, x509.ExtKeyUsageClientAuth)}), chanID(0), 1, Config{}, MsgpackCodec[int]{})
	if err != nil {
		t.Fatal(err)
	}
	send(t, s, 5)
	it, err := r.Poll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := item(r, it); got != "[5]" {
		t.Errorf("over mutual TLS: %s", got)
	}

	if _, err := ListenReceiver[int](srv, chanID(1), 1, Config{}, MsgpackCodec[int]{}); err != nil {
		t.Fatal(err)
	}
	// Opening the stream may fail at once or once the handshake fails.
	if stranger, err := DialSender[int](ctx, dial(nil), chanID(1), 1, Config{}, MsgpackCodec[int]{}); err == nil {
		waitFor(t, "the stranger to be refused", func() bool { return stranger.Err() != nil })
	}
}
