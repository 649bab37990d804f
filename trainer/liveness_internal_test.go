package trainer

import (
	"context"
	"testing"

	"github.com/elastictrain/elastictrain/elastic"
	"github.com/elastictrain/elastictrain/elastic/store"
	"github.com/elastictrain/elastictrain/sync"
)

// countingMarker is a sync.BusyMarker that counts the marks open on it:
// what a round's peers are told (a *sync.Ring sends KindBusy frames while
// its count is above zero).
type countingMarker struct {
	sync.Synchronizer
	open int
}

func (m *countingMarker) Busy() (done func()) {
	m.open++
	ended := false
	return func() {
		if !ended {
			ended = true
			m.open--
		}
	}
}

// A phase marked for the peers that began before the round connected (a
// Trainer.Busy from another goroutine across a round change) tells the
// new round's peers once it connects, and stops telling them when it
// ends; nested phases hold one mark; the round's end drops it, and the
// next round's connect takes it up again while the phase lasts. It used to
// tell a round connected after its start nothing, so the peers timed out
// on it after sync's OpTimeout.
func TestAPhaseOpenAcrossARoundChangeTellsTheNewRoundsPeers(t *testing.T) {
	cfg := elastic.DefaultConfig()
	cfg.JobID = "liveness-carry"
	agent, err := elastic.NewAgent(store.NewMemory(), elastic.NewMember("127.0.0.1:1"), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	var l liveness
	l.enterRound(context.Background(), agent)

	eval := l.busy("evaluation") // before the round connected
	r1 := &countingMarker{}
	l.connected(r1)
	if r1.open != 1 {
		t.Fatalf("the round connected during a phase: %d marks for its peers, want 1", r1.open)
	}
	fetch := l.busy("data fetch") // nested
	if r1.open != 1 {
		t.Fatalf("two phases: %d marks, want 1", r1.open)
	}
	fetch()
	fetch() // more than once is harmless
	if r1.open != 1 {
		t.Fatalf("one phase still open: %d marks, want 1", r1.open)
	}

	l.leaveRound(agent) // the round ends while the evaluation goes on
	if r1.open != 0 {
		t.Fatalf("the ended round keeps %d marks", r1.open)
	}
	l.enterRound(context.Background(), agent)
	r2 := &countingMarker{}
	l.connected(r2)
	if r2.open != 1 {
		t.Fatalf("the next round connected during the phase: %d marks for its peers, want 1", r2.open)
	}
	eval()
	if r2.open != 0 || r1.open != 0 {
		t.Fatalf("the phase ended: %d and %d marks left", r1.open, r2.open)
	}
	l.connected(r2)
	if r2.open != 0 {
		t.Fatalf("no phase open: %d marks", r2.open)
	}
}
