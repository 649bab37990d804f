package sync

import (
	"bytes"
	"io"
	"net"
	gosync "sync"
	"testing"
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// FuzzServerHandshake feeds arbitrary dialer bytes to the real server side
// of the handshake: it must never panic and must always end (refusing, or
// holding a well-formed hello for a future round until HoldTimeout).
func FuzzServerHandshake(f *testing.F) {
	cfg := DefaultConfig()
	cfg.JobID = "fuzz-job"
	cfg.Secret = []byte("fuzz secret of at least 16 bytes")
	cfg.HoldTimeout = time.Millisecond
	msg := func(typ uint8, payload []byte) []byte {
		var b bytes.Buffer
		wire.WriteMsg(&b, nil, typ, payload)
		return b.Bytes()
	}
	hello := wire.AppendHello(nil, &wire.Hello{Version: wire.ProtocolVersion, ConnKind: wire.ConnLane, Round: 3, From: 1, To: 0, JobID: cfg.JobID})
	f.Add(msg(wire.MsgHello, hello))
	f.Add(append(msg(wire.MsgHello, hello), msg(wire.MsgProof, make([]byte, wire.ProofSize))...))
	f.Add(append(msg(wire.MsgHello, hello), msg(wire.MsgProof, make([]byte, wire.ProofSize+wire.LayoutSize))...))
	f.Add(append(msg(wire.MsgHello, hello), msg(wire.MsgReject, wire.AppendReject(nil, wire.RejectAuth, "no"))...))
	f.Add([]byte{wire.MsgHello, 0xff, 0xff})
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, in []byte) {
		tr := &Transport{cfg: cfg, log: cfg.logger(), closed: make(chan struct{}),
			held: make(map[connKey]*heldConn), adm: newAdmission(), rings: make(map[*Ring]struct{}), now: time.Now}
		srv, cli := net.Pipe()
		var wg gosync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); cli.Write(in); cli.Close() }()
		go func() { defer wg.Done(); io.Copy(io.Discard, cli) }()
		srv.SetDeadline(time.Now().Add(2 * time.Second))
		tr.serverHandshake(srv, tr.admit(srv), "fuzz")
		srv.Close()
		wg.Wait()
	})
}
