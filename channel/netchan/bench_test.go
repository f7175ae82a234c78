package netchan

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/snapflow/snapflow/channel"
	"github.com/snapflow/snapflow/marker"
)

// fixedCodec encodes int records as 8 bytes each, standing in for the
// runtime's flat encoders, so that the benchmark weighs the transport
// rather than msgpack.
type fixedCodec struct{}

func (fixedCodec) AppendRecords(dst []byte, recs []int) ([]byte, error) {
	for _, r := range recs {
		dst = binary.LittleEndian.AppendUint64(dst, uint64(r))
	}
	return dst, nil
}

func (fixedCodec) DecodeRecords(src []byte, dst []int) ([]int, error) {
	if len(src)%8 != 0 {
		return dst, errors.New("fixedCodec: odd length")
	}
	dst = dst[:0]
	for ; len(src) > 0; src = src[8:] {
		dst = append(dst, int(binary.LittleEndian.Uint64(src)))
	}
	return dst, nil
}

// BenchmarkThroughput moves b.N buffers of 256 records from a writer to a
// reader goroutine: through a local channel.Chan, and through a network
// channel on loopback with the fixed-width codec and with msgpack. Run it
// on an idle machine; the ratio of loopback to local is the figure of
// interest.
func BenchmarkThroughput(b *testing.B) {
	const records = channel.DefaultBufferSize
	b.Run("local", func(b *testing.B) {
		c := channel.New[int](channel.Config{})
		g := channel.NewGate([]*channel.Chan[int]{c})
		done := make(chan int)
		go func() {
			n := 0
			for {
				_, it, ok := g.Poll()
				if !ok {
					<-g.Ready()
					continue
				}
				if it.IsEvent() {
					done <- n
					return
				}
				n += len(it.Buf.Records)
				g.Recycle(0, it.Buf)
			}
		}()
		benchWrite(b, c, records)
		if n := <-done; n != b.N*records {
			b.Fatalf("read %d records, want %d", n, b.N*records)
		}
		reportRecords(b, records)
	})
	for _, codec := range []struct {
		name  string
		codec Codec[int]
	}{{"loopback-fixed", fixedCodec{}}, {"loopback-msgpack", MsgpackCodec[int]{}}} {
		b.Run(codec.name, func(b *testing.B) {
			lb := newLoopback(b, "", "")
			ctx := context.Background()
			r, err := ListenReceiver(lb.srv, chanID(0), 1, Config{}, codec.codec)
			if err != nil {
				b.Fatal(err)
			}
			s, err := DialSender(ctx, lb.conn, chanID(0), 1, Config{}, codec.codec)
			if err != nil {
				b.Fatal(err)
			}
			done := make(chan int)
			go func() {
				n := 0
				for {
					it, err := r.Poll(ctx)
					if err != nil {
						b.Error(err)
						done <- n
						return
					}
					if it.IsEvent() {
						done <- n
						return
					}
					n += len(it.Buf.Records)
					r.Recycle(it.Buf)
				}
			}()
			benchWrite(b, s, records)
			if n := <-done; n != b.N*records {
				b.Fatalf("read %d records, want %d", n, b.N*records)
			}
			reportRecords(b, records)
		})
	}
}

func benchWrite(b *testing.B, s channel.Sender[int], records int) {
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		buf := s.NewBuffer()
		for j := range records {
			buf.Records = append(buf.Records, i*records+j)
		}
		if err := s.Send(context.Background(), buf); err != nil {
			b.Fatal(err)
		}
	}
	if err := s.SendEvent(marker.EndOfInput); err != nil {
		b.Fatal(err)
	}
}

// reportRecords reports the records per second once the reader is done.
func reportRecords(b *testing.B, records int) {
	b.ReportMetric(float64(b.N*records)/b.Elapsed().Seconds(), "records/s")
}
