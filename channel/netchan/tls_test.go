package netchan

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// testCA issues certificates for the mutual TLS test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "netchan test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, serial int64, usage x509.ExtKeyUsage) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "worker"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestLoopbackMutualTLS runs a channel over mutual TLS (the server's
// grpc.ServerOptions carry the credentials) with a shared secret, and
// refuses a client without a certificate (N7).
func TestLoopbackMutualTLS(t *testing.T) {
	ca := newTestCA(t)
	srv, addr := serve(t, ServerConfig{Secret: []byte("s"), Options: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.issue(t, 2, x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13,
	}))}}, nil)
	dialTLS := func(certs []tls.Certificate) *Conn {
		return dial(t, addr, DialConfig{Secret: []byte("s"), Options: []grpc.DialOption{
			grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{Certificates: certs, RootCAs: ca.pool, MinVersion: tls.VersionTLS13})),
		}})
	}
	ctx := context.Background()

	r := listenReceiver(t, srv, chanID(0), 1)
	s := dialSender(t, ctx, dialTLS([]tls.Certificate{ca.issue(t, 3, x509.ExtKeyUsageClientAuth)}), chanID(0), 1)
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
