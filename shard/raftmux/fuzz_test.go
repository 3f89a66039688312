package raftmux

import (
	"bytes"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"testing"
)

// FuzzMuxHeader: any peer can connect to a node's Raft port and send anything. route never
// panics; it hands a connection to a layer exactly when the connection starts with the
// header (magic, version) naming that layer's id, and the layer then reads every byte after
// the header, unread by the mux (they are raft's); any other connection is closed.
func FuzzMuxHeader(f *testing.F) {
	header := func(version byte, id uint32) []byte {
		return binary.BigEndian.AppendUint32(append([]byte(muxMagic), version), id)
	}
	f.Add(append(header(muxVersion, 7), "raft's bytes"...))
	f.Add(header(muxVersion, 7))
	f.Add(header(muxVersion, 8)) // no layer
	f.Add(header(2, 7))
	f.Add([]byte("CHR"))
	f.Fuzz(func(t *testing.T, data []byte) {
		m := &Mux{logger: slog.New(slog.DiscardHandler), layers: map[uint32]*streamLayer{}, done: make(chan struct{})}
		layer, err := m.Layer(7)
		if err != nil {
			t.Fatal(err)
		}
		defer layer.Close()
		peer, c := net.Pipe()
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			// route closes a connection it refuses with data unread, which
			// fails this Write: what is checked is what route did.
			_, _ = peer.Write(data)
			_ = peer.Close()
		}()
		m.route(c)
		want := len(data) >= muxHeaderLen && bytes.Equal(data[:muxHeaderLen], header(muxVersion, 7))
		select {
		case got := <-layer.(*streamLayer).conns:
			if !want {
				t.Fatalf("%q is routed to layer 7", data)
			}
			rest, err := io.ReadAll(got)
			_ = got.Close()
			if err != nil || !bytes.Equal(rest, data[muxHeaderLen:]) {
				t.Fatalf("%q routed; the layer reads %q, %v", data, rest, err)
			}
		default:
			if want {
				t.Fatalf("%q is not routed to layer 7", data)
			}
			if _, err := c.Read(make([]byte, 1)); err == nil {
				t.Fatalf("%q is neither routed nor closed", data)
			}
		}
		<-sent
	})
}
