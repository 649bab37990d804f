package sync

import (
	"time"

	"github.com/elastictrain/elastictrain/sync/internal/wire"
)

// abortConnect tells every peer this rank holds a control connection with
// that it gave the round up on purpose (the caller cancelled Connect, e.g.
// because the rendezvous moved on): an abort notice (ReasonCanceled,
// blaming this rank) ahead of the close. A peer whose Ring already formed
// then fails with a *PeerError wrapping ErrAborted, which says the rank is
// alive, instead of a lost connection, which would have it report this
// rank for eviction. Writes are bounded by ctrlWriteTimeout in all.
func abortConnect(rc *ringConns, w World) {
	var b [wire.HeaderSize + wire.AbortSize]byte
	h := wire.Header{Kind: wire.KindAbort, Round: w.Round, Length: wire.AbortSize}
	h.Put(b[:])
	a := wire.Abort{Origin: int32(w.Rank), Blamed: int32(w.Rank), Reason: wire.ReasonCanceled}
	a.Put(b[wire.HeaderSize:])
	deadline := time.Now().Add(ctrlWriteTimeout)
	for _, c := range rc.ctrl {
		if c != nil {
			c.SetWriteDeadline(deadline)
			c.Write(b[:])
		}
	}
}
