package sync

import (
	"context"
	"fmt"
	"time"

	"github.com/elastictrain/elastictrain/sync/mesh"
)

// ConnectMesh forms round w like Connect and hands it over as a mesh.Mesh:
// the Ring's per-peer mesh connections become the caller's streams (after
// any agreement it runs with the Mesh's collectives), and the Ring keeps
// its control connections to notice dead peers and carry abort notices.
// A Transport used this way serves one protocol: use another Transport for
// the job's collectives. Errors: as Connect.
func (t *Transport) ConnectMesh(ctx context.Context, w World) (mesh.Mesh, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: nil Transport", ErrInvalid)
	}
	r, err := t.Connect(ctx, w)
	if err != nil {
		return nil, err
	}
	if w.JobID == "" {
		w.JobID = t.cfg.JobID
	}
	return &ringMesh{r: r, w: w}, nil
}

var _ mesh.Dialer = (*Transport)(nil)

// ringMesh is a Ring seen as a mesh.Mesh.
type ringMesh struct {
	r *Ring
	w World
}

func (m *ringMesh) World() World             { return m.w }
func (m *ringMesh) OpTimeout() time.Duration { return m.r.cfg.OpTimeout }
func (m *ringMesh) MaxFrameBytes() int       { return m.r.cfg.MaxFrameBytes }

func (m *ringMesh) Stream(q int) (mesh.Stream, bool) {
	if q < 0 || q >= len(m.r.peers) || m.r.peers[q] == nil {
		return mesh.Stream{}, false
	}
	p := m.r.peers[q]
	return mesh.Stream{Conn: p.mesh, Reader: p.meshR}, true
}

func (m *ringMesh) AllGather(ctx context.Context, send, recv []byte) error {
	return m.r.AllGather(ctx, send, recv)
}

func (m *ringMesh) Broadcast(ctx context.Context, buf []byte, root int) error {
	return m.r.Broadcast(ctx, buf, root)
}

func (m *ringMesh) Barrier(ctx context.Context) error { return m.r.Barrier(ctx) }

func (m *ringMesh) Fail(cause error, reason mesh.Reason, blamed int) error {
	return m.r.fail(cause, uint8(reason), blamed)
}

func (m *ringMesh) Err() error            { return m.r.causeNow() }
func (m *ringMesh) Dead() <-chan struct{} { return m.r.dead }

func (m *ringMesh) PeerClosed(q int) bool {
	if q < 0 || q >= len(m.r.peers) || m.r.peers[q] == nil {
		return false
	}
	return m.r.peers[q].closed.Load()
}

func (m *ringMesh) Close() error { return m.r.Close() }
