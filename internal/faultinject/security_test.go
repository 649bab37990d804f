package faultinject_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/elastictrain/elastictrain/internal/faultinject"
	"github.com/elastictrain/elastictrain/internal/testredis"
)

// The peer handshake as a stranger speaks it (package sync, wire format
// v1): messages are a type byte, a little-endian uint16 length and the
// payload.
const (
	msgHello, msgChallenge, msgProof, msgAccept, msgReject = 1, 2, 3, 4, 5
	rejectMalformed, rejectJob, rejectRound, rejectAuth    = 1, 2, 3, 4
)

func handshakeMsg(typ byte, payload []byte) []byte {
	b := []byte{typ, 0, 0}
	binary.LittleEndian.PutUint16(b[1:], uint16(len(payload)))
	return append(b, payload...)
}

// hello is a sync Hello of protocol version ver (the workers' own: taken
// from a genuine handshake, as sync/internal/wire is not importable here)
// on a control connection, lane 0.
func hello(ver byte, job string, round uint64, from, to uint32) []byte {
	b := []byte{ver, 1, 0, 0}
	b = binary.LittleEndian.AppendUint64(b, round)
	b = binary.LittleEndian.AppendUint32(b, from)
	b = binary.LittleEndian.AppendUint32(b, to)
	var nonce [32]byte
	rand.Read(nonce[:])
	b = append(b, nonce[:]...)
	b = append(b, byte(len(job)))
	return append(b, job...)
}

func readMsg(t *testing.T, c net.Conn) (byte, []byte, error) {
	t.Helper()
	var h [3]byte
	if _, err := io.ReadFull(c, h[:]); err != nil {
		return 0, nil, err
	}
	p := make([]byte, binary.LittleEndian.Uint16(h[1:]))
	_, err := io.ReadFull(c, p)
	return h[0], p, err
}

// stranger connects to addr, sends first, and, when the server answers with
// a challenge, proves a secret (nil: 32 zero bytes) over it; it returns the
// server's final reject code (0 if it accepted or just closed).
func stranger(t *testing.T, addr string, first []byte, secret []byte) byte {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Write(first)
	require.NoError(t, err)
	for {
		typ, p, err := readMsg(t, c)
		if err != nil {
			return 0
		}
		switch typ {
		case msgChallenge:
			if secret == nil {
				_, err = c.Write(handshakeMsg(msgProof, make([]byte, 32)))
			} else {
				helloPayload := first[3:]
				m := hmac.New(sha256.New, secret)
				m.Write([]byte("elastictrain/sync v1 client"))
				m.Write([]byte{0})
				m.Write(helloPayload)
				m.Write(p[:32])
				_, err = c.Write(handshakeMsg(msgProof, m.Sum(nil)))
			}
			if err != nil {
				return 0
			}
		case msgReject:
			require.NotEmpty(t, p)
			return p[0]
		case msgAccept:
			t.Fatalf("the worker accepted a stranger")
		}
	}
}

// Must-show 5: strangers on a worker's peer port (garbage, no secret, a
// wrong secret, a replayed genuine handshake, another job, an old round)
// are refused with the right code and logged by the worker, and training
// goes on undisturbed: no new round, and the job ends with every invariant.
func TestStrangersAreRefusedWithoutDisturbingTraining(t *testing.T) {
	ctx := context.Background()
	cfg := testConfig(t, testredis.Addr(t))
	cfg.ProxyPeers = true // to capture a genuine handshake for the replay
	cfg.Epochs = 6
	cfg.StepDelay = 5 * time.Millisecond
	// Long leases: on a loaded machine a lapsed lease would start a new
	// round that the strangers did not cause.
	cfg.LeaseTTL, cfg.HeartbeatInterval = 5*time.Second, 300*time.Millisecond
	h, err := faultinject.Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close()
	bound, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	require.NoError(t, h.WaitStep(bound, 10))

	// Capture the handshakes of a new round: a worker joins.
	victim := h.Workers()[0]
	victim.PeerProxy.SetCapture(4096)
	_, err = h.AddWorker(ctx)
	require.NoError(t, err)
	st, err := h.WaitFor(bound, func(s faultinject.Status) bool { return s.Ranked == 4 && s.Live == 4 })
	require.NoError(t, err, "the joiner was taken in")
	round := st.MaxRound
	var replay []byte
	for _, c := range victim.PeerProxy.Captured() {
		if len(c) >= 3+12 && c[0] == msgHello && binary.LittleEndian.Uint64(c[3+4:]) == round {
			replay = c
			break
		}
	}
	require.NotNil(t, replay, "a genuine handshake of round %d into worker 0", round)
	victim.PeerProxy.SetCapture(0)
	ver := replay[3] // the Hello's first byte: the protocol version the workers speak

	addr := victim.ListenAddr // the worker's own peer port, not the proxy
	job := cfg.JobID
	require.EqualValues(t, rejectMalformed, stranger(t, addr, []byte("GET / HTTP/1.1\r\n\r\n"), nil), "garbage")
	require.EqualValues(t, rejectAuth, stranger(t, addr, handshakeMsg(msgHello, hello(ver, job, round, 1, 0)), nil), "no secret")
	require.EqualValues(t, rejectAuth, stranger(t, addr, handshakeMsg(msgHello, hello(ver, job, round, 1, 0)), []byte("not the job secret, but 32 bytes")), "wrong secret")
	require.EqualValues(t, rejectAuth, stranger(t, addr, replay, nil), "replayed handshake")
	require.EqualValues(t, rejectJob, stranger(t, addr, handshakeMsg(msgHello, hello(ver, "another-job", round, 1, 0)), cfg.Secret), "another job")
	require.EqualValues(t, rejectRound, stranger(t, addr, handshakeMsg(msgHello, hello(ver, job, round-1, 1, 0)), cfg.Secret), "an old round")

	// Training goes on in the same round.
	require.NoError(t, h.WaitStep(bound, h.Status().MaxStep+30))
	require.Equal(t, round, h.Status().MaxRound, "the strangers did not disturb the round")
	res := h.Finish(ctx, faultinject.Bounds{})
	require.Empty(t, res.Violations)
	require.Equal(t, 4, res.Finished)

	// The victim logged every refusal, naming the reason; never the secret
	// (Finish checked that for every log).
	logb, err := os.ReadFile(victim.LogPath)
	require.NoError(t, err)
	var refusals []string
	for _, line := range bytes.Split(logb, []byte("\n")) {
		if bytes.Contains(line, []byte(`"msg":"sync: refused connection"`)) {
			refusals = append(refusals, string(line))
		}
	}
	all := strings.Join(refusals, "\n")
	require.Equal(t, 3, strings.Count(all, "does not verify"), "no secret, wrong secret, replay:\n%s", all)
	require.Contains(t, all, "another-job")
	require.Contains(t, all, "has moved on to round")
	require.Contains(t, all, "unknown handshake message type", "the garbage")
}
